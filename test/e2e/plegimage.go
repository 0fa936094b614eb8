package e2e

// The pleg image of deploy/Dockerfile, built without docker or a registry:
// the Dockerfile is read and its recipe followed (the go build command of
// its build stage, the path its final stage copies the binary to, its
// ENTRYPOINT, CMD and USER) on a busybox base from Debian's busybox-static,
// and written as an OCI image-layout archive with the suite's ocilayout
// package, ready for `ctr images import`.

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/test/e2e/images/ocilayout"
)

// busyboxPath is where Debian's busybox-static (provision.sh installs it)
// puts its static binary.
const busyboxPath = "/bin/busybox"

// dockerRecipe is what deploy/Dockerfile says the image is.
type dockerRecipe struct {
	goEnv      []string // VAR=value words before `go build`, e.g. CGO_ENABLED=0
	goFlags    []string // go build's flags, without -o
	pkg        string   // the package built, e.g. ./cmd/pleg
	buildOut   string   // go build -o, in the build stage
	base       string   // the final stage's FROM, e.g. busybox:1.37
	binPath    string   // where the final stage copies the binary
	entrypoint []string
	cmd        []string
	user       string // USER; empty: root
}

// parseDockerfile reads the subset of the Dockerfile syntax that
// deploy/Dockerfile uses and fails on anything else, so that a change to
// the Dockerfile that this builder cannot follow stops the suite instead of
// building a different image.
func parseDockerfile(path string) (dockerRecipe, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return dockerRecipe{}, err
	}
	var (
		r      dockerRecipe
		stages []string // stage names ("" when unnamed), in order
	)
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		final := len(stages) > 0 && stages[len(stages)-1] == ""
		switch strings.ToUpper(instr) {
		case "FROM":
			w := strings.Fields(rest)
			switch {
			case len(w) == 1:
				stages = append(stages, "")
				r.base = w[0]
			case len(w) == 3 && strings.EqualFold(w[1], "AS"):
				stages = append(stages, w[2])
			default:
				return r, fmt.Errorf("%s: cannot follow FROM %s", path, rest)
			}
		case "WORKDIR":
			if final {
				return r, fmt.Errorf("%s: cannot follow WORKDIR in the final stage", path)
			}
		case "RUN":
			if final || len(stages) == 0 {
				return r, fmt.Errorf("%s: cannot follow RUN in the final stage: the image is the base plus the binary", path)
			}
			words, err := shellWords(rest)
			if err != nil {
				return r, fmt.Errorf("%s: RUN %s: %w", path, rest, err)
			}
			env := words
			for len(words) > 0 && strings.Contains(words[0], "=") {
				words = words[1:]
			}
			env = env[:len(env)-len(words)]
			switch {
			case len(words) == 3 && words[0] == "go" && words[1] == "mod" && words[2] == "download":
				// Fills the module cache: no part of the image.
			case len(words) > 2 && words[0] == "go" && words[1] == "build":
				r.goEnv = env
				args := words[2:]
				for j := 0; j < len(args); j++ {
					switch {
					case args[j] == "-o" && j+1 < len(args):
						r.buildOut = args[j+1]
						j++
					case strings.HasPrefix(args[j], "-"):
						r.goFlags = append(r.goFlags, args[j])
					case r.pkg == "":
						r.pkg = args[j]
					default:
						return r, fmt.Errorf("%s: RUN %s: more than one package", path, rest)
					}
				}
			default:
				return r, fmt.Errorf("%s: cannot follow RUN %s", path, rest)
			}
		case "COPY":
			w := strings.Fields(rest)
			if !final {
				continue // the build stage's sources: the repository
			}
			if len(w) != 3 || !strings.HasPrefix(w[0], "--from=") {
				return r, fmt.Errorf("%s: cannot follow COPY %s in the final stage", path, rest)
			}
			if w[1] != r.buildOut {
				return r, fmt.Errorf("%s: the final stage copies %s, the build writes %s", path, w[1], r.buildOut)
			}
			r.binPath = w[2]
		case "ENTRYPOINT", "CMD":
			var words []string
			if err := json.Unmarshal([]byte(rest), &words); err != nil {
				return r, fmt.Errorf("%s: %s must be a JSON array (exec form): %w", path, instr, err)
			}
			if strings.ToUpper(instr) == "CMD" {
				r.cmd = words
			} else {
				r.entrypoint = words
			}
		case "USER":
			r.user = rest
		default:
			return r, fmt.Errorf("%s: the e2e image builder (test/e2e/plegimage.go) cannot follow %s", path, l)
		}
	}
	switch {
	case r.pkg == "" || r.buildOut == "":
		return r, fmt.Errorf("%s: no `go build -o OUT PACKAGE` in a build stage", path)
	case r.binPath == "":
		return r, fmt.Errorf("%s: the final stage copies no binary", path)
	case len(stages) == 0 || stages[len(stages)-1] != "":
		return r, fmt.Errorf("%s: the final stage must be unnamed", path)
	}
	return r, nil
}

// shellWords splits a RUN line as sh would for the plain words, single and
// double quotes the Dockerfile uses; anything needing a shell is refused.
func shellWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	for _, c := range s {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case strings.ContainsRune(`\$;&|<>()`+"`", c):
			return nil, fmt.Errorf("%q needs a shell", c)
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unterminated quote")
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// plegImage is the image built from deploy/Dockerfile's recipe.
type plegImage struct {
	recipe dockerRecipe
	// ref is the image's reference: the DaemonSet's image
	// (deploy/kubernetes/pleg.yaml), fully qualified as containerd names
	// it, so that the manifest's image and pull policy run unchanged
	// without a registry.
	ref     string
	archive string          // OCI layout archive with the image, named ref
	binary  string          // the binary that is in the image, on the host
	busybox string          // the base's busybox version line
	paths   map[string]bool // every file and link in the image
}

// has reports whether the image has a file or link at path.
func (img *plegImage) has(path string) bool { return img.paths[path] }

// plegBuild is the pleg binary of this run, built once.
var plegBuild struct {
	once   sync.Once
	recipe dockerRecipe
	path   string
	err    error
}

// PlegBinary builds ./cmd/pleg once per suite run as deploy/Dockerfile's
// build stage does (the binary of the image, and a user's binary) into
// <dir>/bin/pleg, where dir is the run's default containerd's dir, which
// lives as long as the run (so the teardown counts a leftover pleg
// process as ours), and returns its path.
func PlegBinary(t testing.TB) string {
	t.Helper()
	if err := buildPleg(); err != nil {
		t.Fatal(err)
	}
	return plegBuild.path
}

func buildPleg() error {
	plegBuild.once.Do(func() {
		start := time.Now()
		e := runtimes[len(runtimes)-1]
		plegBuild.recipe, plegBuild.err = parseDockerfile(filepath.Join(e.repoRoot, "deploy", "Dockerfile"))
		if plegBuild.err != nil {
			return
		}
		dir := filepath.Join(e.dir, "bin")
		if plegBuild.err = os.MkdirAll(dir, 0o755); plegBuild.err != nil {
			return
		}
		p := filepath.Join(dir, "pleg")
		if plegBuild.err = goBuild(e.repoRoot, plegBuild.recipe, p); plegBuild.err == nil {
			plegBuild.path = p
			logf("built %s as deploy/Dockerfile does in %v", p, time.Since(start).Round(time.Millisecond))
		}
	})
	return plegBuild.err
}

// goBuild runs the Dockerfile's build stage's go build in the repository,
// writing the binary to out. The Dockerfile's Go image stamps the binary
// with the commit (-buildvcs=auto, its default); this machine's go env may
// say otherwise, and a flag beats GOFLAGS.
func goBuild(repoRoot string, r dockerRecipe, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goBin := filepath.Join(goRoot(), "bin", "go")
	if !fileExists(goBin) {
		goBin = "go"
	}
	args := append([]string{"build", "-buildvcs=auto"}, r.goFlags...)
	args = append(args, "-o", out, r.pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), r.goEnv...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s go %s (deploy/Dockerfile's build): %v\n%s", strings.Join(r.goEnv, " "), strings.Join(args, " "), err, b)
	}
	return nil
}

var plegImg struct {
	once sync.Once
	img  *plegImage
	err  error
}

// PlegImage builds the pleg image once per suite run, into <dir>/pleg-image
// beside PlegBinary's binary (private to this run, so suites that run at
// once never share a file).
func PlegImage(t testing.TB) *plegImage {
	t.Helper()
	plegImg.once.Do(func() {
		if plegImg.err = buildPleg(); plegImg.err != nil {
			return
		}
		start := time.Now()
		e := runtimes[len(runtimes)-1]
		ds, err := loadDaemonSet(e.repoRoot)
		if err != nil {
			plegImg.err = err
			return
		}
		ref, err := normalizeImageRef(ds.container().Image)
		if err != nil {
			plegImg.err = fmt.Errorf("%s: %w", manifestPath, err)
			return
		}
		dir := filepath.Join(e.dir, "pleg-image")
		plegImg.img, plegImg.err = buildPlegImage(plegBuild.recipe, plegBuild.path, dir, ref)
		if plegImg.err == nil {
			logf("built the pleg image %s in %v", plegImg.img.archive, time.Since(start).Round(time.Millisecond))
		}
	})
	if plegImg.err != nil {
		t.Fatal(plegImg.err)
	}
	return plegImg.img
}

// normalizeImageRef names an image reference as containerd's CRI plugin
// does: a reference without a registry host is docker.io's, one without
// a path under it is in library/, and an untagged one is :latest.
func normalizeImageRef(ref string) (string, error) {
	if ref == "" || strings.ContainsAny(ref, " @") || strings.HasPrefix(ref, "/") {
		return "", fmt.Errorf("image %q: want NAME[:TAG] (no digest)", ref)
	}
	first, rest, hasPath := strings.Cut(ref, "/")
	if !hasPath || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		if !hasPath {
			ref = "library/" + ref
		}
		ref = "docker.io/" + ref
		_, rest, _ = strings.Cut(ref, "/")
	}
	if !strings.Contains(rest[strings.LastIndex(rest, "/")+1:], ":") {
		ref += ":latest"
	}
	return ref, nil
}

// buildPlegImage writes the image of recipe, with binary at its path, on
// a busybox base, named ref.
func buildPlegImage(r dockerRecipe, binary, dir, ref string) (*plegImage, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	img := &plegImage{recipe: r, ref: ref, archive: filepath.Join(dir, "pleg-image.tar"), binary: binary}
	bin, err := os.ReadFile(img.binary)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The base: busybox, as a static binary with one link per applet in
	// /bin, and root and nobody in /etc, like the busybox image.
	base, _, _ := strings.Cut(r.base, ":")
	if base != "busybox" {
		return nil, fmt.Errorf("deploy/Dockerfile's base is %s: the e2e image builder makes only busybox bases", r.base)
	}
	if err := mustBeStatic(busyboxPath); err != nil {
		return nil, fmt.Errorf("%w (provision.sh installs Debian's busybox-static)", err)
	}
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	applets := strings.Fields(string(out))
	// busybox with no arguments prints its version first and exits 1.
	out, _ = exec.CommandContext(ctx, busyboxPath).Output()
	img.busybox, _, _ = strings.Cut(string(out), "\n")
	files := []ocilayout.File{
		{Path: "/bin/busybox", Mode: 0o755, Data: bb},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n")},
		{Path: r.binPath, Mode: 0o755, Data: bin},
	}
	for _, a := range applets {
		if a != "busybox" {
			files = append(files, ocilayout.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	img.paths = map[string]bool{}
	for _, f := range files {
		img.paths[f.Path] = true
	}
	f, err := os.Create(img.archive)
	if err != nil {
		return nil, err
	}
	err = ocilayout.Write(f, ocilayout.Options{
		Architecture: goruntime.GOARCH,
		Files:        files,
		Images: []ocilayout.Image{{
			Name: ref, Entrypoint: r.entrypoint, Cmd: r.cmd, User: r.user,
		}},
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", img.archive, err)
	}
	return img, nil
}

// mustBeStatic fails unless path is an ELF executable without a dynamic
// loader, which runs in an image that has no libc.
func mustBeStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

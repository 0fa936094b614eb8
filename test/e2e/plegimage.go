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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/internal/dockerfile"
	"github.com/podlifecycle/pleg/test/e2e/images/ocilayout"
)

// busyboxPath is where Debian's busybox-static (provision.sh installs it)
// puts its static binary.
const busyboxPath = "/bin/busybox"

// plegImage is the image built from deploy/Dockerfile's recipe.
type plegImage struct {
	recipe dockerfile.Recipe
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
	recipe dockerfile.Recipe
	path   string
	err    error
}

// PlegBinary builds ./cmd/pleg once per suite run as deploy/Dockerfile's
// build stage does (the binary of the image, and a user's binary) into
// <dir>/bin/pleg, where dir is the run's default containerd's dir, which
// lives as long as the run (so the teardown counts a leftover pleg
// process as ours), and returns its path. In a package of private
// runtimes only (Main) dir is the run's own dir (runHome).
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
		e := runHome()
		plegBuild.recipe, plegBuild.err = dockerfile.Parse(filepath.Join(e.repoRoot, "deploy", "Dockerfile"))
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
// writing the binary to out, with the Go toolchain the suite runs under.
func goBuild(repoRoot string, r dockerfile.Recipe, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goBin := filepath.Join(goRoot(), "bin", "go")
	if !fileExists(goBin) {
		goBin = "go"
	}
	if b, err := r.Command(ctx, goBin, repoRoot, out).CombinedOutput(); err != nil {
		return fmt.Errorf("%s (deploy/Dockerfile's build): %v\n%s", r, err, b)
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
		e := runHome()
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
func buildPlegImage(r dockerfile.Recipe, binary, dir, ref string) (*plegImage, error) {
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

	base, _, _ := strings.Cut(r.Base, ":")
	if base != "busybox" {
		return nil, fmt.Errorf("deploy/Dockerfile's base is %s: the e2e image builder makes only busybox bases", r.Base)
	}
	files, version, err := busyboxBase(ctx)
	if err != nil {
		return nil, err
	}
	img.busybox = version
	files = append(files, ocilayout.File{Path: r.BinPath, Mode: 0o755, Data: bin})
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
			Name: ref, Entrypoint: r.Entrypoint, Cmd: r.Cmd, User: r.User,
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

// busyboxBase is the files of a busybox image: the static binary with
// one link per applet in /bin, and root and nobody in /etc; and the
// version busybox prints.
func busyboxBase(ctx context.Context) ([]ocilayout.File, string, error) {
	if err := mustBeStatic(busyboxPath); err != nil {
		return nil, "", fmt.Errorf("%w (provision.sh installs Debian's busybox-static)", err)
	}
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, "", err
	}
	out, err := exec.CommandContext(ctx, busyboxPath, "--list").Output()
	if err != nil {
		return nil, "", fmt.Errorf("busybox --list: %w", err)
	}
	applets := strings.Fields(string(out))
	// busybox with no arguments prints its version first and exits 1.
	out, _ = exec.CommandContext(ctx, busyboxPath).Output()
	version, _, _ := strings.Cut(string(out), "\n")
	files := []ocilayout.File{
		{Path: "/bin/busybox", Mode: 0o755, Data: bb},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n")},
	}
	for _, a := range applets {
		if a != "busybox" {
			files = append(files, ocilayout.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	return files, version, nil
}

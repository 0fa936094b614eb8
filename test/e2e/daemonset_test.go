package e2e

// The DaemonSet of deploy/kubernetes/pleg.yaml, run for real: its pod
// template becomes a static pod (manifests.go) of the real kubelet
// (kubelet.go), on the image deploy/Dockerfile describes (plegimage.go).
// TestPlegImageDrift fails when the manifest, the Dockerfile and that image
// drift apart; TestDaemonSetOnKubelet runs the pod.

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// expandEnvRefs replaces $(NAME) as the kubelet does in a container's
// command and args, from vars.
func expandEnvRefs(args []string, vars map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

// TestPlegImageDrift fails when deploy/kubernetes/pleg.yaml,
// deploy/Dockerfile and the image built from the Dockerfile's recipe stop
// fitting each other. It runs the image's binary on the host (it is
// static) and reads the image back from containerd.
func TestPlegImageDrift(t *testing.T) {
	if suite.kind != kindContainerd {
		// It reads the imported image's config through containerd.
		t.Skipf("reads the imported image through containerd; this run's first runtime is %s (%s=%q)", suite.name(), envRuntimes, os.Getenv(envRuntimes))
	}
	img := PlegImage(t)
	r := img.recipe
	ds, err := loadDaemonSet(suite.repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	c := ds.container()

	t.Logf("the image's base: %s (deploy/Dockerfile: %s)", img.busybox, r.Base)

	// The image containerd imported says what the Dockerfile says.
	if err := suite.importArchive(img.archive, img.ref); err != nil {
		t.Fatal(err)
	}
	cfg := importedImageConfig(t, img.ref)
	if !slices.Equal(cfg.Entrypoint, r.Entrypoint) || !slices.Equal(cfg.Cmd, r.Cmd) || cfg.User != r.User {
		t.Errorf("the imported image runs %q %q as user %q; deploy/Dockerfile says ENTRYPOINT %q CMD %q USER %q",
			cfg.Entrypoint, cfg.Cmd, cfg.User, r.Entrypoint, r.Cmd, r.User)
	}

	// The manifest runs the binary the image has, as the image's user.
	cmd := c.Command
	if len(cmd) == 0 {
		cmd = r.Entrypoint
	}
	if len(cmd) != 1 || cmd[0] != r.BinPath {
		t.Errorf("%s runs %q; the Dockerfile puts the binary at %s", manifestPath, cmd, r.BinPath)
	}
	if !slices.Equal(r.Entrypoint, []string{r.BinPath}) {
		t.Errorf("the Dockerfile's ENTRYPOINT %q is not the binary it copies, %s", r.Entrypoint, r.BinPath)
	}
	// The image's user is a numeric non-root uid; the manifest names the
	// user it runs as (root: the runtime's socket is root:root), and the
	// non-root patch runs the image's.
	uid, err := imageUID(r.User)
	if err != nil {
		t.Error(err)
	} else if uid == 0 {
		t.Errorf("deploy/Dockerfile: USER %q is root, want a numeric non-root uid", r.User)
	}
	if su := c.SecurityContext.RunAsUser; su == nil {
		t.Errorf("%s: no runAsUser: the pod would run as the image's uid %d (USER %q), which may not use a root:root runtime socket", manifestPath, uid, r.User)
	}
	if np, err := loadNonRootPatch(suite.repoRoot); err != nil {
		t.Error(err)
	} else if su := np.container.SecurityContext.RunAsUser; su == nil || *su != uid {
		t.Errorf("%s: runAsUser %v; the image's user is uid %d (USER %q)", nonRootPatchPath, ptrString(su), uid, r.User)
	}

	// The binary: built as the Dockerfile says, static (the base has no
	// libc), and it accepts the manifest's command line.
	checkBuildInfo(t, img)
	if err := mustBeStatic(img.binary); err != nil {
		t.Errorf("the image's binary: %v: it cannot run on %s", err, r.Base)
	}
	args := expandEnvRefs(c.Args, map[string]string{"NODE_NAME": "node-a"})
	// cobra parses every flag (names and values) before it looks at
	// --help: exit 0 means the binary accepts the whole command line.
	out, err := runBinary(img.binary, append(args, "--help")...)
	if err != nil {
		t.Errorf("the image's binary refuses %s's command line %q: %v\n%s", manifestPath, args, err, out)
	}

	// The binary reports the version of this checkout, and the build
	// tags the Dockerfile builds it with.
	var tags string
	for _, f := range r.GoFlags {
		if k, v, _ := strings.Cut(f, "="); k == "-tags" {
			tags = v
		}
	}
	checkVersion(t, img.binary, tags)

	// node-problem-detector's init container copies the binary out of the
	// same image with the base's tools.
	checkNPDInitContainer(t, img, c.Image)
}

// importedImageConfig reads an image's config as containerd's CRI plugin
// reports it (ImageStatus, verbose).
func importedImageConfig(t testing.TB, ref string) (cfg struct {
	User       string   `json:"User"`
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := suite.cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Verbose: true})
	if err != nil || resp.Image == nil {
		t.Fatalf("CRI ImageStatus %s: %v (image %v)", ref, err, resp.GetImage())
	}
	var info struct {
		ImageSpec struct {
			Config json.RawMessage `json:"config"`
		} `json:"imageSpec"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("CRI ImageStatus %s: verbose info: %v\n%s", ref, err, resp.Info["info"])
	}
	if err := json.Unmarshal(info.ImageSpec.Config, &cfg); err != nil {
		t.Fatalf("CRI ImageStatus %s: image config: %v\n%s", ref, err, info.ImageSpec.Config)
	}
	return cfg
}

// imageUID resolves a Dockerfile USER (uid[:gid], or a name in the
// base's /etc/passwd: root and nobody, as busybox's) to a uid.
func imageUID(user string) (int64, error) {
	name, _, _ := strings.Cut(user, ":")
	switch name {
	case "", "root":
		return 0, nil
	case "nobody":
		return 65534, nil
	}
	if n, err := strconv.ParseInt(name, 10, 64); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("deploy/Dockerfile: USER %q is not in the base's /etc/passwd", user)
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// runBinary runs a program with a bound and returns its combined output.
func runBinary(path string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, path, args...).CombinedOutput()
}

// checkBuildInfo compares what the Go toolchain stamped into the image's
// binary with the Dockerfile's go build line.
func checkBuildInfo(t *testing.T, img *plegImage) {
	t.Helper()
	r := img.recipe
	bi, err := buildinfo.ReadFile(img.binary)
	if err != nil {
		t.Errorf("the image's binary has no Go build information: %v", err)
		return
	}
	if want := "github.com/podlifecycle/pleg/cmd/pleg"; bi.Path != want {
		t.Errorf("the image's binary is %s (the Dockerfile builds %s), want %s", bi.Path, r.Pkg, want)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	want := map[string]string{"CGO_ENABLED": "1", "-trimpath": ""}
	var ldflags []string
	for _, e := range r.GoEnv {
		if k, v, _ := strings.Cut(e, "="); k == "CGO_ENABLED" {
			want[k] = v
		}
	}
	for _, f := range r.GoFlags {
		switch k, v, _ := strings.Cut(f, "="); k {
		case "-trimpath":
			want[k] = "true"
		case "-ldflags":
			ldflags = strings.Fields(v)
		case "-tags":
			want[k] = v
		}
	}
	for k, v := range want {
		if settings[k] != v {
			t.Errorf("the image's binary was built with %s=%q, the Dockerfile's build says %q", k, settings[k], v)
		}
	}
	// Go leaves -ldflags out of the build information under -trimpath:
	// look at their effect, the symbol table (-s) and DWARF (-w).
	f, err := elf.Open(img.binary)
	if err != nil {
		t.Errorf("the image's binary: %v", err)
		return
	}
	defer f.Close()
	strip := slices.Contains(ldflags, "-s")
	noDWARF := strip || slices.Contains(ldflags, "-w")
	if has := f.Section(".symtab") != nil; has == strip {
		t.Errorf("the image's binary has a symbol table: %v; the Dockerfile's -ldflags %q", has, ldflags)
	}
	if has := f.Section(".debug_info") != nil || f.Section(".zdebug_info") != nil; has == noDWARF {
		t.Errorf("the image's binary has DWARF: %v; the Dockerfile's -ldflags %q", has, ldflags)
	}
}

// checkVersion checks that `pleg version` of the image's binary names the
// commit this checkout is at. The Go toolchain stamps it only in a git
// clone (CI's, the fresh-machine script's); a git worktree gets no stamp,
// and then the line must say "(devel)".
func checkVersion(t *testing.T, binary, tags string) {
	t.Helper()
	out, err := runBinary(binary, "version")
	if err != nil {
		t.Errorf("pleg version: %v\n%s", err, out)
		return
	}
	line := strings.TrimSpace(string(out))
	platform := goruntime.Version() + " " + goruntime.GOOS + "/" + goruntime.GOARCH
	if tags != "" {
		platform += ", tags " + tags
	}
	if !strings.HasPrefix(line, "pleg ") || !strings.HasSuffix(line, platform+")") {
		t.Errorf("pleg version: %q, want \"pleg VERSION (..., %s)\"", line, platform)
	}
	if st, err := os.Stat(filepath.Join(suite.repoRoot, ".git")); err != nil || !st.IsDir() {
		if !strings.HasPrefix(line, "pleg (devel) (") {
			t.Errorf("pleg version: %q; this checkout is no git clone, so Go stamps no version", line)
		}
		t.Logf("pleg version: %q (this checkout is no git clone: the commit is not checked here)", line)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	head, err := exec.CommandContext(ctx, "git", "-C", suite.repoRoot, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	// Whether the tree had local changes is left out: a file another
	// suite writes meanwhile would change it.
	want := "(commit " + strings.TrimSpace(string(head))
	if !strings.Contains(line, want+", ") && !strings.Contains(line, want+" with local changes, ") {
		t.Errorf("pleg version: %q, want it to name the checkout's %q", line, want[1:])
	}
	t.Logf("pleg version: %s", line)
}

// checkNPDInitContainer checks node-problem-detector's patch against the
// image: its init container uses the DaemonSet's image, its command is a
// program of the image, and the paths it copies from are the image's.
func checkNPDInitContainer(t *testing.T, img *plegImage, image string) {
	t.Helper()
	type patch struct {
		Spec struct {
			Template struct {
				Spec k8sPodSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	_, docs, err := manifestDocs[patch](filepath.Join(suite.repoRoot, npdPatchPath))
	if err != nil || len(docs) != 1 {
		t.Fatalf("%s: %v (%d documents)", npdPatchPath, err, len(docs))
	}
	inits := docs[0].Spec.Template.Spec.InitContainers
	if len(inits) != 1 {
		t.Fatalf("%s: %d init containers, want the one that copies pleg", npdPatchPath, len(inits))
	}
	ic := inits[0]
	if ic.Image != image {
		t.Errorf("%s: the init container's image %q is not the DaemonSet's %q", npdPatchPath, ic.Image, image)
	}
	words := append(append([]string{}, ic.Command...), ic.Args...)
	if len(words) == 0 {
		t.Fatalf("%s: the init container has no command", npdPatchPath)
	}
	prog := words[0]
	if !strings.HasPrefix(prog, "/") {
		prog = "/bin/" + prog // the image's PATH: busybox's applets are in /bin
	}
	if !img.has(prog) {
		t.Errorf("%s: the init container runs %q, which the image lacks", npdPatchPath, words[0])
	}
	for _, w := range words[1:] {
		if !strings.HasPrefix(w, "/") || underMount(w, ic) {
			continue
		}
		if !img.has(w) {
			t.Errorf("%s: the init container reads %s, which the image lacks", npdPatchPath, w)
		}
	}
}

func underMount(path string, c k8sContainer) bool {
	for _, m := range c.VolumeMounts {
		if path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

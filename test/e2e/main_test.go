package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Environment variables understood by the suite.
const (
	// envSkip=1 skips the whole suite (the only way to skip it).
	envSkip = "PLEG_E2E_SKIP"
	// envCache overrides the cache dir (default <repo>/.cache/e2e).
	envCache = "PLEG_E2E_CACHE"
	// envSnapshotter forces a snapshotter (overlayfs or native) instead of
	// probing whether overlayfs works.
	envSnapshotter = "PLEG_E2E_SNAPSHOTTER"
	// envRuntimes narrows the containerd versions the suite runs against
	// (comma- or space-separated prefixes of allRuntimes, e.g. "2.2" or
	// "1.7,2.2"); unset means all of them, as in CI.
	envRuntimes = "PLEG_E2E_RUNTIMES"
)

// allRuntimes are the containerd versions the suite runs against, oldest
// first; provision.sh provisions each into <cache>/containerd-<version>/bin.
var allRuntimes = []string{"1.6.20", "1.7.35", "2.2.9", "2.4.2"}

// Images built by provision.sh and imported into containerd's k8s.io
// namespace.
const (
	pauseImage    = "docker.io/pleg/pause:e2e"
	workloadImage = "docker.io/pleg/workload:e2e"
	criNamespace  = "k8s.io"
	// podNamespace is the Kubernetes namespace RunPod puts pods in.
	podNamespace = "e2e"
)

// suite is the containerd the running test talks to: the newest of
// runtimes unless the test runs a subtest per runtime (forEachRuntime) or
// needs one version (useRuntime).
var suite *env

// runtimes are every private containerd of this run, oldest first, all
// started by TestMain.
var runtimes []*env

// baseEnv holds what every env of this run shares (repository, cache,
// image archive, runc), for tests that start an env of their own
// (startKubelet).
var baseEnv *env

// env describes one private containerd the tests talk to.
type env struct {
	version      string // e.g. "2.2.9"
	repoRoot     string
	cacheDir     string
	binDir       string // containerd, containerd-shim-runc-v2, ctr of this version
	imageArchive string // OCI layout tar with both images
	runcPath     string
	kubeletBin   string // the kubelet built by test/kubelet/build.sh

	dir          string // private temp root; everything below is ours
	sock         string // containerd gRPC (and CRI) socket
	configPath   string
	logPath      string // containerd's stdout+stderr (appended across restarts)
	snapshotter  string // overlayfs or native
	cgroupParent string // cgroup parent of all pods, e.g. /pleg-e2e-123
	runDirMade   bool   // /run/containerd did not exist before we started
	// socketGID is the group containerd gives its socket ([grpc] gid),
	// 0 (root's) unless a test sets it and restarts containerd
	// (TestDaemonSetOnKubelet: the socket's group for a non-root pleg).
	socketGID int

	sup *supervisorClient
	cri *criClient

	kubelet *kubelet // the kubelet running on this containerd, if any (startKubelet)

	teardownOnce sync.Once
	teardownErr  error
}

func TestMain(m *testing.M) {
	if os.Getenv(envSupervisor) != "" {
		// This process is the suite's supervisor (see supervisor_test.go),
		// not a test run.
		os.Exit(supervisorMain())
	}
	if os.Getenv(envSkip) == "1" {
		// go test hides a passing package's output: the line starts
		// with "SKIP" so that .ci/run's report shows it (and .ci/run
		// refuses to run with this variable set at all).
		fmt.Printf("SKIP: the whole real-containerd suite (test/e2e) is skipped because %s=1\n", envSkip)
		os.Exit(0)
	}
	os.Exit(runSuite(m))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...)
}

// runSuite provisions, starts every containerd, runs the tests and tears
// down.
func runSuite(m *testing.M) (code int) {
	start := time.Now()
	envs, err := setup()
	if len(envs) > 0 {
		runtimes = envs
		suite = envs[len(envs)-1]
		teardownAll := func() error {
			var errs []error
			for _, e := range envs {
				if err := e.teardown(); err != nil {
					errs = append(errs, fmt.Errorf("containerd %s: %w", e.version, err))
				}
			}
			return errors.Join(errs...)
		}
		// Tear down on SIGINT/SIGTERM too: the default action would leave
		// containerd, shims and mounts behind (the supervisors would still
		// clean up, but less gracefully).
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			s := <-sigs
			logf("got %v: tearing down", s)
			if err := teardownAll(); err != nil {
				logf("teardown: %v", err)
			}
			os.Exit(130)
		}()
		defer func() {
			if r := recover(); r != nil {
				logf("panic: %v", r)
				code = 1
			}
			if code != 0 {
				for _, e := range envs {
					e.dumpLogTail(40)
				}
			}
			if err := teardownAll(); err != nil {
				logf("FAIL: teardown: %v", err)
				code = 1
			}
		}()
	}
	if err != nil {
		logf("FAIL: setting up the e2e environment: %v", err)
		logf("(the suite fails rather than skips; set %s=1 to skip it)", envSkip)
		return 1
	}
	for _, e := range envs {
		logf("containerd %s ready (dir %s, snapshotter %s)", e.version, e.dir, e.snapshotter)
	}
	logf("all containerds ready in %v", time.Since(start).Round(time.Millisecond))
	code = m.Run()
	// Never silently fewer: say which runtimes ran (stdout, so that it is
	// in the test log even when the package passes).
	var names []string
	for _, e := range envs {
		names = append(names, e.version)
	}
	if v := os.Getenv(envRuntimes); v != "" {
		fmt.Printf("e2e: ran against containerd %s only (%s=%q; all: %s)\n", strings.Join(names, ", "), envRuntimes, v, strings.Join(allRuntimes, ", "))
	} else {
		fmt.Printf("e2e: ran against containerd %s (all)\n", strings.Join(names, ", "))
	}
	return code
}

// selectRuntimes returns the versions of allRuntimes that envRuntimes
// names (all when unset); each item is a version or a prefix of one
// ("2.2", "1.7.35", "v1.6").
func selectRuntimes() ([]string, error) {
	v := os.Getenv(envRuntimes)
	if strings.TrimSpace(v) == "" {
		return allRuntimes, nil
	}
	want := map[string]bool{}
	for _, item := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		item = strings.TrimPrefix(item, "v")
		n := 0
		for _, r := range allRuntimes {
			if r == item || strings.HasPrefix(r, item+".") {
				want[r] = true
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s=%q: %q names none of %s", envRuntimes, v, item, strings.Join(allRuntimes, ", "))
		}
	}
	var out []string
	for _, r := range allRuntimes {
		if want[r] {
			out = append(out, r)
		}
	}
	return out, nil
}

// setup provisions and starts every containerd, in parallel. Every env it
// returns must be torn down, even if err is non-nil.
func setup() ([]*env, error) {
	if uid := os.Geteuid(); uid != 0 {
		return nil, fmt.Errorf("must run as root (containerd and runc need it), running as uid %d", uid)
	}
	versions, err := selectRuntimes()
	if err != nil {
		return nil, err
	}
	base := env{}
	if base.repoRoot, err = findRepoRoot(); err != nil {
		return nil, err
	}
	base.cacheDir = os.Getenv(envCache)
	if base.cacheDir == "" {
		base.cacheDir = filepath.Join(base.repoRoot, ".cache", "e2e")
	}
	base.imageArchive = filepath.Join(base.cacheDir, "images", "e2e-images.tar")
	if err := base.provision(versions); err != nil {
		return nil, err
	}
	if err := base.provisionKubelet(); err != nil {
		return nil, err
	}
	if base.runcPath, err = lookRunc(); err != nil {
		return nil, err
	}
	sweepStale()
	baseEnv = &base

	envs := make([]*env, len(versions))
	errs := make([]error, len(versions))
	var wg sync.WaitGroup
	for i, v := range versions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			envs[i], errs[i] = startEnv(&base, v)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("containerd %s: %w", v, errs[i])
			} else {
				logf("containerd %s started in %v", v, time.Since(start).Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	var started []*env
	for _, e := range envs {
		if e != nil {
			started = append(started, e)
		}
	}
	return started, errors.Join(errs...)
}

// startEnv starts containerd version on a private dir. When it returns a
// non-nil env, that env must be torn down, even if err is non-nil.
func startEnv(base *env, version string) (*env, error) {
	return startEnvWith(base, version, nil)
}

// startEnvWith is startEnv, calling before (when set) once the env's dir
// exists and its supervisor runs, before containerd starts: e.g. to mount
// a tmpfs for its root (the supervisor unmounts it at teardown).
func startEnvWith(base *env, version string, before func(*env) error) (*env, error) {
	e := &env{
		version:      version,
		repoRoot:     base.repoRoot,
		cacheDir:     base.cacheDir,
		binDir:       filepath.Join(base.cacheDir, "containerd-"+version, "bin"),
		imageArchive: base.imageArchive,
		runcPath:     base.runcPath,
	}
	for _, f := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if !fileExists(filepath.Join(e.binDir, f)) {
			return nil, fmt.Errorf("provisioning did not produce %s", filepath.Join(e.binDir, f))
		}
	}
	var err error
	if e.dir, err = os.MkdirTemp("", "pleg-e2e-"); err != nil {
		return nil, err
	}
	e.sock = filepath.Join(e.dir, "containerd.sock")
	e.configPath = filepath.Join(e.dir, "config.toml")
	e.logPath = filepath.Join(e.dir, "containerd.log")
	e.cgroupParent = "/" + filepath.Base(e.dir)
	if _, err := os.Stat("/run/containerd"); errors.Is(err, os.ErrNotExist) {
		e.runDirMade = true
	}
	// From here on the supervisor owns cleanup of e.dir, even if this
	// process dies.
	if e.sup, err = startSupervisor(e); err != nil {
		os.RemoveAll(e.dir)
		return nil, err
	}
	if before != nil {
		if err := before(e); err != nil {
			return e, err
		}
	}
	if err := e.start(); err != nil {
		return e, err
	}
	return e, nil
}

func (e *env) start() error {
	if e.snapshotter = os.Getenv(envSnapshotter); e.snapshotter == "" {
		e.snapshotter = probeSnapshotter(e.dir)
	}
	if err := e.writeConfig(); err != nil {
		return err
	}
	if err := e.startContainerd(); err != nil {
		return err
	}
	var err error
	if e.cri, err = dialCRI(e.sock); err != nil {
		return err
	}
	if err := e.waitCRI(30 * time.Second); err != nil {
		return err
	}
	return e.importImages()
}

// findRepoRoot returns the module root: tests run in test/e2e.
func findRepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/podlifecycle/pleg\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("cannot find the repository root above %s", wd)
		}
	}
}

func lookRunc() (string, error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/runc"); err == nil {
		return "/usr/sbin/runc", nil
	}
	return "", errors.New("runc not found after provisioning")
}

// provision runs provision.sh, which is idempotent and takes well under a
// second when everything is already in place. Its output is shown only
// when it did real work or failed.
func (e *env) provision(versions []string) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(e.repoRoot, "test", "e2e", "provision.sh"))
	cmd.Env = append(os.Environ(), envCache+"="+e.cacheDir, envRuntimes+"="+strings.Join(versions, " "))
	if os.Getenv("GO") == "" {
		if goBin := filepath.Join(goRoot(), "bin", "go"); fileExists(goBin) {
			cmd.Env = append(cmd.Env, "GO="+goBin)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		return fmt.Errorf("provision.sh failed (%v); see its output above", err)
	}
	if d := time.Since(start); d > 5*time.Second || testingVerbose() {
		os.Stderr.Write(out)
		logf("provisioning took %v", d.Round(time.Millisecond))
	}
	if !fileExists(e.imageArchive) {
		return fmt.Errorf("provisioning did not produce %s", e.imageArchive)
	}
	return nil
}

// goRoot returns the GOROOT of the go command that built this test, found
// through GOROOT or the go on PATH; provision.sh falls back on its own.
func goRoot() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	if p, err := exec.LookPath("go"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(filepath.Dir(r))
		}
	}
	return "/usr/local/go"
}

func testingVerbose() bool {
	for _, a := range os.Args[1:] {
		if a == "-test.v" || a == "-test.v=true" || strings.HasPrefix(a, "-test.v=test2json") {
			return true
		}
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// dumpLogTail prints the end of containerd's log, for failed runs.
func (e *env) dumpLogTail(n int) {
	b, err := os.ReadFile(e.logPath)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	logf("last %d lines of %s (containerd %s):", len(lines), e.logPath, e.version)
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, "  | "+l)
	}
}

// teardown stops all pods through CRI (gracefully, so shims exit and remove
// their sockets), then has the supervisor kill containerd and anything of
// ours left, unmount everything under e.dir, remove our cgroups and e.dir.
// It then checks that nothing is left. Safe to call more than once.
func (e *env) teardown() error {
	e.teardownOnce.Do(func() {
		start := time.Now()
		var errs []error
		if e.cri != nil {
			if e.sup != nil && e.sup.running() {
				if err := e.cri.removeAllPods(20 * time.Second); err != nil {
					logf("teardown: removing pods through CRI: %v (the supervisor kills what is left)", err)
				}
			}
			e.cri.close()
		}
		if e.sup != nil {
			summary, err := e.sup.teardown()
			if err != nil {
				errs = append(errs, err)
			} else if testingVerbose() {
				logf("teardown: %s", summary)
			}
		}
		if err := e.checkClean(); err != nil {
			errs = append(errs, err)
		}
		e.teardownErr = errors.Join(errs...)
		if testingVerbose() {
			logf("teardown took %v", time.Since(start).Round(time.Millisecond))
		}
	})
	return e.teardownErr
}

// checkClean verifies that no process, mount, socket, cgroup or file of
// ours is left.
func (e *env) checkClean() error {
	var errs []error
	if procs := ourProcesses(e.dir, e.cgroupParent, -1); len(procs) > 0 {
		errs = append(errs, fmt.Errorf("processes left: %v", procs))
	}
	if ms := mountsUnder(e.dir); len(ms) > 0 {
		errs = append(errs, fmt.Errorf("mounts left: %v", ms))
	}
	if fileExists(e.dir) {
		errs = append(errs, fmt.Errorf("%s still exists", e.dir))
	}
	for _, cg := range cgroupDirs(e.cgroupParent) {
		if fileExists(cg) {
			errs = append(errs, fmt.Errorf("cgroup %s still exists", cg))
		}
	}
	if e.kubelet != nil {
		if err := e.kubelet.checkHostPaths(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

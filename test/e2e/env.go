package e2e

// The suite's environment: the variables it reads, the runtimes it runs
// against (four containerd versions and CRI-O), and env, one private
// runtime (its dir, supervisor, socket, CRI client), set up for every
// runtime by setup and torn down and checked clean by teardown.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	// envRuntimes narrows the runtimes the suite runs against (comma- or
	// space-separated prefixes of allRuntimes, e.g. "2.2", "1.7,2.2" or
	// "crio"); unset means all of them, as in CI.
	envRuntimes = "PLEG_E2E_RUNTIMES"
)

// allRuntimes are the runtimes the suite runs against: containerd
// versions, oldest first, then CRI-O ("crio-<version>"); provision.sh
// provisions each into <cache>/containerd-<version>/bin or
// <cache>/crio-<version>/bin.
var allRuntimes = []string{"1.6.20", "1.7.35", "2.2.9", "2.3.7", "2.4.2", "crio-1.36.3"}

// Images built by provision.sh and imported into containerd's k8s.io
// namespace.
const (
	pauseImage    = "docker.io/pleg/pause:e2e"
	workloadImage = "docker.io/pleg/workload:e2e"
	criNamespace  = "k8s.io"
	// podNamespace is the Kubernetes namespace RunPod puts pods in.
	podNamespace = "e2e"
)

// suite is the runtime the running test talks to: the newest containerd
// of runtimes (CRI-O when the run has no containerd) unless the test runs
// a subtest per runtime (forEachRuntime) or needs one version
// (useRuntime).
var suite *env

// runtimes are every private runtime of this run, in allRuntimes' order,
// all started by TestMain.
var runtimes []*env

// baseEnv holds what every env of this run shares (repository, cache,
// image archive, runc), for tests that start an env of their own
// (startKubelet).
var baseEnv *env

// env describes one private runtime (a containerd or a CRI-O) the tests
// talk to.
type env struct {
	kind         string // kindContainerd or kindCRIO
	version      string // e.g. "2.2.9" (containerd) or "1.36.3" (CRI-O)
	repoRoot     string
	cacheDir     string
	binDir       string // containerd, containerd-shim-runc-v2, ctr of this version; or crio, pinns
	imageArchive string // OCI layout tar with both images
	runcPath     string
	kubeletBin   string // the kubelet built by test/kubelet/build.sh

	dir          string // private temp root; everything below is ours
	sock         string // containerd gRPC (and CRI) socket, or CRI-O's
	configPath   string
	logPath      string // the runtime's stdout+stderr (appended across restarts)
	snapshotter  string // overlayfs or native
	cgroupParent string // cgroup parent of all pods, e.g. /pleg-e2e-123
	runDirMade   bool   // /run/containerd did not exist before we started
	// socketGID is the group containerd gives its socket ([grpc] gid),
	// 0 (root's) unless a test sets it and restarts containerd
	// (TestDaemonSetOnKubelet: the socket's group for a non-root pleg).
	socketGID int
	// podEvents is CRI-O's enable_pod_events (true unless a test
	// switches it off with setPodEvents).
	podEvents bool
	// preload are OCI archives CRI-O's storage gets before CRI-O first
	// starts, beside the suite's two images (env.importArchive cannot
	// copy into the storage of a CRI-O that runs: see loadCRIOImages).
	preload []ociArchive

	sup *supervisorClient
	cri *criClient

	kubelet *kubelet // the kubelet running on this containerd, if any (startKubelet)
	// enter, when set, is the command prefix that runs the supervisor,
	// and so the runtime and every container, in a cluster node's
	// namespaces (nodeNS.enter).
	enter []string

	teardownOnce sync.Once
	teardownErr  error
}

// ociArchive is an OCI layout tar holding one image, and its reference.
type ociArchive struct{ path, ref string }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...)
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
			if r == item || strings.HasPrefix(r, item+".") || strings.HasPrefix(r, item+"-") {
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
				errs[i] = fmt.Errorf("%s: %w", runtimeName(v), errs[i])
			} else {
				logf("%s started in %v", runtimeName(v), time.Since(start).Round(time.Millisecond))
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

// runtimeName is the subtest name of an allRuntimes item:
// "containerd-2.2.9", "crio-1.36.3".
func runtimeName(item string) string {
	if strings.HasPrefix(item, kindCRIO+"-") {
		return item
	}
	return kindContainerd + "-" + item
}

// startEnv starts the runtime named by an allRuntimes item (a containerd
// version, or crio-<version>) on a private dir. When it returns a non-nil
// env, that env must be torn down, even if err is non-nil.
func startEnv(base *env, item string) (*env, error) {
	return startEnvWith(base, item, nil)
}

// startEnvWith is startEnv, calling before (when set) once the env's dir
// exists and its supervisor runs, before containerd starts: e.g. to mount
// a tmpfs for its root (the supervisor unmounts it at teardown).
func startEnvWith(base *env, item string, before func(*env) error) (*env, error) {
	return startEnvOpts(base, item, envOpts{before: before})
}

// envOpts are startEnvOpts's hooks.
type envOpts struct {
	// prepare is called once the env's dir exists and its paths are set,
	// before its supervisor starts: it may move the socket (e.sock, in a
	// directory of its own) and set e.enter.
	prepare func(*env) error
	// before is startEnvWith's.
	before func(*env) error
}

// startEnvOpts is startEnvWith with the hooks of o.
func startEnvOpts(base *env, item string, o envOpts) (*env, error) {
	before := o.before
	e := &env{
		kind:         kindContainerd,
		version:      item,
		repoRoot:     base.repoRoot,
		cacheDir:     base.cacheDir,
		imageArchive: base.imageArchive,
		runcPath:     base.runcPath,
	}
	bins := []string{"containerd", "containerd-shim-runc-v2", "ctr"}
	if v, ok := strings.CutPrefix(item, kindCRIO+"-"); ok {
		e.kind, e.version, e.podEvents = kindCRIO, v, true
		bins = []string{"crio", "pinns"}
	}
	e.binDir = filepath.Join(base.cacheDir, e.name(), "bin")
	for _, f := range bins {
		if !fileExists(filepath.Join(e.binDir, f)) {
			return nil, fmt.Errorf("provisioning did not produce %s", filepath.Join(e.binDir, f))
		}
	}
	var err error
	if e.dir, err = os.MkdirTemp("", "pleg-e2e-"); err != nil {
		return nil, err
	}
	if e.kind == kindCRIO {
		// In a directory of its own, as on a node (/var/run/crio): a pod
		// that mounts the socket's directory must not mount CRI-O's
		// storage root with it (CRI-O then makes that mount HostToContainer,
		// which needs a shared or slave mount of the source).
		e.sock = filepath.Join(e.dir, "crio", "crio.sock")
		e.configPath = filepath.Join(e.dir, "crio.conf")
		e.logPath = filepath.Join(e.dir, "crio.log")
	} else {
		e.sock = filepath.Join(e.dir, "containerd.sock")
		e.configPath = filepath.Join(e.dir, "config.toml")
		e.logPath = filepath.Join(e.dir, "containerd.log")
	}
	e.cgroupParent = "/" + filepath.Base(e.dir)
	if _, err := os.Stat("/run/containerd"); e.kind == kindContainerd && errors.Is(err, os.ErrNotExist) {
		e.runDirMade = true
	}
	if o.prepare != nil {
		if err := o.prepare(e); err != nil {
			os.RemoveAll(e.dir)
			return nil, err
		}
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
	if e.kind == kindCRIO {
		return e.startCRIO()
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
	logf("last %d lines of %s (%s):", len(lines), e.logPath, e.name())
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, "  | "+l)
	}
}

// teardown stops all pods through CRI (gracefully, so shims exit and remove
// their sockets), then has the supervisor kill the runtime and anything of
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

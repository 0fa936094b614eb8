package e2e

// Main: the harness for a test package beside this one whose tests start
// every runtime they use themselves (startKubeletOn: a private runtime and
// a kubelet each) and share none, so that `go test ./...` runs them at the
// same time as this package's suite (test/kubeletfail: scenarios that wait
// minutes for the real kubelet to report "PLEG is not healthy").

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// privateRun is the state of a run of Main (zero in this package's own
// suite, which runs shared runtimes).
var privateRun struct {
	// selected are the allRuntimes items provisioned for this run: those
	// Main was given that PLEG_E2E_RUNTIMES selects.
	selected map[string]bool
	// home is the run's own dir (no runtime in it), where PlegBinary
	// builds the pleg binary.
	home *env
}

// runHome is the env whose dir holds what a run builds once (the pleg
// binary, the pleg image): the newest shared runtime's, or the run's own
// dir under Main.
func runHome() *env {
	if len(runtimes) > 0 {
		return runtimes[len(runtimes)-1]
	}
	return privateRun.home
}

// Main is TestMain for a package of tests that each start the runtimes
// they use (startKubeletOn): it dispatches the supervisor's re-exec
// (every env's supervisor is the test binary), honours PLEG_E2E_SKIP,
// provisions the runtimes of items that PLEG_E2E_RUNTIMES selects (all
// of them unless it is set) and the kubelet, starts no runtime, runs the
// tests and checks that no pleg process of the run is left. A failure to
// provision fails the run, as in this package's suite.
func Main(m *testing.M, items ...string) int {
	if os.Getenv(envSupervisor) != "" {
		return supervisorMain()
	}
	if os.Getenv(envSkip) == "1" {
		fmt.Printf("SKIP: the real-runtime tests of this package are skipped because %s=1\n", envSkip)
		return 0
	}
	if uid := os.Geteuid(); uid != 0 {
		logf("FAIL: must run as root (the runtimes and runc need it), running as uid %d", uid)
		return 1
	}
	all, err := selectRuntimes()
	if err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	var versions []string
	privateRun.selected = map[string]bool{}
	for _, item := range items {
		if !slices.Contains(allRuntimes, item) {
			logf("FAIL: Main: %q is none of %s", item, strings.Join(allRuntimes, ", "))
			return 1
		}
		if slices.Contains(all, item) {
			versions = append(versions, item)
			privateRun.selected[item] = true
		}
	}
	base := env{}
	if base.repoRoot, err = findRepoRoot(); err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	base.cacheDir = os.Getenv(envCache)
	if base.cacheDir == "" {
		base.cacheDir = filepath.Join(base.repoRoot, ".cache", "e2e")
	}
	base.imageArchive = filepath.Join(base.cacheDir, "images", "e2e-images.tar")
	start := time.Now()
	err = base.provision(versions)
	if err == nil {
		err = base.provisionKubelet()
	}
	if err == nil {
		base.runcPath, err = lookRunc()
	}
	if err != nil {
		logf("FAIL: provisioning: %v", err)
		logf("(the tests fail rather than skip; set %s=1 to skip them)", envSkip)
		return 1
	}
	sweepStale()
	baseEnv = &base
	// Not pleg-e2e-*: sweepStale and the runtimes' dirs keep to those.
	dir, err := os.MkdirTemp("", "pleg-private-run-")
	if err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	privateRun.home = &env{repoRoot: base.repoRoot, cacheDir: base.cacheDir, dir: dir}
	logf("provisioned %s and the kubelet in %v; run dir %s", strings.Join(versions, ", "), time.Since(start).Round(time.Millisecond), dir)

	code := m.Run()

	if err := cleanRunDir(dir); err != nil {
		logf("FAIL: %v", err)
		code = 1
	}
	var names, allNames []string
	for _, v := range versions {
		names = append(names, runtimeName(v))
	}
	for _, v := range items {
		allNames = append(allNames, runtimeName(v))
	}
	if v := os.Getenv(envRuntimes); v != "" {
		fmt.Printf("e2e: ran against %s only (%s=%q; all: %s)\n", strings.Join(names, ", "), envRuntimes, v, strings.Join(allNames, ", "))
	} else {
		fmt.Printf("e2e: ran against %s (all)\n", strings.Join(names, ", "))
	}
	return code
}

// cleanRunDir kills (and reports) every process run from dir (a pleg the
// tests left running) and removes dir.
func cleanRunDir(dir string) error {
	var errs []error
	var left []string
	for _, p := range listProcs() {
		if p.state != 'Z' && len(p.argv) > 0 && strings.HasPrefix(p.argv[0], dir+"/") {
			left = append(left, p.String())
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes left running from %s (killed): %v", dir, left))
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

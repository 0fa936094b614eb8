package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(envTypicalAgents); spec != "" {
		// This process is a measurement's agents, not a test run.
		os.Exit(typicalAgentsMain(spec))
	}
	if os.Getenv(envSupervisor) != "" {
		// This process is the suite's supervisor (see supervisor.go),
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

// runSuite provisions, starts every containerd, runs the tests and tears
// down.
func runSuite(m *testing.M) (code int) {
	start := time.Now()
	envs, err := setup()
	if len(envs) > 0 {
		runtimes = envs
		suite = envs[len(envs)-1]
		for _, e := range envs {
			if e.kind == kindContainerd {
				suite = e // the newest containerd, the default runtime
			}
		}
		teardownAll := func() error {
			var errs []error
			for _, e := range envs {
				if err := e.teardown(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", e.name(), err))
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
		logf("%s ready (dir %s, snapshotter %s)", e.name(), e.dir, e.snapshotter)
	}
	logf("all runtimes ready in %v", time.Since(start).Round(time.Millisecond))
	code = m.Run()
	// Never silently fewer: say which runtimes ran (stdout, so that it is
	// in the test log even when the package passes).
	var names []string
	for _, e := range envs {
		names = append(names, e.name())
	}
	var all []string
	for _, r := range allRuntimes {
		all = append(all, runtimeName(r))
	}
	if v := os.Getenv(envRuntimes); v != "" {
		fmt.Printf("e2e: ran against %s only (%s=%q; all: %s)\n", strings.Join(names, ", "), envRuntimes, v, strings.Join(all, ", "))
	} else {
		fmt.Printf("e2e: ran against %s (all)\n", strings.Join(names, ", "))
	}
	return code
}

package npd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real node-problem-detector runs deploy/npd's rule every second
// against a real pleg: what NPD reports is asserted from NPD's own output,
// its /metrics (problem_gauge, problem_counter) and the PLEGUnhealthy
// condition it logs, through four states of the node, in order:
//
//  1. healthy: the condition False (reason PLEGIsHealthy), no problem;
//  2. the runtime hung (the simulator SIGSTOPped): pleg's relists fail,
//     after its 3 s threshold /readyz says "PLEG is not healthy", pleg
//     check exits 1 and NPD turns the condition True (PLEGIsNotHealthy),
//     problem_gauge 1, problem_counter 1;
//  3. recovered (SIGCONT): False again, problem_gauge 0, the counter kept;
//  4. the pleg daemon down (pleg run stopped): pleg check exits 2 and NPD
//     turns the condition Unknown, with pleg check's message; not a
//     problem (problem_gauge 0, the counter unchanged). deploy/README.md
//     says why, and which alert shows a dead daemon instead.
func TestNPDReportsPlegVerdicts(t *testing.T) {
	needSuite(t)
	node := startPleg(t)
	cfg := testConfig(t, shortDir(t), suite.pleg, node.addr)
	n := startNPD(t, cfg)

	// expect waits until NPD's condition and metrics are as wanted, and
	// returns how long that took.
	expect := func(what string, status, reason string, gaugeNotHealthy, counter float64, msg string) time.Duration {
		t.Helper()
		return waitFor(t, patience, what, func() error {
			if n.exited() {
				t.Fatalf("node-problem-detector exited: %v", n.err)
			}
			c, _ := n.condition()
			if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("condition %+v, want status %s, reason %s, message with %q", c, status, reason, msg)
			}
			m, err := n.metrics()
			if err != nil {
				return err
			}
			if m.gauge["PLEGIsNotHealthy"] != gaugeNotHealthy || m.gauge["PLEGIsHealthy"] != 0 || m.counter["PLEGIsNotHealthy"] != counter {
				return fmt.Errorf("%v, want problem_gauge{reason=PLEGIsNotHealthy} %v, {reason=PLEGIsHealthy} 0, problem_counter{reason=PLEGIsNotHealthy} %v",
					m, gaugeNotHealthy, counter)
			}
			return nil
		})
	}
	// checked waits until NPD has logged a result of the rule after the
	// first `after` ones with the given exit code and message.
	checked := func(what string, after int, exit, msg string) (checkResult, int) {
		t.Helper()
		var got checkResult
		var n2 int
		waitFor(t, patience, what, func() error {
			rs := n.results()
			n2 = len(rs)
			for _, r := range rs[min(after, len(rs)):] {
				if r.Exit == exit && strings.Contains(r.Message, msg) {
					got = r
					return nil
				}
			}
			return fmt.Errorf("%d results, the last ones %v", len(rs), rs[max(0, len(rs)-3):])
		})
		return got, n2
	}

	// 1. Healthy. The condition starts False and stays so: NPD logs no
	// change, so the check's own result (exit 0, pleg's Ready message)
	// shows the rule ran.
	start := time.Now()
	r, seen := checked("a healthy check by NPD", 0, "0", "kubelet is posting ready status")
	took := expect("NPD's condition on a healthy node", "False", "PLEGIsHealthy", 0, 0, "PLEG is relisting within its threshold")
	if c := n.forecastCondition(); c.Status != "False" || c.Reason != "KubeletPLEGNotAtRisk" {
		t.Errorf("NPD's forecast condition on a healthy node: %+v", c)
	}
	t.Logf("healthy: NPD's first check result %+v %v after NPD started; condition False, problem_gauge 0, problem_counter 0 (%v more)",
		r, time.Since(start).Round(100*time.Millisecond), took.Round(100*time.Millisecond))

	// 2. The runtime hangs: every call to it times out (1 s), no relist
	// succeeds, pleg's 3 s threshold passes.
	node.sim.signal(t, syscall.SIGSTOP)
	// The forecast's condition says what the kubelet's PLEG will do: the
	// runtime does not answer its listing (pleg's own bound on it, 1 s).
	forecast := func(what, status, reason, msg string) time.Duration {
		t.Helper()
		return waitFor(t, patience, what, func() error {
			if c := n.forecastCondition(); c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("KubeletPLEGAtRisk %+v, want status %s, reason %s, message with %q", c, status, reason, msg)
			}
			return nil
		})
	}
	took = forecast("NPD's forecast condition with the runtime hung", "True", "KubeletPLEGWillReportNotHealthy",
		"the kubelet's PLEG will report not healthy in ~")
	t.Logf("hung runtime: KubeletPLEGAtRisk True (%q) %v after SIGSTOP", n.forecastCondition().Message, took.Round(100*time.Millisecond))
	took = expect("NPD's condition with the runtime hung", "True", "PLEGIsNotHealthy", 1, 1, "PLEG is not healthy: pleg was last seen active")
	c, _ := n.condition()
	t.Logf("hung runtime: condition True (%s: %q), problem_gauge 1, problem_counter 1, %v after SIGSTOP (pleg's threshold 3 s, NPD's interval 1 s)",
		c.Reason, c.Message, took.Round(100*time.Millisecond))

	// 3. The runtime is back.
	node.sim.signal(t, syscall.SIGCONT)
	took = expect("NPD's condition after the runtime recovered", "False", "PLEGIsHealthy", 0, 1, "PLEG is relisting within its threshold")
	forecast("NPD's forecast condition after the runtime recovered", "False", "KubeletPLEGNotAtRisk", "the kubelet's PLEG is not about to report not healthy")
	t.Logf("recovered: condition False, problem_gauge 0, problem_counter 1, %v after SIGCONT", took.Round(100*time.Millisecond))

	// 4. The pleg daemon is down: pleg check cannot reach it (exit 2).
	seen = len(n.results())
	node.run.stop(t)
	start = time.Now()
	r, _ = checked("NPD's check with pleg run stopped", seen, "2", "cannot reach pleg at http://"+node.addr+"/readyz")
	expect("NPD's condition with pleg run stopped", "Unknown", "PLEGIsHealthy", 0, 1, "cannot reach pleg")
	took = time.Since(start)
	c, _ = n.condition()
	t.Logf("pleg down: check result %+v; condition Unknown (%s: %q), problem_gauge 0, problem_counter 1, %v after pleg run exited",
		r, c.Reason, c.Message, took.Round(100*time.Millisecond))
}

// The rule's pleg binary is not in place when NPD starts (NPD's patch
// copies it in an init container; a node may install it later): NPD
// v1.36.0 refuses a config whose rule's path does not exist and exits at
// start, taking its other monitors with it. The shipped rule runs
// /bin/sh, which always exists, and its one-line script reports a missing
// binary as unknown (exit 2). So NPD stays up, reports Unknown until the
// binary appears, and then pleg's verdict. The control: the same config
// with the rule's path set to the missing binary itself makes NPD exit.
func TestNPDStartsBeforePlegBinary(t *testing.T) {
	needSuite(t)
	node := startPleg(t)
	dir := shortDir(t)
	bin := filepath.Join(dir, "opt", "pleg")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, dir, bin, node.addr)

	// The control: a rule whose path is the missing binary.
	t.Run("direct path exits", func(t *testing.T) {
		d := shortDir(t)
		c := shippedConfig(t)
		rule, _ := ruleArgs(t, c)
		ctl := filepath.Join(d, "direct.json")
		rule["path"] = bin
		rule["args"] = []any{"check", "--url=http://" + node.addr + "/readyz", "--timeout=10s"}
		writeJSON(t, ctl, c)
		p := startNPD(t, ctl)
		select {
		case <-p.done:
		case <-time.After(patience):
			t.Fatalf("NPD still running %v after its start with the rule's path %s missing", patience, bin)
		}
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("NPD ended (%v), not with a failure exit code, with the rule's path missing; log:\n%s", p.err, p.log)
		}
		if !strings.Contains(p.log.String(), fmt.Sprintf("rule path %q does not exist", bin)) {
			t.Fatalf("NPD exited (%v) without saying the rule's path is missing:\n%s", p.err, p.log)
		}
		t.Logf("with the rule's path %s missing, NPD exits at start: %v", bin, p.err)
	})

	n := startNPD(t, cfg)
	start := time.Now()
	waitFor(t, patience, "NPD's condition before the binary is in place", func() error {
		if n.exited() {
			t.Fatalf("node-problem-detector exited: %v", n.err)
		}
		c, _ := n.condition()
		if c.Status != "Unknown" || !strings.Contains(c.Message, "cannot run pleg: "+bin+" is not an executable file") {
			return fmt.Errorf("condition %+v", c)
		}
		m, err := n.metrics()
		if err != nil {
			return err
		}
		if m.gauge["PLEGIsNotHealthy"] != 0 || m.counter["PLEGIsNotHealthy"] != 0 {
			return fmt.Errorf("a missing binary counted as a problem: %v", m)
		}
		return nil
	})
	c, _ := n.condition()
	t.Logf("binary missing: NPD runs, condition %s (%q) after %v", c.Status, c.Message, time.Since(start).Round(100*time.Millisecond))

	// The binary arrives (atomically, as a rename).
	installAt(t, bin)
	start = time.Now()
	waitFor(t, patience, "NPD's condition once the binary is in place", func() error {
		if n.exited() {
			t.Fatalf("node-problem-detector exited: %v", n.err)
		}
		c, _ := n.condition()
		if c.Status != "False" || c.Reason != "PLEGIsHealthy" {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	t.Logf("binary in place: condition False after %v", time.Since(start).Round(100*time.Millisecond))
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// installAt copies the suite's pleg binary to path as an installer would:
// written beside it, then renamed into place, so that nothing ever runs a
// partial file.
func installAt(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(suite.pleg)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

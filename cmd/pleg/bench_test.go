package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/bench"
)

// runBenchCmd runs `pleg bench args...` and returns its standard output.
func runBenchCmd(t *testing.T, args ...string) string {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"bench"}, args...))
	if err := root.Execute(); err != nil {
		t.Fatalf("pleg bench %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

func TestBenchQuickJSON(t *testing.T) {
	// The simulated runtime runs in a child process: this test binary,
	// re-executed (bench.go's init serves it).
	out := runBenchCmd(t, "--quick", "--scenario", "66x7", "--output", "json")
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Runtime != "child-process" || len(rep.Scenarios) != 1 {
		t.Fatalf("report: runtime %q, %d scenarios", rep.Runtime, len(rep.Scenarios))
	}
	s := rep.Scenarios[0]
	if s.Scenario.Name != "66x7" || s.PLEG == nil || s.Kubelet != nil {
		t.Fatalf("scenario %q: pleg %v, kubelet %v", s.Scenario.Name, s.PLEG, s.Kubelet)
	}
	// 2 list calls, then 10 changed pods of 1 sandbox and 7 containers:
	// at least one status call for each, at most all 8.
	if r := s.PLEG; r.CallsPerRelist < 12 || r.CallsPerRelist > 82 || !r.InspectedAsChanged || r.PeakRSSBytes <= 0 {
		t.Errorf("%v calls per relist (%v), inspected as changed: %v, peak RSS %d", r.CallsPerRelist, r.CallsByOp, r.InspectedAsChanged, r.PeakRSSBytes)
	}
}

func TestBenchTextInProcess(t *testing.T) {
	out := runBenchCmd(t, "--quick", "--scenario", "66x7", "--in-process", "--relists", "2")
	for _, want := range []string{"pleg bench", "GOMAXPROCS", "== 66x7: 66 pods x 7 containers, 10 pods changed per relist, 1ms per runtime call",
		"relist p50", "CPU / relist", "serve from this process", "measured relists: pleg 2 (no kubelet baseline"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "kubelet v1.37.2  ") {
		t.Errorf("a kubelet column without --kubelet:\n%s", out)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--output", "yaml"},
		{"bench", "--scenario", "nope"},
		{"bench", "--relists", "-1"},
	} {
		if code := execute(args); code != 2 {
			t.Errorf("pleg %s: exit code %d, want 2", strings.Join(args, " "), code)
		}
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/app/bench"
)

// benchOutput runs the pleg binary's bench with args and returns its standard
// output.
func benchOutput(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(plegBinary, append([]string{"bench"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pleg bench %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// The product binary runs the bench: its children are the binary itself,
// run as `pleg bench child runtime|pleg`.
func TestBenchQuickJSON(t *testing.T) {
	out := benchOutput(t, "--quick", "--scenario", "66x7", "--output", "json")
	var rep bench.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Scenarios) != 1 {
		t.Fatalf("report: %d scenarios", len(rep.Scenarios))
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

// The text report, and the CPU and heap profiles of pleg's generator process.
func TestBenchText(t *testing.T) {
	prof, heap := filepath.Join(t.TempDir(), "pleg.prof"), filepath.Join(t.TempDir(), "heap.prof")
	out := string(benchOutput(t, "--quick", "--scenario", "66x7", "--relists", "2", "--cpuprofile", prof, "--memprofile", heap))
	for _, want := range []string{"pleg bench", "GOMAXPROCS", "== 66x7: 66 pods x 7 containers, 10 pods changed per relist, 1ms per runtime call",
		"relist p50", "CPU / relist", "runs in a child process", "measured relists: pleg 2 (no kubelet baseline"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "kubelet v1.37.2  ") {
		t.Errorf("a kubelet column without --kubelet:\n%s", out)
	}
	if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
		t.Errorf("CPU profile: %v", err)
	}
	if fi, err := os.Stat(heap); err != nil || fi.Size() == 0 {
		t.Errorf("heap profile: %v", err)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--output", "yaml"},
		{"bench", "--scenario", "nope"},
		{"bench", "--relists", "-1"},
		{"bench", "--pod-relist-burst", "0"},
		{"bench", "child", "kubelet"},
	} {
		if code := execute(args); code != 2 {
			t.Errorf("pleg %s: exit code %d, want 2", strings.Join(args, " "), code)
		}
	}
}

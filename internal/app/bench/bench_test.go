package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

func TestMain(m *testing.M) {
	// The runs re-execute this test binary as `<binary> bench child
	// <role>` to serve the simulated runtime and pleg's generator, as
	// `pleg bench` re-executes the pleg binary.
	if len(os.Args) == 4 && os.Args[1] == "bench" && os.Args[2] == "child" {
		if err := ServeChild(os.Args[3], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "bench child %s: %v\n", os.Args[3], err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// small is a scaled-down 66x7 scenario with 1 ms per call.
func small() Scenario {
	return Scenario{
		Name: "small", Pods: 12, Containers: 3, Changed: 4, Latency: time.Millisecond,
		Relists: 3, KubeletRelists: 2, Quick: 3, QuickKubelet: 2,
		RequestTimeout: 5 * time.Second,
	}
}

func TestRunQuickChildProcess(t *testing.T) {
	sc := small()
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Notes) == 0 || rep.GOMAXPROCS <= 0 || rep.CPUModel == "" || rep.Date.IsZero() {
		t.Errorf("report header: %+v", rep)
	}
	if len(rep.Scenarios) != 1 {
		t.Fatalf("%d scenarios, want 1", len(rep.Scenarios))
	}
	res := rep.Scenarios[0]
	p := res.PLEG
	if p == nil || res.Kubelet != nil {
		t.Fatalf("runs: pleg %v, kubelet %v", p, res.Kubelet)
	}
	checkRun(t, sc, p, 3)
	if p.MaxParallelInspections <= 1 || p.ListP50Ms <= 0 {
		t.Errorf("pleg bound %d, list p50 %v", p.MaxParallelInspections, p.ListP50Ms)
	}
	// pleg ran in a process of its own: a Go program's resident set, not
	// this test binary's.
	if p.PeakRSSBytes < 1<<20 {
		t.Errorf("pleg peak RSS %d bytes", p.PeakRSSBytes)
	}
	// Part of it is the binary's pages: megabytes, less than the whole.
	if p.ResidentFileBytes < 1<<20 || p.ResidentFileBytes >= p.PeakRSSBytes {
		t.Errorf("pleg's resident file pages %d bytes of a %d byte peak", p.ResidentFileBytes, p.PeakRSSBytes)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== small: 12 pods x 3 containers, 4 pods changed per relist, 1ms per runtime call",
		"no kubelet baseline", "relist p50", "relist p99", "runtime calls / relist", "CPU / relist",
		"allocations / relist", "peak RSS", "the binary's pages (RssFile, at the end)", "every relist inspected exactly 4 pods", "child process"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Scenarios) != 1 || back.Scenarios[0].PLEG == nil || back.Scenarios[0].PLEG.CallsPerRelist != p.CallsPerRelist {
		t.Errorf("JSON report does not round-trip: %s", js.String())
	}
}

// TestRunIdleFloor: in an idle scenario pleg's process also measures the
// bare list calls, and the report shows them beside its CPU per relist.
func TestRunIdleFloor(t *testing.T) {
	sc := small()
	sc.Name, sc.Changed, sc.Latency = "small-idle", 0, 0
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Scenarios[0].PLEG
	// 12 sandboxes and 36 containers are kilobytes; a reply discarded
	// without being received would count nothing.
	if !cpuMeasured {
		t.Skip("CPU time is not measured on this platform")
	}
	if p.ListFloorCPUMs <= 0 || p.ListBytes < 5000 {
		t.Errorf("bare list calls: %v ms, %d bytes", p.ListFloorCPUMs, p.ListBytes)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if want := "the bare list calls (" + fmtBytes(float64(p.ListBytes)) + ")"; !strings.Contains(text.String(), want) {
		t.Errorf("text report lacks %q:\n%s", want, text.String())
	}
}

// checkRun checks the figures of a run of the small scenario that the
// simulated runtime determines: the runtime calls and events of every
// relist, the pods inspected, and that everything was measured.
func checkRun(t *testing.T, sc Scenario, r *RunResult, relists int) {
	t.Helper()
	if r.Relists != relists || len(r.RelistMs) != relists {
		t.Errorf("%s: %d relists (%d timed), want %d", r.Algorithm, r.Relists, len(r.RelistMs), relists)
	}
	// The kubelet's GetPodStatus costs, for each changed pod, one sandbox
	// and Containers container status calls; the listing two calls. pleg
	// fetches at most that, and at least one status per changed pod.
	full := map[string]float64{"list_podsandbox": 1, "list_containers": 1,
		"podsandbox_status": float64(sc.Changed), "container_status": float64(sc.Changed * sc.Containers)}
	if r.Algorithm == "kubelet" {
		if !maps.Equal(r.CallsByOp, full) || r.CallsPerRelist != float64(2+sc.Changed*(1+sc.Containers)) {
			t.Errorf("kubelet: %v runtime calls per relist %v, want %v", r.CallsPerRelist, r.CallsByOp, full)
		}
	} else {
		for op, n := range r.CallsByOp {
			if n > full[op] {
				t.Errorf("%s: %v %s calls per relist, more than the kubelet's %v", r.Algorithm, n, op, full[op])
			}
		}
		if r.CallsByOp["list_podsandbox"] != 1 || r.CallsByOp["list_containers"] != 1 || r.CallsPerRelist < float64(2+sc.Changed) {
			t.Errorf("%s: %v runtime calls per relist %v", r.Algorithm, r.CallsPerRelist, r.CallsByOp)
		}
	}
	if !r.InspectedAsChanged || r.PodsInspectedPerRelist != float64(sc.Changed) {
		t.Errorf("%s: inspected %v per relist (%d..%d), want %d", r.Algorithm, r.PodsInspectedPerRelist, r.InspectedMin, r.InspectedMax, sc.Changed)
	}
	if r.EventsPerRelist != float64(3*sc.Changed) || r.DiscardedEvents != 0 {
		t.Errorf("%s: %v events per relist (%v discarded), want %d", r.Algorithm, r.EventsPerRelist, r.DiscardedEvents, 3*sc.Changed)
	}
	if r.RelistErrors != 0 || r.InspectionTimeouts != 0 {
		t.Errorf("%s: %d relist errors, %v inspection timeouts", r.Algorithm, r.RelistErrors, r.InspectionTimeouts)
	}
	if r.RelistP50Ms <= 0 || r.RelistP99Ms < r.RelistP50Ms {
		t.Errorf("%s: relist p50 %v p99 %v", r.Algorithm, r.RelistP50Ms, r.RelistP99Ms)
	}
	if r.ListFloorCPUMs != -1 || r.ListBytes != -1 {
		t.Errorf("%s: bare list calls measured while pods change: %v ms, %d bytes", r.Algorithm, r.ListFloorCPUMs, r.ListBytes)
	}
	if r.AllocsPerRelist <= 0 || r.AllocBytesPerRelist <= 0 || r.CPUPerRelistMs <= 0 || r.SimCPUPerRelistMs < 0 {
		t.Errorf("%s: allocs %v, bytes %v, cpu %v, sim cpu %v", r.Algorithm, r.AllocsPerRelist, r.AllocBytesPerRelist, r.CPUPerRelistMs, r.SimCPUPerRelistMs)
	}
}

func TestRunHungPod(t *testing.T) {
	sc := Scenario{
		Name: "hung", Pods: 6, Containers: 2, HungPods: 1,
		Relists: 8, KubeletRelists: 2,
		Pause:             20 * time.Millisecond,
		RequestTimeout:    600 * time.Millisecond,
		InspectionTimeout: 100 * time.Millisecond,
		RelistThreshold:   400 * time.Millisecond,
	}
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}})
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Scenarios[0].PLEG
	// pleg gives up on the pod after the inspection timeout.
	if p.InspectionTimeouts < 1 {
		t.Errorf("pleg: %v inspection timeouts", p.InspectionTimeouts)
	}
	if p.RelistMaxMs >= ms(sc.RequestTimeout) {
		t.Errorf("pleg relist max %vms, want well under the request timeout", p.RelistMaxMs)
	}
	if p.Health == nil || p.Health.Samples != 2*p.Relists || !p.Health.HealthyThroughout {
		t.Fatalf("pleg health: %+v", p.Health)
	}
	t.Logf("pleg: p50 %.1fms p99 %.1fms, health %+v", p.RelistP50Ms, p.RelistP99Ms, *p.Health)

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1 pod whose status calls hang", "longest without a relist", "healthy the whole time", "pod inspection timeouts"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

func TestWorkloadChangesExactlyN(t *testing.T) {
	r := sim.New(simConfig{Seed: 3, Pods: 5, Containers: 3}.sim())
	defer r.Stop()
	w := newWorkload(r)
	before := map[string][]string{}
	for _, p := range r.Pods() {
		before[p.UID] = p.ContainerIDs()
	}
	uid, err := w.hang(false, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Hung(); len(got) != 1 || got[0] != uid {
		t.Fatalf("hung %v, want [%s]", got, uid)
	}
	n, err := w.change(3)
	if err != nil || n != 3 {
		t.Fatalf("change(3) = %d, %v", n, err)
	}
	changed := 0
	for _, p := range r.Pods() {
		ids := p.ContainerIDs()
		if len(ids) != 3 || len(p.Sandboxes) != 1 {
			t.Errorf("pod %s changed shape: %d containers, %d sandboxes", p.UID, len(ids), len(p.Sandboxes))
		}
		diff := 0
		for i := range ids {
			if ids[i] != before[p.UID][i] && !slices.Contains(before[p.UID], ids[i]) {
				diff++
			}
		}
		if diff > 1 {
			t.Errorf("pod %s: %d containers replaced, want at most 1", p.UID, diff)
		}
		if diff == 1 && p.UID != uid {
			changed++
		}
	}
	if changed != 3 {
		t.Errorf("%d pods changed besides the hung one, want 3", changed)
	}
	// Asking for more pods than there are (the hung one excluded) changes
	// each once.
	if n, err := w.change(10); err != nil || n != 4 {
		t.Errorf("change(10) on 5 pods with 1 hung = %d, %v; want 4", n, err)
	}
}

func TestRuntimeChild(t *testing.T) {
	c, endpoint, err := startRuntime(context.Background(), Options{Seed: 1}, simConfig{Pods: 3, Containers: 2, EventBuffer: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(endpoint, "unix:///") || !strings.HasSuffix(endpoint, "/cri.sock") {
		t.Errorf("ready %q, want a unix socket endpoint", endpoint)
	}
	call := func(line string) string {
		t.Helper()
		res, err := c.Call("%s", line)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return res
	}
	for _, line := range []string{"latency nonsense", "bogus", "storm 10 sideways", "churn 0 1s", "emit x soon"} {
		if _, err := c.Call("%s", line); err == nil {
			t.Errorf("%q: no error", line)
		}
	}
	call("latency 1ms")
	if got := call("change 2"); got != "2" {
		t.Errorf("change 2: %q", got)
	}
	uid, at, _ := strings.Cut(call("change-one"), " ")
	if ns, err := strconv.ParseInt(at, 10, 64); err != nil || uid == "" || time.Since(time.Unix(0, ns)) > time.Minute {
		t.Errorf("change-one: %q %q (%v)", uid, at, err)
	}
	if got := call("hang"); got == "" {
		t.Errorf("hang: %q", got)
	}
	if n, err := c.CallInt("cpu"); err != nil || n <= 0 {
		t.Errorf("cpu: %d, %v", n, err)
	}
	var calls map[string]int64
	if err := c.CallJSON(&calls, "calls"); err != nil || len(calls) != 0 {
		t.Errorf("calls: %v, %v; want none yet", calls, err)
	}
	// The live scenarios' faults. Nobody subscribes: the events are
	// counted all the same.
	hung := call("hang-live lists")
	call("emit " + hung + " 1ms")
	call("storm 1000 started")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st sim.EventStats
		if err := c.CallJSON(&st, "eventstats"); err != nil {
			t.Fatal(err)
		}
		if st.Emitted > 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	call("storm 0")
	call("emit " + hung + " 0s")
	if got := call("podcalls " + hung); got != "{}" {
		t.Errorf("podcalls: %q, want none", got)
	}
	call("churn 1 1ms")
	for deadline := time.Now().Add(30 * time.Second); ; {
		if n, err := c.CallInt("churned"); err != nil || n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the churn changed nothing")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The child removed its socket's directory.
	if _, err := os.Stat(filepath.Dir(strings.TrimPrefix(endpoint, "unix://"))); !os.IsNotExist(err) {
		t.Errorf("the runtime's directory after quit: %v", err)
	}
}

// A child that fails at once: the error says so, with its stderr, and
// does not hang.
func TestChildFailureIsReported(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "fails")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho boom >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), Options{Scenarios: []Scenario{small()}, Quick: true, Executable: exe})
	if err == nil || !strings.Contains(err.Error(), "simulated runtime") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v", err)
	}
}

func TestLookup(t *testing.T) {
	all, err := Lookup("all")
	if err != nil || len(all) != 13 {
		t.Fatalf("all: %d, %v", len(all), err)
	}
	// The idle scenarios beside the kubelet's PLEG run only when named.
	if slices.ContainsFunc(all, func(s Scenario) bool { return s.OnDemand }) || len(Scenarios()) != 15 {
		t.Errorf("all holds a scenario on demand, or there are %d scenarios, want 15", len(Scenarios()))
	}
	idle, err := Lookup("1000x10-idle-adaptive,110x5-idle-adaptive")
	if err != nil || len(idle) != 2 || !idle[0].Live.Idle || !hasKubeletRun(idle[1].Live) {
		t.Fatalf("idle adaptive: %+v, %v", idle, err)
	}
	two, err := Lookup("500x10, 110x5-hung")
	if err != nil || len(two) != 2 || two[0].Name != "500x10" || two[1].HungPods != 1 {
		t.Fatalf("two: %+v, %v", two, err)
	}
	if _, err := Lookup("nope"); err == nil || !strings.Contains(err.Error(), "66x7") {
		t.Fatalf("unknown: %v", err)
	}
	// The scenarios.
	want := map[string][4]int{"66x7": {66, 7, 10, 0}, "500x10": {500, 10, 50, 0}, "1000x10-idle": {1000, 10, 0, 0}, "110x5-idle": {110, 5, 0, 0}, "110x5-hung": {110, 5, 0, 1},
		"hung-pod-events": {110, 5, 0, 1}, "hint-storm": {500, 5, 0, 0},
		"events-unchanged": {200, 5, 0, 0}, "events-churn": {200, 5, 0, 0}, "watchers": {110, 5, 0, 0}, "events-isolated": {200, 5, 0, 0},
		"events-churn-adaptive": {200, 5, 0, 0}, "events-isolated-adaptive": {200, 5, 0, 0},
		"1000x10-idle-adaptive": {1000, 10, 0, 0}, "110x5-idle-adaptive": {110, 5, 0, 0}}
	for _, s := range append(all, idle...) {
		w := want[s.Name]
		if [4]int{s.Pods, s.Containers, s.Changed, s.HungPods} != w {
			t.Errorf("%s: %d x %d, %d changed, %d hung; want %v", s.Name, s.Pods, s.Containers, s.Changed, s.HungPods, w)
		}
	}
	// The live scenarios: the case and the storm.
	hung, storm := all[5].Live, all[6].Live
	if hung == nil || !hung.HangLists || hung.HungPodEvents != 20*time.Millisecond || hung.RelistPeriod != 20*time.Millisecond ||
		all[5].InspectionTimeout != time.Second || all[5].RequestTimeout != 2*time.Minute || all[5].Latency != time.Millisecond {
		t.Errorf("hung-pod-events: %+v %+v", all[5], hung)
	}
	if storm == nil || storm.EventStorm < 1000 || storm.RelistPeriod != 100*time.Millisecond {
		t.Errorf("hint-storm: %+v %+v", all[6], storm)
	}
}

func TestRelistCounts(t *testing.T) {
	s := Scenarios()[4] // 110x5-hung
	for _, c := range []struct {
		kubelet, quick bool
		override       int
		want           int
	}{
		{false, false, 0, s.Relists},
		{true, false, 0, s.KubeletRelists},
		{false, true, 0, s.Quick},
		{true, true, 0, s.QuickKubelet},
		{false, false, 100, 100},
		{true, false, 100, maxHungKubeletRelists},
	} {
		if got := s.relists(c.kubelet, c.quick, c.override); got != c.want {
			t.Errorf("relists(kubelet %v, quick %v, override %d) = %d, want %d", c.kubelet, c.quick, c.override, got, c.want)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtMs(0.25), "250µs"}, {fmtMs(3.456), "3.46ms"}, {fmtMs(184.81), "184.8ms"}, {fmtMs(2010), "2.01s"}, {fmtMs(-1), "n/a"},
		{fmtCount(82), "82"}, {fmtCount(602370), "602,370"}, {fmtCount(2.25), "2.25"}, {fmtCount(150.4), "150"},
		{fmtBytes(2.5 * (1 << 20)), "2.5 MiB"}, {fmtBytes(48), "48 B"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestEvaluate(t *testing.T) {
	p := &RunResult{RelistP50Ms: 40, RelistP99Ms: 257, PodInspectionTimeoutMs: 250, ListP99Ms: 8, CPUPerRelistMs: 2,
		CallsPerRelist: 110, PeakRSSBytes: 20 << 20,
		Health: &HealthResult{Samples: 10, HealthyThroughout: true, ThresholdMs: 1000}}
	k := &RunResult{RelistP50Ms: 800, CallsPerRelist: 552, CPUPerRelistMs: 20}
	met := func(ts []Target) []bool {
		var out []bool
		for _, t := range ts {
			out = append(out, t.Checked && t.Met)
		}
		return out
	}
	for _, c := range []struct {
		name string
		p, k *RunResult
		want []bool
	}{
		{"500x10", p, k, []bool{true, true}},
		{"500x10", &RunResult{RelistP50Ms: 41, CallsPerRelist: 111}, k, []bool{false, false}},
		{"500x10", p, nil, []bool{false, false}},
		{"1000x10-idle", p, k, []bool{true, true}},
		{"1000x10-idle", &RunResult{CPUPerRelistMs: 2.1, PeakRSSBytes: 40<<20 + 1}, k, []bool{false, false}},
		{"110x5-idle", p, k, []bool{true, true}},
		{"110x5-idle", &RunResult{CPUPerRelistMs: 2, PeakRSSBytes: 20<<20 + 1}, k, []bool{true, false}},
		{"110x5-hung", p, nil, []bool{true, true}},
		{"110x5-hung", &RunResult{RelistP99Ms: 259, PodInspectionTimeoutMs: 250, ListP99Ms: 8}, nil, []bool{false, false}},
	} {
		if got := met(evaluate(Scenario{Name: c.name}, c.p, c.k)); !slices.Equal(got, c.want) {
			t.Errorf("%s (pleg %+v): met %v, want %v: %+v", c.name, c.p, got, c.want, evaluate(Scenario{Name: c.name}, c.p, c.k))
		}
	}
	// The RSS target says how much of the peak is the binary's pages.
	r := &RunResult{CPUPerRelistMs: 2, PeakRSSBytes: 23 << 20, ResidentFileBytes: 15 << 20}
	if got, want := evaluate(Scenario{Name: "110x5-idle"}, r, k)[1].Figure, "23.0 MiB, of which the binary's pages 15.0 MiB at the end"; got != want {
		t.Errorf("RSS figure %q, want %q", got, want)
	}
	// The idle CPU target says what the bare list calls alone cost.
	f := *p
	f.ListFloorCPUMs = 1.5
	got := evaluate(Scenario{Name: "110x5-idle"}, &f, k)[0].Figure
	if want := "; the bare list calls alone 1.50ms = 0.075 of the kubelet's, pleg's decoding and diff 500µs"; !strings.HasSuffix(got, want) {
		t.Errorf("figure %q, want it to end with %q", got, want)
	}
}

func TestLiveScenariosQuick(t *testing.T) {
	scs, err := Lookup("hung-pod-events,hint-storm")
	if err != nil {
		t.Fatal(err)
	}
	if raceEnabled {
		// The race detector slows the generator and the simulated runtime
		// several times over: 500 pods and 3,000 events a second saturate
		// two CPUs, and a listing alone then takes longer than the
		// threshold. The same storm per pod on a fifth of the node.
		storm := *scs[1].Live
		storm.EventStorm /= 5
		scs[1].Live = &storm
		scs[1].Pods /= 5
		t.Logf("race detector on: hint-storm with %d pods and %d events per second", scs[1].Pods, storm.EventStorm)
	}
	// Health thresholds a busy machine cannot miss: a fresh CI machine
	// compiles containerd beside this test, and one slow listing under the
	// race detector took 1.07 s against hint-storm's 1 s. A relist
	// goroutine held by a hung pod is still caught: it relists once or
	// twice in the window (the relist count below) and its interval p99
	// is the whole window.
	for i := range scs {
		scs[i].RelistThreshold = max(scs[i].RelistThreshold, 3*time.Second)
	}
	rep, err := Run(context.Background(), Options{Scenarios: scs, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 2 {
		t.Fatalf("%d scenarios, want 2", len(rep.Scenarios))
	}
	for _, res := range rep.Scenarios {
		sc := res.Scenario
		if len(res.Live) != 1 || res.PLEG != nil || res.Kubelet != nil {
			t.Fatalf("%s: live %v, pleg %v, kubelet %v", sc.Name, res.Live, res.PLEG, res.Kubelet)
		}
		r := res.Live[0]
		t.Logf("%s: %d relists in %.0fms, interval p50 %.1fms p99 %.1fms max %.1fms, relist p99 %.1fms, list p99 %.1fms, unhealthy %d of %d, events %d/%d, ListPod %d, skipped %v, hung pod calls %v",
			sc.Name, r.Relists, r.WindowMs, r.IntervalP50Ms, r.IntervalP99Ms, r.IntervalMaxMs, r.RelistP99Ms, r.ListP99Ms,
			r.Unhealthy, r.HealthChecks, r.EventsEmitted, r.EventsReceived, r.PodLists, r.Skipped, r.HungCallsWindow)
		// What matters: relists keep coming and health never fails. A
		// relist goroutine held by the hung pod's list call would relist
		// once or twice in the window and go unhealthy after the
		// threshold.
		if r.Relists < 5 {
			t.Errorf("%s: %d global relists in %.0fms, want them to keep coming", sc.Name, r.Relists, r.WindowMs)
		}
		if r.HealthChecks < 5 || r.EverUnhealthy {
			t.Errorf("%s: Healthy() false %d of %d checks (%s)", sc.Name, r.Unhealthy, r.HealthChecks, r.FirstUnhealthy)
		}
		if r.RelistErrors != 0 || r.EventsReceived == 0 || !r.StreamConnected {
			t.Errorf("%s: %d relist errors, %d events received, stream connected throughout %v", sc.Name, r.RelistErrors, r.EventsReceived, r.StreamConnected)
		}
		// The targets, with twice their margin: this is a busy machine's
		// test, not the measurement.
		var bound float64
		if sc.HungPods > 0 {
			bound = r.RelistPeriodMs + r.PodInspectionTimeoutMs + r.ListP99Ms
		} else {
			bound = 2*r.RelistPeriodMs + r.RelistP99Ms
		}
		if r.IntervalP99Ms > 2*bound {
			t.Errorf("%s: relist interval p99 %.1fms, more than twice the target %.1fms", sc.Name, r.IntervalP99Ms, bound)
		}
		if rb := r.PodInspectionTimeoutMs + r.ListP99Ms; r.RelistP99Ms > 2*rb {
			t.Errorf("%s: relist p99 %.1fms, more than twice the target %.1fms", sc.Name, r.RelistP99Ms, rb)
		}
		if len(res.Targets) != 3 {
			t.Errorf("%s: %d targets, want 3: %+v", sc.Name, len(res.Targets), res.Targets)
		}
	}

	hung := rep.Scenarios[0].Live[0]
	// The fault was exercised, and one call for the pod was out at a
	// time: its filtered list call, which never returns (the runtime
	// request timeout is 2 minutes).
	if hung.HungPod == "" || hung.HungCallsWindow["ListPodSandbox"] != 1 || hung.HungPodCallsTotal != 1 || hung.HungPodLists != 1 {
		t.Errorf("hung pod %q: runtime calls %v (%d in all), ListPod %d; want one ListPodSandbox", hung.HungPod, hung.HungCallsWindow, hung.HungPodCallsTotal, hung.HungPodLists)
	}
	if hung.InspectionTimeouts < 1 {
		t.Errorf("hung pod: %v inspection timeouts, want its list call timed out", hung.InspectionTimeouts)
	}
	storm := rep.Scenarios[1].Live[0]
	if storm.PodLists == 0 || storm.EventsEmitted < 500 {
		t.Errorf("hint storm: %d events emitted, %d single-pod lists", storm.EventsEmitted, storm.PodLists)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== hung-pod-events: 110 pods x 5 containers, 1 pod whose status calls and filtered list calls hang",
		"== hint-storm: ", " runtime events per second spread over every pod", "kubelet: not applicable",
		"relist interval p99", "Healthy() false (checks every 50ms)", "hung pod: runtime calls received (window)",
		"target: global relists keep coming every period", "target: relist p99 at most the pod inspection timeout plus one list round trip",
		"target: Healthy() never false"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "Relists are driven by hand") {
		t.Errorf("notes of the hand-driven scenarios in a live-only report:\n%s", text.String())
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Scenarios[0].Live) != 1 || back.Scenarios[0].Live[0].Relists != hung.Relists {
		t.Errorf("JSON report does not round-trip (%v): %s", err, js.String())
	}
}

func TestLiveIntervals(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	got := liveIntervals(t0, at(100), []time.Time{at(10), at(40), at(70)})
	want := []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("intervals %v, want %v", got, want)
	}
	// No relist: the whole window is one interval.
	if got := liveIntervals(t0, at(4000), nil); !slices.Equal(got, []time.Duration{4 * time.Second}) {
		t.Errorf("no relist: %v", got)
	}
}

func TestEvaluateLive(t *testing.T) {
	hung := Scenario{HungPods: 1}
	r := &LiveResult{Relists: 100, WindowMs: 4000, RelistPeriodMs: 20, PodInspectionTimeoutMs: 1000, ListP99Ms: 20,
		IntervalP99Ms: 1040, RelistP99Ms: 1020, HealthChecks: 80}
	ts := evaluateLive(hung, []*LiveResult{r})
	if len(ts) != 3 || !ts[0].Met || !ts[1].Met || !ts[2].Met {
		t.Fatalf("at the bounds: %+v", ts)
	}
	r.IntervalP99Ms, r.RelistP99Ms, r.Unhealthy, r.EverUnhealthy = 1041, 1021, 1, true
	for i, tg := range evaluateLive(hung, []*LiveResult{r}) {
		if tg.Met || !tg.Checked {
			t.Errorf("target %d over its bound: %+v", i, tg)
		}
	}
	// The storm's interval bound: 2 periods plus the relist p99.
	storm := &LiveResult{Relists: 30, RelistPeriodMs: 100, RelistP99Ms: 50, IntervalP99Ms: 250, PodInspectionTimeoutMs: 1000, HealthChecks: 80}
	if ts := evaluateLive(Scenario{}, []*LiveResult{storm}); !ts[0].Met {
		t.Errorf("storm at the bound: %+v", ts[0])
	}
	storm.IntervalP99Ms = 251
	if ts := evaluateLive(Scenario{}, []*LiveResult{storm}); ts[0].Met || !strings.Contains(ts[0].Figure, ">") {
		t.Errorf("storm over the bound: %+v", ts[0])
	}
	// No relist at all is never met.
	if ts := evaluateLive(hung, []*LiveResult{{IntervalP99Ms: 10, HealthChecks: 80}}); ts[0].Met || ts[1].Met {
		t.Errorf("no relist: %+v", ts)
	}
}

// The hint budget's scenarios, on a smaller node for a second or so: what
// their figures must show however busy the machine is.
func TestHintBudgetScenarios(t *testing.T) {
	scs, err := Lookup("events-unchanged,events-churn,events-isolated")
	if err != nil {
		t.Fatal(err)
	}
	for i := range scs {
		live := *scs[i].Live
		scs[i].Live = &live
		scs[i].Pods = 40
		live.Window = 700 * time.Millisecond
		if live.Changes == 0 {
			live.RelistPeriod = min(live.RelistPeriod, 250*time.Millisecond)
		}
	}
	scs[0].Live.EventStorm = 400
	scs[1].Live.Churn, scs[1].Latency = 5, 2*time.Millisecond
	scs[2].Live.Changes, scs[2].Live.ChangeGap = 5, 200*time.Millisecond
	budget := Budget{PodRelistRate: 4, PodRelistBurst: 2, PodRelistSpacing: 100 * time.Millisecond, EarlyRelistGap: 250 * time.Millisecond}
	// The scenarios at once, to keep the test short: the figures checked
	// below are bounds that hold however busy the machine.
	rep := newReport(Options{Scenarios: scs})
	rep.Scenarios = make([]ScenarioResult, len(scs))
	errs := make([]error, len(scs))
	var wg sync.WaitGroup
	for i := range scs {
		wg.Go(func() {
			r, err := Run(context.Background(), Options{Scenarios: scs[i : i+1], Budget: budget})
			if errs[i] = err; err == nil {
				rep.Scenarios[i] = r.Scenarios[0]
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Scenarios {
		if len(res.Live) != len(res.Scenario.Live.Runs) || len(res.Targets) == 0 {
			t.Fatalf("%s: %d runs, %d targets", res.Scenario.Name, len(res.Live), len(res.Targets))
		}
		for _, r := range res.Live {
			t.Logf("%s %s: %.0f calls/s %v, CPU %.2fms/s, ListPod %d, skipped %v, deferred %v, early %v, delivered %d, delivery p99 %.1fms",
				res.Scenario.Name, r.Run, r.RuntimeCallsPerSecond, r.RuntimeCalls, r.CPUPerSecondMs, r.PodLists, r.Skipped, r.Deferred, r.EarlyRelists, r.EventsDelivered, r.LatencyP99Ms)
			if r.Relists == 0 || r.RelistErrors != 0 || r.EverUnhealthy || r.CPUPerSecondMs <= 0 || r.RuntimeCallsPerSecond <= 0 {
				t.Errorf("%s %s: %d relists (%d failed), unhealthy %v, CPU %v ms/s, %v calls/s", res.Scenario.Name, r.Run,
					r.Relists, r.RelistErrors, r.EverUnhealthy, r.CPUPerSecondMs, r.RuntimeCallsPerSecond)
			}
			if r.Events != (r.EventsReceived > 0) || r.Events != r.StreamConnected {
				t.Errorf("%s %s: events %v, %d received, stream connected %v", res.Scenario.Name, r.Run, r.Events, r.EventsReceived, r.StreamConnected)
			}
			// Hints make single-pod relists within the budget: the rate over
			// the window, and the burst.
			if limit := int64(budget.PodRelistRate*r.WindowMs/1000) + int64(budget.PodRelistBurst) + 1; r.PodLists > limit {
				t.Errorf("%s %s: %d single-pod relists in %.0fms, over the budget's %d", res.Scenario.Name, r.Run, r.PodLists, r.WindowMs, limit)
			}
		}
	}
	off, started, stopped := rep.Scenarios[0].Live[0], rep.Scenarios[0].Live[1], rep.Scenarios[0].Live[2]
	// Events that name the state the records show cost nothing; events
	// that do not are relisted within the budget, the rest deferred.
	if off.PodLists != 0 || started.PodLists != 0 || started.Skipped["unchanged"] == 0 {
		t.Errorf("STARTED storm: %d single-pod relists (%d events off), skipped %v", started.PodLists, off.PodLists, started.Skipped)
	}
	if stopped.PodLists == 0 || stopped.Deferred["budget"] == 0 {
		t.Errorf("STOPPED storm: %d single-pod relists, deferred %v", stopped.PodLists, stopped.Deferred)
	}
	churnOff, churnOn := rep.Scenarios[1].Live[0], rep.Scenarios[1].Live[1]
	if churnOff.ChurnedPods == 0 || churnOn.ChurnedPods == 0 || churnOff.EventsDelivered == 0 || churnOn.EventsDelivered == 0 {
		t.Errorf("churn: pods changed %d / %d, events delivered %d / %d", churnOff.ChurnedPods, churnOn.ChurnedPods, churnOff.EventsDelivered, churnOn.EventsDelivered)
	}
	isoOff, isoOn := rep.Scenarios[2].Live[0], rep.Scenarios[2].Live[1]
	// A change alone is relisted on its own and delivered by its event,
	// not by the next relist a period (1 s) later.
	if isoOn.Changes != 5 || isoOff.Changes != 3 || isoOn.PodLists < 5 || isoOff.PodLists != 0 || isoOn.LatencyP50Ms >= isoOn.RelistPeriodMs/2 {
		t.Errorf("isolated changes: events on %d, %d single-pod relists, p50 %.1fms (period %.0fms); off %d, %d single-pod relists",
			isoOn.Changes, isoOn.PodLists, isoOn.LatencyP50Ms, isoOn.RelistPeriodMs, isoOff.Changes, isoOff.PodLists)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	// The header's columns are as wide as the figures under them, which
	// depend on the machine's speed (a load that makes a figure one
	// digit wider moves every column after it).
	if header := regexp.MustCompile(`events off +on: STARTED +ratio`); !header.MatchString(text.String()) {
		t.Errorf("text report lacks the header %q:\n%s", header, text.String())
	}
	for _, want := range []string{"runtime calls / second (received)", "pleg CPU / second",
		"pod relist requests deferred: budget", "  delivery p99", "target: runtime calls per second at most 10x events off (on: STOPPED): on ",
		"target: an isolated change delivered with events on: p99 at most 50ms: p99 "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

// TestCompareListStreaming: with CompareListStreaming pleg's column runs
// twice, streamed and unary, on identical nodes with the same changes:
// the same calls and events per relist, and the text report compares them.
func TestCompareListStreaming(t *testing.T) {
	sc := small()
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}, Quick: true, CompareListStreaming: true})
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Scenarios[0]
	s, u := res.PLEG, res.PLEGUnary
	if s == nil || u == nil || res.Kubelet != nil {
		t.Fatalf("runs: streamed %v, unary %v, kubelet %v", s, u, res.Kubelet)
	}
	if s.Algorithm != "pleg (streamed lists)" || u.Algorithm != "pleg (unary lists)" {
		t.Errorf("columns %q and %q", s.Algorithm, u.Algorithm)
	}
	checkRun(t, sc, s, 3)
	checkRun(t, sc, u, 3)
	if !maps.Equal(s.CallsByOp, u.CallsByOp) || s.EventsPerRelist != u.EventsPerRelist || s.EventsPerRelist == 0 {
		t.Errorf("streamed %v calls, %v events per relist; unary %v, %v", s.CallsByOp, s.EventsPerRelist, u.CallsByOp, u.EventsPerRelist)
	}
	// What the runtime served: one listing per relist, through the
	// streaming RPCs or the unary calls.
	if want := map[string]float64{"StreamPodSandboxes": 1, "StreamContainers": 1}; !maps.Equal(s.ListRPCs, want) {
		t.Errorf("streamed run's list RPCs per relist %v, want %v", s.ListRPCs, want)
	}
	if want := map[string]float64{"ListPodSandbox": 1, "ListContainers": 1}; !maps.Equal(u.ListRPCs, want) {
		t.Errorf("unary run's list RPCs per relist %v, want %v", u.ListRPCs, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "pleg's lists streamed (StreamPodSandboxes, StreamContainers) vs unary") ||
		!strings.Contains(b.String(), "StreamContainers 1, StreamPodSandboxes 1") {
		t.Errorf("no comparison in the report:\n%s", b.String())
	}
}

// The watchers scenario's machinery on a small node: pleg's child serves
// the lifecycle API, the watchers each get their snapshot, the reading
// ones receive the churn's events, and the per-watcher targets are
// computed from the runs' RSS.
func TestWatchersScenarioSmall(t *testing.T) {
	scs, err := Lookup("watchers")
	if err != nil {
		t.Fatal(err)
	}
	sc := scs[0]
	sc.Pods, sc.Containers = 6, 2
	live := *sc.Live
	live.Quick = time.Second
	live.Runs = slices.Clone(live.Runs)
	for i := range live.Runs {
		if live.Runs[i].Watchers > 0 {
			live.Runs[i].Watchers = 3
		}
	}
	sc.Live = &live
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	runs := rep.Scenarios[0].Live
	if len(runs) != 4 {
		t.Fatalf("%d runs, want 4", len(runs))
	}
	for i, r := range runs {
		if want := live.Runs[i].Watchers; r.Watchers != want || r.PeakRSSBytes < 1<<20 || r.RSSBytes < 1<<20 {
			t.Errorf("run %q: %d watchers (want %d), RSS %d, peak %d", r.Run, r.Watchers, want, r.RSSBytes, r.PeakRSSBytes)
		}
	}
	if runs[1].WatcherMessages != 0 {
		t.Errorf("idle watchers received %d messages in a quiet window", runs[1].WatcherMessages)
	}
	if runs[3].WatcherMessages < 3 || runs[2].ChurnedPods == 0 || runs[3].ChurnedPods == 0 || runs[0].ChurnedPods != 0 {
		t.Errorf("reading watchers received %d messages; pods churned %d, %d, quiet %d", runs[3].WatcherMessages, runs[2].ChurnedPods, runs[3].ChurnedPods, runs[0].ChurnedPods)
	}
	ts := rep.Scenarios[0].Targets
	if len(ts) != 2 || !ts[0].Checked || !ts[1].Checked || !strings.Contains(ts[0].Figure, "/ 3 =") {
		t.Errorf("targets %+v", ts)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lifecycle API watchers", "pleg's peak RSS (VmHWM)", "an idle watcher costs at most 16 KiB"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

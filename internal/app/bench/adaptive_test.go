package bench

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// smallIdle is 110x5-idle-adaptive scaled down to seconds: 20 pods of 3
// containers, a 100ms period, adaptive up to 400ms, 2s windows.
func smallIdle(t *testing.T) Scenario {
	t.Helper()
	scs, err := Lookup("110x5-idle-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	sc := scs[0]
	sc.Pods, sc.Containers = 20, 3
	live := *sc.Live
	live.RelistPeriod, live.Window = 100*time.Millisecond, 2*time.Second
	live.Runs = slices.Clone(live.Runs)
	for i := range live.Runs {
		if live.Runs[i].MaxRelistPeriod > 0 {
			live.Runs[i].MaxRelistPeriod, live.Runs[i].QuickMaxRelistPeriod = 400*time.Millisecond, 0
		}
	}
	sc.Live = &live
	return sc
}

// checkIdlePLEG checks pleg's two runs of a small idle scenario: the
// adaptive one relisted at its maximum period, a fraction of the fixed
// one's listings; every listing in the window is one of its relists'.
func checkIdlePLEG(t *testing.T, fixed, adaptive *LiveResult) {
	t.Helper()
	for _, r := range []*LiveResult{fixed, adaptive} {
		t.Logf("%s: %d relists in %.0fms, %v calls (%.2f/s), CPU %.2fms/s, runtime CPU %.2fms/s, startup %.0fms",
			r.Run, r.Relists, r.WindowMs, r.RuntimeCalls, r.RuntimeCallsPerSecond, r.CPUPerSecondMs, r.RuntimeCPUPerSecondMs, r.StartupMs)
		if r.Kubelet || r.Relists == 0 || r.RelistErrors != 0 || !r.StreamConnected || r.Unannounced != 0 || r.HealthChecks != 1 || r.Unhealthy != 0 {
			t.Errorf("%s: kubelet %v, %d relists (%d failed), stream connected %v, %v unannounced, unhealthy %d of %d",
				r.Run, r.Kubelet, r.Relists, r.RelistErrors, r.StreamConnected, r.Unannounced, r.Unhealthy, r.HealthChecks)
		}
		if r.CPUPerSecondMs <= 0 || r.RuntimeCPUPerSecondMs <= 0 {
			t.Errorf("%s: CPU %v ms/s, runtime's %v ms/s", r.Run, r.CPUPerSecondMs, r.RuntimeCPUPerSecondMs)
		}
		// The window holds whole relists: each listing the runtime served
		// in it is one (pleg lists through the streaming calls).
		if n := r.RuntimeCalls["StreamPodSandboxes"]; n < int64(r.Relists)-1 || n > int64(r.Relists)+1 || r.RuntimeCalls["StreamContainers"] != n {
			t.Errorf("%s: %d relists, runtime calls %v", r.Run, r.Relists, r.RuntimeCalls)
		}
	}
	if fixed.MaxRelistPeriodMs != 0 || adaptive.MaxRelistPeriodMs != 400 {
		t.Errorf("max relist periods %v and %v", fixed.MaxRelistPeriodMs, adaptive.MaxRelistPeriodMs)
	}
	// The window starts at the maximum period: 400ms between relists,
	// against 100ms.
	if mean := adaptive.WindowMs / float64(adaptive.Relists); mean < 300 {
		t.Errorf("adaptive: mean interval %.0fms, want about 400", mean)
	}
	if mean := fixed.WindowMs / float64(fixed.Relists); mean > 250 {
		t.Errorf("fixed: mean interval %.0fms, want about 100", mean)
	}
	if a, f := listingCallsPerSecond(adaptive), listingCallsPerSecond(fixed); a > 0.6*f {
		t.Errorf("listings per second: adaptive %.2f, fixed %.2f", a, f)
	}
}

// The idle scenarios beside the kubelet's PLEG, on a small node for
// seconds: the kubelet relists on its own clock, every call of each
// relister is counted, and the targets are checked against the kubelet.
func TestIdleAdaptiveBesideKubelet(t *testing.T) {
	bin := kubeletRelist(t)
	sc := smallIdle(t)
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc}, Kubelet: bin})
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Scenarios[0]
	if len(res.Live) != 3 {
		t.Fatalf("%d runs, want 3", len(res.Live))
	}
	k, fixed, adaptive := idleRuns(res.Live)
	if k != res.Live[0] || fixed == nil || adaptive == nil {
		t.Fatalf("runs %+v", res.Live)
	}
	t.Logf("kubelet: %d relists in %.0fms (mean %.2fms), %v calls, CPU %.2fms/s, runtime CPU %.2fms/s",
		k.Relists, k.WindowMs, k.RelistMeanMs, k.RuntimeCalls, k.CPUPerSecondMs, k.RuntimeCPUPerSecondMs)
	// Every 100ms after the end of the last: 2s hold about 20.
	if k.Relists < 8 || k.RelistMeanMs <= 0 || k.CPUPerSecondMs <= 0 || k.RuntimeCPUPerSecondMs <= 0 {
		t.Errorf("kubelet: %d relists, mean %vms, CPU %v ms/s, runtime's %v ms/s", k.Relists, k.RelistMeanMs, k.CPUPerSecondMs, k.RuntimeCPUPerSecondMs)
	}
	// Its relist is its listing on an idle node: two unary calls, nothing
	// else.
	if n := k.RuntimeCalls["ListPodSandbox"]; n < int64(k.Relists)-1 || n > int64(k.Relists)+1 || k.RuntimeCalls["ListContainers"] != n ||
		!slices.Equal(slices.Sorted(maps.Keys(k.RuntimeCalls)), []string{"ListContainers", "ListPodSandbox"}) {
		t.Errorf("kubelet: %d relists, runtime calls %v", k.Relists, k.RuntimeCalls)
	}
	checkIdlePLEG(t, fixed, adaptive)
	ts := res.Targets
	if len(ts) != 2 || !ts[0].Checked || !ts[1].Checked || !strings.Contains(ts[0].Figure, "/ kubelet ") {
		t.Errorf("targets %+v", ts)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== 110x5-idle-adaptive: 20 pods x 3 containers, nothing changed; the kubelet's PLEG started",
		"ratio = run / the kubelet's PLEG", "kubelet, 1s", "relister CPU / second", "runtime (simulator) CPU / second",
		"  listings only", "Idle scenarios run each relister started", "target: runtime calls per second with the adaptive relist at most 0.1 of the kubelet's PLEG's",
		"target: pleg's CPU per second with the adaptive relist at most 0.03 of the kubelet's PLEG's: pleg "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

// The adaptive relist's scenarios without the kubelet, small and at once:
// idle (pleg's runs only), with churn, and isolated changes.
func TestAdaptiveScenarios(t *testing.T) {
	scs, err := Lookup("events-churn-adaptive,events-isolated-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	for i := range scs {
		live := *scs[i].Live
		live.Runs = slices.Clone(live.Runs)
		scs[i].Live = &live
		scs[i].Pods = 40
	}
	churn, iso := scs[0].Live, scs[1].Live
	churn.Window, churn.Churn, scs[0].Latency = 700*time.Millisecond, 5, 2*time.Millisecond
	churn.Runs[1].MaxRelistPeriod = 400 * time.Millisecond
	iso.Changes, iso.ChangeGap = 5, 200*time.Millisecond
	iso.Runs[1].MaxRelistPeriod = 2 * time.Second
	scs = append(scs, smallIdle(t))

	rep := newReport(Options{Scenarios: scs})
	rep.Scenarios = make([]ScenarioResult, len(scs))
	errs := make([]error, len(scs))
	var wg sync.WaitGroup
	for i := range scs {
		wg.Go(func() {
			r, err := Run(context.Background(), Options{Scenarios: scs[i : i+1]})
			if errs[i] = err; err == nil {
				rep.Scenarios[i] = r.Scenarios[0]
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	c0, c1 := rep.Scenarios[0].Live[0], rep.Scenarios[0].Live[1]
	for _, r := range []*LiveResult{c0, c1} {
		t.Logf("churn, %s: %d relists, %.0f calls/s, CPU %.2fms/s, deferred %v, %d pods changed", r.Run, r.Relists, r.RuntimeCallsPerSecond, r.CPUPerSecondMs, r.Deferred, r.ChurnedPods)
		if r.Relists == 0 || r.RelistErrors != 0 || r.ChurnedPods == 0 || r.EventsDelivered == 0 || !r.StreamConnected || r.EverUnhealthy {
			t.Errorf("churn, %s: %d relists (%d failed), %d pods changed, %d events delivered, stream connected %v, unhealthy %v",
				r.Run, r.Relists, r.RelistErrors, r.ChurnedPods, r.EventsDelivered, r.StreamConnected, r.EverUnhealthy)
		}
	}
	if c0.MaxRelistPeriodMs != 0 || c1.MaxRelistPeriodMs != 400 {
		t.Errorf("churn: max relist periods %v, %v", c0.MaxRelistPeriodMs, c1.MaxRelistPeriodMs)
	}
	if ts := rep.Scenarios[0].Targets; len(ts) != 1 || !ts[0].Checked {
		t.Errorf("churn targets %+v", ts)
	}

	i0, i1 := rep.Scenarios[1].Live[0], rep.Scenarios[1].Live[1]
	// Announced changes are delivered by their events, not by a global
	// relist up to 2s away.
	if i0.Changes != 5 || i1.Changes != 5 || i1.PodLists < 5 || i1.LatencyP99Ms >= i1.RelistPeriodMs/2 {
		t.Errorf("isolated, adaptive: %d changes (fixed %d), %d single-pod relists, p99 %.1fms", i1.Changes, i0.Changes, i1.PodLists, i1.LatencyP99Ms)
	}
	if ts := rep.Scenarios[1].Targets; len(ts) != 1 || !ts[0].Checked || !strings.Contains(ts[0].Goal, "adaptive relist") {
		t.Errorf("isolated targets %+v", ts)
	}

	idle := rep.Scenarios[2]
	if len(idle.Live) != 2 {
		t.Fatalf("idle without the kubelet: %d runs, want 2", len(idle.Live))
	}
	checkIdlePLEG(t, idle.Live[0], idle.Live[1])
	if ts := idle.Targets; len(ts) != 2 || ts[0].Checked || ts[1].Checked || ts[0].Figure != errNoKubelet.Error() {
		t.Errorf("idle targets without the kubelet %+v", ts)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"adaptive up to 400ms in run \"adaptive to 1s\"", "target: runtime calls per second with the adaptive relist not higher than without (at most 1.05x", ": on ",
		"target: an isolated change delivered with events on and the adaptive relist: p99 at most 50ms: p99 ",
		"kubelet: not run (--kubelet names the kubelet-relist program)", "needs the kubelet baseline (--kubelet)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/internal/lineproto"
)

// Idle live scenarios (LiveSpec.Idle, issue 37) measure what relisting a
// node where nothing happens costs, over a wall-time window, each relister
// on its own clock: the kubelet's PLEG (the kubelet-relist program,
// GenericPLEG.Start, a relist every period after the end of the last),
// and pleg's started generator with its relist period fixed and with the
// adaptive global relist (LiveRun.MaxRelistPeriod), each with the daemon's
// readiness check beside it (LiveSpec.Readiness). The runtime's calls and
// CPU time are those the simulated runtime counted; the relister's CPU time
// is its process's.
//
// Nothing of the harness runs in a relister's process during the window:
// the window begins right after a global relist ends (pleg: its warm-up
// ends on one, polled before the window; the kubelet: the first relist of
// its started PLEG) and ends right after the first global relist that ends
// once the window's time is up, waited for without polling (pleg: its
// runtime client's listing closes a channel; the kubelet: its PLEG's timer
// reset). A window so holds whole relist periods: a 60 s window with a
// 10 s period would otherwise hold 5 or 6 relists depending on its phase.
// The harness's own calls to the children go over their line protocols,
// not CRI: every CRI call the runtime counted is the relister's.

// kubeletStats is the kubelet-relist program's answer to stats.
type kubeletStats struct {
	NowNs         int64   `json:"nowNs"`
	CPUNs         int64   `json:"cpuNs"`
	Relists       int     `json:"relists"`
	RelistSeconds float64 `json:"relistSeconds"`
}

// runKubeletLive runs a live scenario's kubelet run: the kubelet's PLEG
// started, relisting on its own clock every LiveSpec.RelistPeriod, against
// a fresh simulated runtime.
func runKubeletLive(ctx context.Context, o Options, sc Scenario, run LiveRun) (_ *LiveResult, err error) {
	spec := sc.Live
	if o.Kubelet == "" {
		return nil, errNoKubelet
	}
	if spec.Churn > 0 || spec.Changes > 0 || spec.EventStorm > 0 || sc.HungPods > 0 || spec.API {
		return nil, fmt.Errorf("a kubelet run measures an idle node only")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rt, endpoint, err := startRuntime(ctx, o, simConfig{Pods: sc.Pods, Containers: sc.Containers})
	if err != nil {
		return nil, err
	}
	defer closeWith(rt, &err)
	if sc.Latency > 0 {
		if _, err := rt.Call("latency %v", sc.Latency); err != nil {
			return nil, err
		}
	}
	k, _, err := lineproto.Start("kubelet relister", exec.CommandContext(ctx, o.Kubelet, "--endpoint", endpoint,
		"--runtime-request-timeout", sc.RequestTimeout.String(), "--relist-period", spec.RelistPeriod.String()), nil)
	if err != nil {
		return nil, err
	}
	defer closeWith(k, &err)
	started := time.Now()
	// By hand first, as the bench's kubelet baseline always is: the first
	// relist inspects every pod, one after another.
	warm, err := warmUp(k, sc.Pods)
	if err != nil {
		return nil, err
	}
	if _, err := k.Call("start"); err != nil {
		return nil, err
	}
	// The started PLEG relists at once.
	if _, err := k.Call("next"); err != nil {
		return nil, err
	}
	r := &LiveResult{
		Run: run.Name, Kubelet: true,
		RelistPeriodMs: ms(spec.RelistPeriod), PodInspectionTimeoutMs: -1,
		RequestTimeoutMs: ms(sc.RequestTimeout), RelistThresholdMs: ms(3 * time.Minute), MaxParallelInspections: 1,
		StartupMs: ms(time.Since(started)), WarmupRelists: warm + 1,
		CPUPerSecondMs: -1, RuntimeCPUPerSecondMs: -1,
		ListP50Ms: -1, ListP99Ms: -1, RelistP50Ms: -1, RelistP99Ms: -1, RelistMaxMs: -1,
	}
	s0, err := snapshot(rt, "", false)
	if err != nil {
		return nil, err
	}
	var k0, k1 kubeletStats
	if err := k.CallJSON(&k0, "stats"); err != nil {
		return nil, err
	}
	if err := sleep(ctx, spec.window(o.Quick)); err != nil {
		return nil, err
	}
	if spec.Idle {
		if _, err := k.Call("next"); err != nil {
			return nil, err
		}
	}
	if err := k.CallJSON(&k1, "stats"); err != nil {
		return nil, err
	}
	s1, err := snapshot(rt, "", false)
	if err != nil {
		return nil, err
	}
	r.WindowMs = ms(time.Duration(k1.NowNs - k0.NowNs))
	seconds := r.WindowMs / 1000
	r.Relists = k1.Relists - k0.Relists
	if r.Relists > 0 {
		r.RelistMeanMs = (k1.RelistSeconds - k0.RelistSeconds) * 1000 / float64(r.Relists)
	}
	r.RuntimeCalls = delta(s0.calls, s1.calls)
	for _, v := range r.RuntimeCalls {
		r.RuntimeCallsPerSecond += float64(v) / seconds
	}
	if cpuMeasured {
		r.CPUPerSecondMs = ms(time.Duration(k1.CPUNs-k0.CPUNs)) / seconds
		r.RuntimeCPUPerSecondMs = ms(time.Duration(s1.cpu-s0.cpu)) / seconds
	}
	return r, nil
}

// idleRuns returns the kubelet's run (nil: none), pleg's with a fixed
// period and pleg's adaptive one of an idle scenario.
func idleRuns(runs []*LiveResult) (kubelet, fixed, adaptive *LiveResult) {
	for _, r := range runs {
		switch {
		case r.Kubelet:
			kubelet = r
		case r.MaxRelistPeriodMs > r.RelistPeriodMs:
			adaptive = r
		default:
			fixed = r
		}
	}
	return kubelet, fixed, adaptive
}

// listingCallsPerSecond counts the runtime's list calls (unary and
// streamed) per second of a run's window.
func listingCallsPerSecond(r *LiveResult) float64 {
	var n int64
	for _, m := range listMethods {
		n += r.RuntimeCalls[m]
	}
	return float64(n) / (r.WindowMs / 1000)
}

// evaluateIdle checks issue 37's goals: pleg's adaptive relist against the
// kubelet's PLEG, runtime calls and pleg's CPU per second.
func evaluateIdle(runs []*LiveResult) []Target {
	k, fixed, a := idleRuns(runs)
	calls := Target{Goal: "runtime calls per second with the adaptive relist at most 0.1 of the kubelet's PLEG's (every call counted: pleg's readiness Status too)"}
	cpu := Target{Goal: "pleg's CPU per second with the adaptive relist at most 0.03 of the kubelet's PLEG's"}
	switch {
	case a == nil:
		calls.Figure, cpu.Figure = "no adaptive run", "no adaptive run"
		return []Target{calls, cpu}
	case k == nil:
		calls.Figure, cpu.Figure = errNoKubelet.Error(), errNoKubelet.Error()
		return []Target{calls, cpu}
	}
	also := func(f func(*LiveResult) float64) string {
		if fixed == nil || f(k) <= 0 {
			return ""
		}
		return fmt.Sprintf("; period fixed: %.3f", f(fixed)/f(k))
	}
	ratio := func(t *Target, limit float64, format func(float64) string, f func(*LiveResult) float64) {
		p, kv := f(a), f(k)
		if kv <= 0 || p < 0 {
			t.Figure = "not measured"
			return
		}
		r := p / kv
		t.Checked, t.Met = true, r <= limit
		t.Figure = fmt.Sprintf("pleg %s / kubelet %s = %.3f %s %g%s", format(p), format(kv), r, cmp(t.Met), limit, also(f))
	}
	ratio(&calls, 0.1, fmtCount, func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond })
	if calls.Checked {
		lists, status := listingCallsPerSecond(a), float64(a.RuntimeCalls["Status"])/(a.WindowMs/1000)
		calls.Figure += fmt.Sprintf("; of pleg's, listings %s (%.3f of the kubelet's), readiness Status %s",
			fmtCount(lists), lists/k.RuntimeCallsPerSecond, fmtCount(status))
	}
	ratio(&cpu, 0.03, fmtMs, func(r *LiveResult) float64 { return r.CPUPerSecondMs })
	if cpu.Checked && k.RuntimeCPUPerSecondMs > 0 && a.RuntimeCPUPerSecondMs >= 0 {
		cpu.Figure += fmt.Sprintf("; the runtime's CPU serving them: %.3f", a.RuntimeCPUPerSecondMs/k.RuntimeCPUPerSecondMs)
	}
	return []Target{calls, cpu}
}

// hasKubeletRun reports whether a live scenario has a kubelet run.
func hasKubeletRun(l *LiveSpec) bool {
	return slices.ContainsFunc(l.Runs, func(r LiveRun) bool { return r.Kubelet })
}

// writeIdle writes the table of an idle scenario: one column per run, and
// each run after the first beside its ratio to the first (the kubelet's,
// when it ran).
func writeIdle(w io.Writer, s ScenarioResult) {
	runs := s.Live
	fmt.Fprintf(w, "\n== %s: %s\n", s.Scenario.Name, s.Description)
	fmt.Fprintln(w, "   idle: each relister started on its own clock; the window begins and ends right after a global relist ends (whole periods), nothing of the bench runs in the relister's process in it")
	var parts []string
	for _, r := range runs {
		parts = append(parts, fmt.Sprintf("%s %s (startup %s, not measured)", r.Run, fmtMs(r.WindowMs), fmtMs(r.StartupMs)))
	}
	fmt.Fprintf(w, "   windows: %s\n", strings.Join(parts, "; "))
	if !slices.ContainsFunc(runs, func(r *LiveResult) bool { return r.Kubelet }) {
		fmt.Fprintln(w, "   kubelet: not run (--kubelet names the kubelet-relist program); ratio = run / the first run")
	} else {
		fmt.Fprintln(w, "   ratio = run / the kubelet's PLEG (kubelet v1.37.2's GenericPLEG, its runtime manager and CRI client)")
	}
	f := liveFigures(runs)
	get := func(g func(*LiveResult) float64) []float64 { return each(runs, g) }
	perSecond := func(m string) func(*LiveResult) float64 {
		return func(r *LiveResult) float64 { return float64(r.RuntimeCalls[m]) / (r.WindowMs / 1000) }
	}
	f.row("relist period (adaptive: its maximum)", fmtMs, false, get(func(r *LiveResult) float64 { return max(r.RelistPeriodMs, r.MaxRelistPeriodMs) }))
	f.row("global relists in the window", fmtCount, true, get(func(r *LiveResult) float64 { return float64(r.Relists) }))
	f.row("  mean interval (window / relists)", fmtMs, true, get(func(r *LiveResult) float64 {
		if r.Relists == 0 {
			return -1
		}
		return r.WindowMs / float64(r.Relists)
	}))
	f.row("  mean duration", fmtMs, true, get(func(r *LiveResult) float64 { return r.RelistMeanMs }))
	f.row("runtime calls / second (received)", fmtCount, true, get(func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond }))
	methods := map[string]bool{}
	for _, r := range runs {
		for m := range r.RuntimeCalls {
			methods[m] = true
		}
	}
	for _, m := range slices.Sorted(maps.Keys(methods)) {
		f.row("  "+m, fmtCount, true, get(perSecond(m)))
	}
	f.row("  listings only", fmtCount, true, get(listingCallsPerSecond))
	f.row("relister CPU / second", fmtMs, true, get(func(r *LiveResult) float64 { return r.CPUPerSecondMs }))
	f.row("runtime (simulator) CPU / second", fmtMs, true, get(func(r *LiveResult) float64 { return r.RuntimeCPUPerSecondMs }))
	texts := func(g func(*LiveResult) string) []string {
		var out []string
		for i, r := range runs {
			out = append(out, g(r))
			if i > 0 {
				out = append(out, "-")
			}
		}
		return out
	}
	f.text("event stream connected throughout", texts(func(r *LiveResult) string {
		if !r.Events {
			return "off"
		}
		return yesNo(r.StreamConnected)
	})...)
	f.text("unannounced changes found", texts(func(r *LiveResult) string {
		if r.Kubelet {
			return "-"
		}
		return fmtCount(r.Unannounced)
	})...)
	f.text("Healthy() at the window's end", texts(func(r *LiveResult) string {
		if r.Kubelet {
			return "-"
		}
		return yesNo(r.HealthChecks > 0 && r.Unhealthy == 0)
	})...)
	f.t.write(w, "   ")
	for _, r := range runs {
		if !r.Kubelet && r.Unhealthy > 0 {
			fmt.Fprintf(w, "   WARNING: %s: unhealthy %s\n", r.Run, r.FirstUnhealthy)
		}
		if r.RelistErrors > 0 {
			fmt.Fprintf(w, "   WARNING: %s: %d relists failed to list\n", r.Run, r.RelistErrors)
		}
	}
	writeTargets(w, s.Targets)
}

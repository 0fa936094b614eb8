package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/lineproto"
	"github.com/podlifecycle/pleg/internal/stats"
)

// Live scenarios run a started generator (Generator.Start: the real clock,
// the relist goroutine, the runtime's event stream on or off) against the
// simulated runtime, and measure a window of its life: how many global
// relists, how far apart, how long, whether Healthy ever said false, what
// the generator asked the runtime, its CPU time, and how soon a change was
// delivered. Unlike the relists driven by hand, they see the single-pod
// relists that runtime events trigger, which run beside the global
// relists.
//
// The kubelet has no single-pod relists (its PLEG ignores runtime events
// unless the Evented PLEG feature is on, and that one relists no pod on its
// own), so these scenarios have no kubelet baseline; their baseline is the
// same generator with the runtime's events off.

// LiveResult holds the figures of one live run. Times are in milliseconds.
type LiveResult struct {
	Run    string `json:"run"`
	Events bool   `json:"events"`
	// Kubelet: the run is the kubelet's own PLEG (LiveRun.Kubelet), of
	// which only the window, the relists, their mean duration, the CPU
	// and the runtime's figures are measured.
	Kubelet bool `json:"kubelet,omitempty"`

	WindowMs       float64 `json:"windowMs"`
	RelistPeriodMs float64 `json:"relistPeriodMs"`
	// MaxRelistPeriodMs is pleg's MaxRelistPeriod (0: not adaptive).
	MaxRelistPeriodMs      float64 `json:"maxRelistPeriodMs,omitempty"`
	PodInspectionTimeoutMs float64 `json:"podInspectionTimeoutMs"`
	RequestTimeoutMs       float64 `json:"runtimeRequestTimeoutMs"`
	RelistThresholdMs      float64 `json:"relistThresholdMs"`
	MaxParallelInspections int     `json:"maxParallelInspections"`
	// StartupMs is the time from Start to the end of the warm-up (see
	// plegChild.start), not measured; WarmupRelists the relists in it.
	StartupMs     float64 `json:"startupMs"`
	WarmupRelists int     `json:"warmupRelists"`

	// Relists counts the global relists that started in the window;
	// RelistErrors those of them whose listing failed.
	Relists      int `json:"relists"`
	RelistErrors int `json:"relistErrors"`
	// Interval figures: the time from one global relist's start to the
	// next, the window's edges included (liveIntervals).
	Intervals     int     `json:"intervals"`
	IntervalP50Ms float64 `json:"intervalP50Ms"`
	IntervalP99Ms float64 `json:"intervalP99Ms"`
	IntervalMaxMs float64 `json:"intervalMaxMs"`
	// Relist duration figures (RelistStat.Duration: the global relist's
	// span) of the window's relists.
	RelistMeanMs float64 `json:"relistMeanMs"`
	RelistP50Ms  float64 `json:"relistP50Ms"`
	RelistP99Ms  float64 `json:"relistP99Ms"`
	RelistMaxMs  float64 `json:"relistMaxMs"`
	// ListP50Ms and ListP99Ms are the durations of the global listings
	// (ListPodSandbox then ListContainers) that started in the window: one
	// list round trip.
	ListP50Ms float64 `json:"listP50Ms"`
	ListP99Ms float64 `json:"listP99Ms"`

	// HealthChecks counts the Healthy calls (every healthEvery), Unhealthy
	// those that said false.
	HealthChecks    int    `json:"healthChecks"`
	Unhealthy       int    `json:"unhealthyChecks"`
	FirstUnhealthy  string `json:"firstUnhealthy,omitempty"`
	EverUnhealthy   bool   `json:"everUnhealthy"`
	StreamConnected bool   `json:"eventStreamConnectedThroughout"`

	// Runtime events in the window: emitted by the simulated runtime,
	// received by the generator, dropped by the runtime because the
	// generator's stream fell behind; and the generator's own events
	// delivered.
	EventsEmitted   int64 `json:"runtimeEventsEmitted"`
	EventsReceived  int64 `json:"runtimeEventsReceived"`
	EventsDropped   int64 `json:"runtimeEventsDroppedFull"`
	EventsDelivered int64 `json:"eventsDelivered"`
	// The generator's calls in the window, from its runtime client: list
	// calls filtered to one pod (ListPod) and status fetches
	// (ItemStatuses, the global relists' included).
	PodLists    int64 `json:"podListCalls"`
	PodStatuses int64 `json:"podStatusCalls"`
	// RuntimeCalls are the calls the simulated runtime received in the
	// window, per CRI method; RuntimeCallsPerSecond all of them per second
	// of the window.
	RuntimeCalls          map[string]int64 `json:"runtimeCalls"`
	RuntimeCallsPerSecond float64          `json:"runtimeCallsPerSecond"`
	// Skipped counts pleg_pod_relist_requests_skipped_total by reason,
	// Deferred pleg_pod_relist_requests_deferred_total by reason;
	// EarlyRelists pleg_early_relists_total; QueueDropped
	// pleg_pod_relist_requests_dropped_total; InspectionTimeouts
	// pleg_pod_inspection_timeouts_total; Unannounced
	// pleg_unannounced_changes_total.
	Skipped            map[string]float64 `json:"podRelistsSkipped"`
	Deferred           map[string]float64 `json:"podRelistsDeferred"`
	EarlyRelists       float64            `json:"earlyRelists"`
	QueueDropped       float64            `json:"podRelistsQueueDropped"`
	InspectionTimeouts float64            `json:"podInspectionTimeouts"`
	Unannounced        float64            `json:"unannouncedChanges"`
	// CPUPerSecondMs is the generator's process's CPU time (user +
	// system) per second of the window, RuntimeCPUPerSecondMs the
	// simulated runtime's; -1 where not measured.
	CPUPerSecondMs        float64 `json:"cpuPerSecondMs"`
	RuntimeCPUPerSecondMs float64 `json:"runtimeCpuPerSecondMs"`
	// Watchers is the number of lifecycle API watchers open through the
	// window (LiveRun.Watchers); WatcherMessages the messages they
	// received in it, all of them.
	Watchers        int   `json:"watchers,omitempty"`
	WatcherMessages int64 `json:"watcherMessages,omitempty"`
	// RSSBytes is the generator's process's resident set size at the
	// window's end (VmRSS), PeakRSSBytes its peak (VmHWM) then (0: not
	// measured: only in scenarios with LiveSpec.API).
	RSSBytes     int64 `json:"rssBytes"`
	PeakRSSBytes int64 `json:"peakRssBytes"`
	// Goroutines is the number of the generator's process's goroutines
	// at the window's end.
	Goroutines int `json:"goroutines"`
	// StackBytes is the memory of their stacks then (StackInuse),
	// HeapInuseBytes the heap's spans in use (HeapInuse).
	StackBytes     int64 `json:"stackBytes"`
	HeapInuseBytes int64 `json:"heapInuseBytes"`
	// Changes counts the changes made one at a time (LiveSpec.Changes),
	// and their delivery: from the change in the runtime to the first
	// event about the pod delivered to the generator's Watch channel.
	Changes      int     `json:"changes,omitempty"`
	LatencyP50Ms float64 `json:"deliveryP50Ms,omitempty"`
	LatencyP99Ms float64 `json:"deliveryP99Ms,omitempty"`
	LatencyMaxMs float64 `json:"deliveryMaxMs,omitempty"`
	// ChurnedPods counts the pods the churn changed in the window.
	ChurnedPods int64 `json:"churnedPods,omitempty"`

	// The hung pod (none: ""): the runtime calls the simulated runtime
	// received for it, per CRI method, in the window and over the whole
	// run, and the generator's ListPod and status calls for it in the
	// window.
	HungPod           string           `json:"hungPod,omitempty"`
	HungCallsWindow   map[string]int64 `json:"hungPodCallsWindow,omitempty"`
	HungCallsRun      map[string]int64 `json:"hungPodCallsRun,omitempty"`
	HungPodLists      int64            `json:"hungPodListCalls"`
	HungPodStatuses   int64            `json:"hungPodStatusCalls"`
	HungPodCallsTotal int64            `json:"hungPodRuntimeCallsWindow"`
}

// runtimeSnapshot holds the simulated runtime's counters at one edge of a
// window.
type runtimeSnapshot struct {
	events    sim.EventStats
	calls     map[string]int64
	hungCalls map[string]int64
	cpu       int64
	churned   int64
}

func snapshot(r *lineproto.Child, hung string, churn bool) (s runtimeSnapshot, err error) {
	if err = r.CallJSON(&s.events, "eventstats"); err != nil {
		return s, err
	}
	if err = r.CallJSON(&s.calls, "calls"); err != nil {
		return s, err
	}
	if hung != "" {
		if err = r.CallJSON(&s.hungCalls, "podcalls %s", hung); err != nil {
			return s, err
		}
	}
	if churn {
		if s.churned, err = r.CallInt("churned"); err != nil {
			return s, err
		}
	}
	s.cpu, err = r.CallInt("cpu")
	return s, err
}

// runLive runs one run of a live scenario, against a fresh simulated
// runtime and generator.
func runLive(ctx context.Context, o Options, sc Scenario, run LiveRun) (_ *LiveResult, err error) {
	if run.Kubelet {
		return runKubeletLive(ctx, o, sc, run)
	}
	spec := sc.Live
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rt, endpoint, err := startRuntime(ctx, o, simConfig{Pods: sc.Pods, Containers: sc.Containers, EventBuffer: 10000})
	if err != nil {
		return nil, err
	}
	defer closeWith(rt, &err)
	if sc.Latency > 0 {
		if _, err := rt.Call("latency %v", sc.Latency); err != nil {
			return nil, err
		}
	}
	col := plegColumn(sc, o.MaxParallelInspections)
	gen, err := startPLEG(ctx, o, plegConfig{
		Endpoint: endpoint, RequestTimeout: sc.RequestTimeout, Parallel: col.parallel,
		InspectionTimeout: col.inspectionTimeout, RelistPeriod: spec.RelistPeriod, RelistThreshold: sc.RelistThreshold,
		MaxRelistPeriod: run.maxPeriod(o.Quick), Readiness: spec.Readiness,
		Events: run.Events, Budget: o.Budget,
	})
	if err != nil {
		return nil, err
	}
	defer closeWith(gen, &err)
	var start liveStart
	if err := gen.CallJSON(&start, "start"); err != nil {
		return nil, err
	}

	// The faults start with the window. A storm started before the
	// generator streamed while the first relist inspected every pod: under
	// load the generator then received the window's events seconds late,
	// each older than the last global relist and so skipped as stale. The
	// pod hangs after the first relist inspected it, so that the
	// generator's first call for it is a single-pod relist's filtered
	// list, which a runtime event triggers. (Had it hung before, the first
	// relist's status call would still be out, abandoned, and no filtered
	// list call would be made for it.)
	if spec.EventStorm > 0 {
		if _, err := rt.Call("storm %d %s", spec.EventStorm, run.Storm); err != nil {
			return nil, err
		}
	}
	var hung string
	if sc.HungPods > 0 {
		lists := ""
		if spec.HangLists {
			lists = " lists"
		}
		if hung, err = rt.Call("hang-live%s", lists); err != nil {
			return nil, err
		}
		if _, err := gen.Call("hung %s", hung); err != nil {
			return nil, err
		}
		if spec.HungPodEvents > 0 {
			if _, err := rt.Call("emit %s %v", hung, spec.HungPodEvents); err != nil {
				return nil, err
			}
		}
	}
	var ws *watchers
	if spec.API {
		path, err := gen.Call("api")
		if err != nil {
			return nil, err
		}
		if run.Watchers > 0 {
			if ws, err = openWatchers(ctx, path, run.Watchers); err != nil {
				return nil, err
			}
			defer func() {
				if cerr := ws.close(); err == nil {
					err = cerr
				}
			}()
		}
	}
	churn := spec.Churn > 0 && !run.Quiet
	if churn {
		if _, err := rt.Call("churn %d %v", spec.Churn, spec.ChurnEvery); err != nil {
			return nil, err
		}
	}

	s0, err := snapshot(rt, hung, churn)
	if err != nil {
		return nil, err
	}
	var msgs0 int64
	if ws != nil {
		msgs0 = ws.msgs.Load()
	}
	begin := "begin"
	if spec.Idle {
		begin = "begin idle"
	}
	if _, err := gen.Call("%s", begin); err != nil {
		return nil, err
	}
	var lat []time.Duration
	if n := spec.changes(o.Quick, run.Events); spec.Changes > 0 {
		for range n {
			d, err := deliverOne(rt, gen)
			if err != nil {
				return nil, err
			}
			lat = append(lat, d)
			if err := sleep(ctx, spec.ChangeGap); err != nil {
				return nil, err
			}
		}
	} else if err := sleep(ctx, spec.window(o.Quick)); err != nil {
		return nil, err
	}
	if spec.Idle {
		if _, err := gen.Call("next"); err != nil {
			return nil, err
		}
	}
	var r LiveResult
	if err := gen.CallJSON(&r, "end"); err != nil {
		return nil, err
	}
	if ws != nil {
		r.Watchers, r.WatcherMessages = run.Watchers, ws.msgs.Load()-msgs0
		if err := ws.failed(); err != nil {
			return nil, err
		}
	}
	// Only where the watchers are measured: a pleg child of a build
	// before 2026-11-28 (Options.PLEGExecutable) knows no rssnow.
	if spec.API {
		if r.RSSBytes, err = gen.CallInt("rssnow"); err != nil {
			return nil, err
		}
		if r.PeakRSSBytes, err = gen.CallInt("rss"); err != nil {
			return nil, err
		}
	}
	s1, err := snapshot(rt, hung, churn)
	if err != nil {
		return nil, err
	}

	r.Run, r.Events = run.Name, run.Events
	r.StartupMs, r.WarmupRelists = start.StartupMs, start.WarmupRelists
	r.EventsEmitted = s1.events.Emitted - s0.events.Emitted
	r.EventsDropped = s1.events.DroppedFull - s0.events.DroppedFull
	r.RuntimeCalls = delta(s0.calls, s1.calls)
	seconds := r.WindowMs / 1000
	for _, v := range r.RuntimeCalls {
		r.RuntimeCallsPerSecond += float64(v) / seconds
	}
	r.RuntimeCPUPerSecondMs = -1
	if cpuMeasured {
		r.RuntimeCPUPerSecondMs = ms(time.Duration(s1.cpu-s0.cpu)) / seconds
	}
	r.ChurnedPods = s1.churned - s0.churned
	if len(lat) > 0 {
		r.Changes = len(lat)
		r.LatencyP50Ms = ms(stats.Percentile(lat, 0.50))
		r.LatencyP99Ms = ms(stats.Percentile(lat, 0.99))
		r.LatencyMaxMs = ms(stats.Percentile(lat, 1))
	}
	if hung != "" {
		r.HungPod = hung
		r.HungCallsRun = s1.hungCalls
		r.HungCallsWindow = delta(s0.hungCalls, s1.hungCalls)
		for _, v := range r.HungCallsWindow {
			r.HungPodCallsTotal += v
		}
	}
	return &r, nil
}

// deliverOne changes one pod and returns how long the generator took to
// deliver an event about it.
func deliverOne(rt, gen *lineproto.Child) (time.Duration, error) {
	changed, err := rt.Call("change-one")
	if err != nil {
		return 0, err
	}
	uid, at, _ := strings.Cut(changed, " ")
	t0, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("change-one: %q: %w", changed, err)
	}
	t1, err := gen.CallInt("await %s %d", uid, t0)
	if err != nil {
		return 0, err
	}
	return time.Duration(t1 - t0), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// evaluateLive checks the targets of a live scenario.
func evaluateLive(sc Scenario, runs []*LiveResult) []Target {
	if sc.Live != nil && sc.Live.Idle {
		return evaluateIdle(runs)
	}
	switch sc.Name {
	case "events-unchanged":
		var ts []Target
		for _, on := range runs[1:] {
			ts = append(ts,
				liveRatio("runtime calls per second at most 10x events off ("+on.Run+")", runs[0], on, 10, fmtCount,
					func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond }),
				liveRatio("pleg's CPU per second at most 10x events off ("+on.Run+")", runs[0], on, 10, fmtMs,
					func(r *LiveResult) float64 { return r.CPUPerSecondMs }))
		}
		return ts
	case "events-churn":
		off, on := runs[0], runs[1]
		return []Target{
			liveRatio("the global relist's span (p50) at most 1.1x events off", off, on, 1.1, fmtMs,
				func(r *LiveResult) float64 { return r.RelistP50Ms }),
			liveRatio("runtime calls per second at most 1.5x events off", off, on, 1.5, fmtCount,
				func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond }),
		}
	case "watchers":
		return []Target{
			perWatcher("an idle watcher costs at most 16 KiB of pleg's peak RSS", runs[0], runs[1], 16<<10),
			perWatcher("a reading watcher costs at most 32 KiB of pleg's peak RSS", runs[2], runs[3], 32<<10),
		}
	case "events-churn-adaptive":
		// Not higher: three runs of one configuration differed by up to
		// 5 % (463 to 486 calls a second, 2026-11-29).
		return []Target{liveRatio("runtime calls per second with the adaptive relist not higher than without (at most 1.05x: runs of one configuration differ by up to 5%)", runs[0], runs[1], 1.05, fmtCount,
			func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond })}
	case "events-isolated", "events-isolated-adaptive":
		on := runs[len(runs)-1]
		goal, base := "an isolated change delivered with events on: p99 at most 50ms", "events off"
		if sc.Name == "events-isolated-adaptive" {
			goal, base = "an isolated change delivered with events on and the adaptive relist: p99 at most 50ms", "period fixed"
		}
		return []Target{{
			Goal: goal, Checked: on.Changes > 0,
			Met:    on.Changes > 0 && on.LatencyP99Ms <= 50,
			Figure: fmt.Sprintf("p99 %s over %d changes (%s: %s)", fmtMs(on.LatencyP99Ms), on.Changes, base, fmtMs(runs[0].LatencyP99Ms)),
		}}
	}
	r := runs[0]
	// Relists come every period.
	var bound float64
	var how string
	if sc.HungPods > 0 {
		bound = r.RelistPeriodMs + r.PodInspectionTimeoutMs + r.ListP99Ms
		how = fmt.Sprintf("period %s + pod inspection timeout %s + list p99 %s", fmtMs(r.RelistPeriodMs), fmtMs(r.PodInspectionTimeoutMs), fmtMs(r.ListP99Ms))
	} else {
		bound = 2*r.RelistPeriodMs + r.RelistP99Ms
		how = fmt.Sprintf("2 x period %s + relist p99 %s", fmtMs(r.RelistPeriodMs), fmtMs(r.RelistP99Ms))
	}
	met := r.Relists > 0 && r.IntervalP99Ms <= bound
	intervals := Target{
		Goal:    "global relists keep coming every period: relist interval p99 (start to start, the window's edges included) at most " + how,
		Checked: true, Met: met,
		Figure: fmt.Sprintf("p99 %s %s %s; %d relists in %s, longest interval %s",
			fmtMs(r.IntervalP99Ms), cmp(met), fmtMs(bound), r.Relists, fmtMs(r.WindowMs), fmtMs(r.IntervalMaxMs)),
	}
	// A relist waits for no pod longer than the inspection timeout.
	rb := r.PodInspectionTimeoutMs + r.ListP99Ms
	met = r.Relists > 0 && r.RelistP99Ms <= rb
	span := Target{
		Goal:    "relist p99 at most the pod inspection timeout plus one list round trip",
		Checked: r.Relists > 0, Met: met,
		Figure: fmt.Sprintf("p99 %s %s %s + %s (list p99) = %s", fmtMs(r.RelistP99Ms), cmp(met), fmtMs(r.PodInspectionTimeoutMs), fmtMs(r.ListP99Ms), fmtMs(rb)),
	}
	if r.Relists == 0 {
		span.Figure = "no relist in the window"
	}
	first := ""
	if r.FirstUnhealthy != "" {
		first = "; first: " + r.FirstUnhealthy
	}
	health := Target{
		Goal:    "Healthy() never false",
		Checked: true, Met: !r.EverUnhealthy && r.HealthChecks > 0,
		Figure: fmt.Sprintf("false %d of %d checks (every %v, relist threshold %s)%s",
			r.Unhealthy, r.HealthChecks, healthEvery, fmtMs(r.RelistThresholdMs), first),
	}
	return []Target{intervals, span, health}
}

// perWatcher checks the peak RSS the watchers of run with add beside
// those of none, per watcher, against limit bytes.
func perWatcher(goal string, none, with *LiveResult, limit float64) Target {
	t := Target{Goal: goal}
	if with.Watchers == 0 || none.PeakRSSBytes <= 0 || with.PeakRSSBytes <= 0 {
		t.Figure = "not measured"
		return t
	}
	per := float64(with.PeakRSSBytes-none.PeakRSSBytes) / float64(with.Watchers)
	t.Checked, t.Met = true, per <= limit
	t.Figure = fmt.Sprintf("(%s - %s) / %d = %s %s %s (at the window's end, VmRSS: %s per watcher)",
		fmtBytes(float64(with.PeakRSSBytes)), fmtBytes(float64(none.PeakRSSBytes)), with.Watchers, fmtBytes(per), cmp(t.Met), fmtBytes(limit),
		fmtBytes(float64(with.RSSBytes-none.RSSBytes)/float64(with.Watchers)))
	return t
}

// liveRatio checks f(on) <= limit x f(off).
func liveRatio(goal string, off, on *LiveResult, limit float64, format func(float64) string, f func(*LiveResult) float64) Target {
	t := Target{Goal: goal}
	o, n := f(off), f(on)
	if o <= 0 || n < 0 {
		t.Figure = fmt.Sprintf("events off %s, on %s: not measured", format(o), format(n))
		return t
	}
	r := n / o
	t.Checked, t.Met = true, r <= limit
	t.Figure = fmt.Sprintf("on %s / off %s = %.2fx %s %gx", format(n), format(o), r, cmp(t.Met), limit)
	return t
}

// cmp is how a figure compares with its bound.
func cmp(met bool) string {
	if met {
		return "<="
	}
	return ">"
}

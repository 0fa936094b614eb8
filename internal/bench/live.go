package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/stats"
	"github.com/podlifecycle/pleg/metrics"
)

// Live scenarios run a started generator (Generator.Start: the real clock,
// the relist goroutine, the runtime's event stream on) against the
// simulated runtime for a fixed wall time, and measure what the relist
// goroutine did meanwhile: how many global relists, how far apart, how
// long, whether Healthy ever said false, and what the generator asked the
// runtime about the hung pod. Unlike the relists driven by hand, they see
// the single-pod relists that runtime events trigger, which run beside the
// global relists.
//
// The kubelet has no single-pod relists (its PLEG ignores runtime events
// unless the Evented PLEG feature is on, and that one relists no pod on its
// own), so these scenarios have no kubelet baseline.

// healthEvery is how often a live run calls Healthy (and reads the recent
// relists, which the generator keeps 300 of).
const healthEvery = 50 * time.Millisecond

// liveStartLimit bounds the wait for the generator's first global
// relists and the event stream's connection, before the measured window.
const liveStartLimit = time.Minute

// liveWarmupRelists is the number of global relists before the window.
const liveWarmupRelists = 2

// LiveResult holds the figures of a live run. Times are in milliseconds.
type LiveResult struct {
	WindowMs               float64 `json:"windowMs"`
	RelistPeriodMs         float64 `json:"relistPeriodMs"`
	PodInspectionTimeoutMs float64 `json:"podInspectionTimeoutMs"`
	RequestTimeoutMs       float64 `json:"runtimeRequestTimeoutMs"`
	RelistThresholdMs      float64 `json:"relistThresholdMs"`
	MaxParallelInspections int     `json:"maxParallelInspections"`
	// StartupMs is the time from Start to the end of the warm-up: at
	// least liveWarmupRelists global relists, the last of which inspected
	// no pod, with the event stream connected. Not measured.
	// WarmupRelists is the number of those relists.
	StartupMs     float64 `json:"startupMs"`
	WarmupRelists int     `json:"warmupRelists"`

	// Relists counts the global relists that started in the window;
	// RelistErrors those of them whose listing failed.
	Relists      int `json:"relists"`
	RelistErrors int `json:"relistErrors"`
	// Interval figures: the time from one global relist's start to the
	// next. The window's edges count as intervals too (from the window's
	// start to the first relist start, from the last one to the window's
	// end), so a relist goroutine that stops relisting shows as a long
	// interval rather than as none.
	Intervals     int     `json:"intervals"`
	IntervalP50Ms float64 `json:"intervalP50Ms"`
	IntervalP99Ms float64 `json:"intervalP99Ms"`
	IntervalMaxMs float64 `json:"intervalMaxMs"`
	// Relist duration figures (RelistStat.Duration) of the window's
	// relists.
	RelistP50Ms float64 `json:"relistP50Ms"`
	RelistP99Ms float64 `json:"relistP99Ms"`
	RelistMaxMs float64 `json:"relistMaxMs"`
	// ListP50Ms and ListP99Ms are the durations of the global listings
	// (ListPodSandbox then ListContainers) that started in the window: one
	// list round trip.
	ListP50Ms float64 `json:"listP50Ms"`
	ListP99Ms float64 `json:"listP99Ms"`

	// HealthChecks counts the Healthy calls (every 50ms), Unhealthy those
	// that said false.
	HealthChecks    int    `json:"healthChecks"`
	Unhealthy       int    `json:"unhealthyChecks"`
	FirstUnhealthy  string `json:"firstUnhealthy,omitempty"`
	EverUnhealthy   bool   `json:"everUnhealthy"`
	StreamConnected bool   `json:"eventStreamConnectedThroughout"`

	// Runtime events in the window: emitted by the simulated runtime,
	// received by the generator, dropped by the runtime because the
	// generator's stream fell behind.
	EventsEmitted  int64 `json:"runtimeEventsEmitted"`
	EventsReceived int64 `json:"runtimeEventsReceived"`
	EventsDropped  int64 `json:"runtimeEventsDroppedFull"`
	// Single-pod relist work in the window, from the generator's runtime
	// client: list calls filtered to one pod (ListPod) and pod status
	// fetches (PodStatus, including the global relists' inspections).
	PodLists    int64 `json:"podListCalls"`
	PodStatuses int64 `json:"podStatusCalls"`
	// Skipped counts pleg_pod_relist_requests_skipped_total by reason;
	// QueueDropped pleg_pod_relist_requests_dropped_total;
	// InspectionTimeouts pleg_pod_inspection_timeouts_total.
	Skipped            map[string]float64 `json:"podRelistsSkipped"`
	QueueDropped       float64            `json:"podRelistsQueueDropped"`
	InspectionTimeouts float64            `json:"podInspectionTimeouts"`

	// The hung pod (none: ""): the runtime calls the simulated runtime
	// received for it, per CRI method, in the window and over the whole
	// run, and the generator's ListPod and PodStatus calls for it in the
	// window.
	HungPod           string           `json:"hungPod,omitempty"`
	HungCallsWindow   map[string]int64 `json:"hungPodCallsWindow,omitempty"`
	HungCallsRun      map[string]int64 `json:"hungPodCallsRun,omitempty"`
	HungPodLists      int64            `json:"hungPodListCalls"`
	HungPodStatuses   int64            `json:"hungPodStatusCalls"`
	HungPodCallsTotal int64            `json:"hungPodRuntimeCallsWindow"`
}

// liveProbe wraps the CRI client to time the global listings and count the
// per-pod calls.
type liveProbe struct {
	cruntime.Runtime
	hung atomic.Pointer[types.UID]

	podLists, podStatuses         atomic.Int64
	hungPodLists, hungPodStatuses atomic.Int64

	mu    sync.Mutex
	lists []timedCall
}

type timedCall struct {
	start time.Time
	d     time.Duration
}

func (p *liveProbe) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	start := time.Now()
	pods, err := p.Runtime.ListPods(ctx)
	d := time.Since(start)
	p.mu.Lock()
	p.lists = append(p.lists, timedCall{start, d})
	p.mu.Unlock()
	return pods, err
}

func (p *liveProbe) setHung(uid types.UID) { p.hung.Store(&uid) }

func (p *liveProbe) isHung(uid types.UID) bool {
	h := p.hung.Load()
	return h != nil && *h == uid
}

func (p *liveProbe) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	p.podLists.Add(1)
	if p.isHung(uid) {
		p.hungPodLists.Add(1)
	}
	return p.Runtime.ListPod(ctx, uid)
}

func (p *liveProbe) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	p.countStatus(pod)
	return p.Runtime.ItemStatuses(ctx, pod, sbs, cts)
}

// countStatus counts a pod status fetch, whole or of the changed items.
func (p *liveProbe) countStatus(pod *cruntime.Pod) {
	p.podStatuses.Add(1)
	if pod != nil && p.isHung(pod.UID) {
		p.hungPodStatuses.Add(1)
	}
}

// asRuntime returns the probe as the generator's runtime.
func (p *liveProbe) asRuntime() cruntime.Runtime { return p }

// listsIn returns the durations of the listings that started in [from, to].
func (p *liveProbe) listsIn(from, to time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, l := range p.lists {
		if !l.start.Before(from) && !l.start.After(to) {
			out = append(out, l.d)
		}
	}
	return out
}

// liveSnapshot holds the counters read at each edge of the window.
type liveSnapshot struct {
	events      sim.EventStats
	received    int64
	podLists    int64
	podStatuses int64
	hungLists   int64
	hungStatus  int64
	hungCalls   map[string]int64
	skipped     map[string]float64
	dropped     float64
	timeouts    float64
}

// runLive runs one live scenario.
func runLive(ctx context.Context, o Options, sc Scenario) (_ *LiveResult, err error) {
	spec := sc.Live
	drv, err := startDriver(o, simConfig{Seed: o.Seed, Pods: sc.Pods, Containers: sc.Containers, EventBuffer: 10000})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := drv.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if sc.Latency > 0 {
		if err := drv.SetLatency(sc.Latency); err != nil {
			return nil, err
		}
	}

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	client, err := cri.Dial(drv.Endpoint(), cri.WithTimeout(sc.RequestTimeout), cri.WithMetrics(m), cri.WithLogger(logr.Discard()))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	pr := &liveProbe{Runtime: client}
	alg := plegColumn(sc, o.MaxParallelInspections)
	g, err := pleg.New(pleg.Options{
		Runtime:                pr.asRuntime(),
		EventSource:            client,
		Events:                 pleg.EventsOn,
		Metrics:                m,
		RelistPeriod:           spec.RelistPeriod,
		RelistThreshold:        sc.RelistThreshold,
		PodInspectionTimeout:   alg.inspectionTimeout,
		MaxParallelInspections: alg.parallel,
	})
	if err != nil {
		return nil, err
	}
	res := &LiveResult{
		RelistPeriodMs:         ms(spec.RelistPeriod),
		PodInspectionTimeoutMs: ms(alg.inspectionTimeout),
		RequestTimeoutMs:       ms(sc.RequestTimeout),
		RelistThresholdMs:      ms(g.RelistThreshold()),
		MaxParallelInspections: alg.parallel,
	}
	started := time.Now()
	g.Start()
	// Stop cancels the calls still out (the hung pod's), so it returns
	// at once.
	defer g.Stop()

	// Not measured: the first global relist (it inspects every pod), the
	// second (the first whose health timestamp is not the startup's), and
	// the event stream's connection. On a busy machine some of the first
	// relist's inspections time out and the next relist inspects those
	// pods again, each for up to the pod inspection timeout: a relist
	// that lasts seconds, and Healthy() measures from its start. So, as
	// for the relists driven by hand (warmupRelists), warm-up goes on
	// until a relist has nothing left to inspect: the window starts in
	// the steady state it measures, not in the startup's tail (CI saw a
	// window start 6 s after the last relist's start, with a 3 s
	// threshold, while the window's own relists came every 0.5 s).
	limit := time.Now().Add(liveStartLimit)
	for {
		recent := g.RecentRelists()
		if len(recent) >= liveWarmupRelists && g.EventStream().State == pleg.StreamConnected {
			if last := recent[len(recent)-1]; last.Err == "" && last.Inspected == 0 {
				res.WarmupRelists = len(recent)
				break
			}
		}
		if time.Now().After(limit) {
			return nil, fmt.Errorf("no global relist that inspected nothing and connected event stream within %v (relists %d, stream %+v)",
				liveStartLimit, len(recent), g.EventStream())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	res.StartupMs = ms(time.Since(started))

	// The storm starts with the window, as the hung pod's fault does
	// below. Started before the generator, it streamed while the first
	// relist inspected every pod: under load the generator then received
	// the window's events seconds late, each older than the last global
	// relist and so skipped as stale, and the window made no single-pod
	// relist at all, which is what this scenario measures.
	if spec.EventStorm > 0 {
		if err := drv.EventStorm(spec.EventStorm); err != nil {
			return nil, err
		}
	}

	// The pod hangs now, after the first relist inspected it: so the
	// generator's first call for it is a single-pod relist's filtered
	// list (hung too with HangLists), which a runtime event triggers. (Had
	// it hung before, the first relist's status call would still be out,
	// abandoned, and no filtered list call would be made for it.)
	var hung string
	if sc.HungPods > 0 {
		if hung, err = drv.HangLive(spec.HangLists); err != nil {
			return nil, err
		}
		pr.setHung(types.UID(hung))
		res.HungPod = hung
		if spec.HungPodEvents > 0 {
			if err := drv.EmitEvents(hung, spec.HungPodEvents); err != nil {
				return nil, err
			}
		}
	}

	snap := func() (liveSnapshot, error) {
		s := liveSnapshot{
			received:    g.EventStream().Events,
			podLists:    pr.podLists.Load(),
			podStatuses: pr.podStatuses.Load(),
			hungLists:   pr.hungPodLists.Load(),
			hungStatus:  pr.hungPodStatuses.Load(),
		}
		var err error
		if s.events, err = drv.EventStats(); err != nil {
			return s, err
		}
		if hung != "" {
			if s.hungCalls, err = drv.PodCalls(hung); err != nil {
				return s, err
			}
		}
		s.skipped, s.dropped, s.timeouts = liveCounters(reg)
		return s, nil
	}

	seen := map[time.Time]pleg.RelistStat{}
	collect := func() {
		for _, st := range g.RecentRelists() {
			seen[st.Start] = st
		}
	}
	s0, err := snap()
	if err != nil {
		return nil, err
	}
	window := spec.window(o.Quick)
	t0 := time.Now()
	end := t0.Add(window)
	connected := true
	tick := time.NewTicker(healthEvery)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		ok, herr := g.Healthy()
		res.HealthChecks++
		if !ok {
			res.Unhealthy++
			if res.FirstUnhealthy == "" {
				res.FirstUnhealthy = fmt.Sprintf("after %v: %v", time.Since(t0).Round(time.Millisecond), herr)
			}
		}
		if g.EventStream().State != pleg.StreamConnected {
			connected = false
		}
		collect()
	}
	t1 := time.Now()
	collect()
	s1, err := snap()
	if err != nil {
		return nil, err
	}
	res.WindowMs = ms(t1.Sub(t0))
	res.EverUnhealthy = res.Unhealthy > 0
	res.StreamConnected = connected

	var starts []time.Time
	var durs []time.Duration
	for _, st := range seen {
		if st.Start.Before(t0) || st.Start.After(t1) {
			continue
		}
		starts = append(starts, st.Start)
		durs = append(durs, st.Duration)
		if st.Err != "" {
			res.RelistErrors++
		}
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	res.Relists = len(starts)
	intervals := liveIntervals(t0, t1, starts)
	res.Intervals = len(intervals)
	res.IntervalP50Ms = ms(stats.Percentile(intervals, 0.50))
	res.IntervalP99Ms = ms(stats.Percentile(intervals, 0.99))
	res.IntervalMaxMs = ms(slices.Max(intervals))
	if len(durs) > 0 {
		res.RelistP50Ms = ms(stats.Percentile(durs, 0.50))
		res.RelistP99Ms = ms(stats.Percentile(durs, 0.99))
		res.RelistMaxMs = ms(slices.Max(durs))
	}
	lists := pr.listsIn(t0, t1)
	res.ListP50Ms = ms(stats.Percentile(lists, 0.50))
	res.ListP99Ms = ms(stats.Percentile(lists, 0.99))

	res.EventsEmitted = s1.events.Emitted - s0.events.Emitted
	res.EventsDropped = s1.events.DroppedFull - s0.events.DroppedFull
	res.EventsReceived = s1.received - s0.received
	res.PodLists = s1.podLists - s0.podLists
	res.PodStatuses = s1.podStatuses - s0.podStatuses
	res.Skipped = map[string]float64{}
	for k, v := range s1.skipped {
		if d := v - s0.skipped[k]; d > 0 {
			res.Skipped[k] = d
		}
	}
	res.QueueDropped = s1.dropped - s0.dropped
	res.InspectionTimeouts = s1.timeouts - s0.timeouts
	if hung != "" {
		res.HungPodLists = s1.hungLists - s0.hungLists
		res.HungPodStatuses = s1.hungStatus - s0.hungStatus
		res.HungCallsRun = s1.hungCalls
		res.HungCallsWindow = map[string]int64{}
		for k, v := range s1.hungCalls {
			if d := v - s0.hungCalls[k]; d > 0 {
				res.HungCallsWindow[k] = d
				res.HungPodCallsTotal += d
			}
		}
	}
	return res, nil
}

// liveIntervals returns the times from each relist start to the next, with
// the window's edges as the first and last bounds.
func liveIntervals(t0, t1 time.Time, starts []time.Time) []time.Duration {
	prev := t0
	out := make([]time.Duration, 0, len(starts)+1)
	for _, s := range starts {
		out = append(out, s.Sub(prev))
		prev = s
	}
	return append(out, t1.Sub(prev))
}

// liveCounters reads the single-pod relist counters from the registry.
func liveCounters(g prometheus.Gatherer) (skipped map[string]float64, dropped, timeouts float64) {
	skipped = map[string]float64{}
	mfs, err := g.Gather()
	if err != nil {
		return skipped, 0, 0
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pleg_pod_relist_requests_skipped_total":
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "reason" {
						skipped[l.GetValue()] += mt.GetCounter().GetValue()
					}
				}
			}
		case "pleg_pod_relist_requests_dropped_total":
			for _, mt := range mf.GetMetric() {
				dropped += mt.GetCounter().GetValue()
			}
		case "pleg_pod_inspection_timeouts_total":
			for _, mt := range mf.GetMetric() {
				timeouts += mt.GetCounter().GetValue()
			}
		}
	}
	return skipped, dropped, timeouts
}

// liveDescription is the Description of a live scenario.
func (s Scenario) liveDescription() string {
	l := s.Live
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods x %d containers", s.Pods, s.Containers)
	if s.HungPods > 0 {
		what := "status calls"
		if l.HangLists {
			what = "status calls and filtered list calls"
		}
		if s.HungPods == 1 {
			fmt.Fprintf(&b, ", 1 pod whose %s hang from the window's start", what)
		} else {
			fmt.Fprintf(&b, ", %d pods whose %s hang from the window's start", s.HungPods, what)
		}
		if l.HungPodEvents > 0 {
			fmt.Fprintf(&b, ", a runtime event for it every %v", l.HungPodEvents)
		}
	}
	if l.EventStorm > 0 {
		fmt.Fprintf(&b, ", %s runtime events per second spread over every pod", groupThousands(int64(l.EventStorm)))
	}
	if s.Latency > 0 {
		fmt.Fprintf(&b, ", %v per runtime call", s.Latency)
	}
	fmt.Fprintf(&b, "; a started generator, relist period %v", l.RelistPeriod)
	return b.String()
}

// evaluateLive checks the targets of a live scenario.
func evaluateLive(sc Scenario, r *LiveResult) []Target {
	var ts []Target
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
	t := Target{
		Goal:    "global relists keep coming every period: relist interval p99 (start to start, the window's edges included) at most " + how,
		Checked: true,
		Met:     r.Relists > 0 && r.IntervalP99Ms <= bound,
	}
	cmp := "<="
	if !t.Met {
		cmp = ">"
	}
	t.Figure = fmt.Sprintf("p99 %s %s %s; %d relists in %s, longest interval %s",
		fmtMs(r.IntervalP99Ms), cmp, fmtMs(bound), r.Relists, fmtMs(r.WindowMs), fmtMs(r.IntervalMaxMs))
	ts = append(ts, t)

	// A relist waits for no pod longer than the inspection timeout.
	rb := r.PodInspectionTimeoutMs + r.ListP99Ms
	t = Target{
		Goal:    "relist p99 at most the pod inspection timeout plus one list round trip",
		Checked: r.Relists > 0,
		Met:     r.Relists > 0 && r.RelistP99Ms <= rb,
	}
	cmp = "<="
	if !t.Met {
		cmp = ">"
	}
	t.Figure = fmt.Sprintf("p99 %s %s %s + %s (list p99) = %s", fmtMs(r.RelistP99Ms), cmp, fmtMs(r.PodInspectionTimeoutMs), fmtMs(r.ListP99Ms), fmtMs(rb))
	if r.Relists == 0 {
		t.Figure = "no relist in the window"
	}
	ts = append(ts, t)

	ts = append(ts, Target{
		Goal:    "Healthy() never false",
		Checked: true,
		Met:     !r.EverUnhealthy && r.HealthChecks > 0,
		Figure: fmt.Sprintf("false %d of %d checks (every %v, relist threshold %s)%s",
			r.Unhealthy, r.HealthChecks, healthEvery, fmtMs(r.RelistThresholdMs), firstUnhealthy(r)),
	})
	return ts
}

func firstUnhealthy(r *LiveResult) string {
	if r.FirstUnhealthy == "" {
		return ""
	}
	return "; first: " + r.FirstUnhealthy
}

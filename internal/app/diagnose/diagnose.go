// Package diagnose answers the question behind "PLEG is not healthy": how
// long would the kubelet's PLEG need to relist this node, and which pod and
// which runtime call make it slow?
//
// Run makes every runtime call a kubelet relist makes, times each one with
// a cruntime.CallTracer, and adds them up the way the kubelet spends them:
// one call after another. A call that does not answer within the probe
// timeout is reported as hanging; the estimate charges it the full runtime
// request timeout, because that is how long the kubelet waits for it.
// Pods are probed in parallel (bounded), so the report takes seconds even
// when calls hang.
//
// # The kubelet's relist, as estimated
//
// The estimate is package forecast's model of the kubelet v1.37's relist,
// the one `pleg run` forecasts with: one relist lists every sandbox and
// every container (ListPodSandbox and ListContainers), then inspects each
// changed pod with GetPodStatus: one PodSandboxStatus per sandbox and one
// ContainerStatus per container, with the listing's IDs, in that order,
// stopping at the first call that fails. The estimate assumes every pod is
// inspected (as in the first relist after a kubelet restart, or when every
// pod changed). A pod whose inspection fails is flagged and inspected again
// in every later relist, once each (older kubelets inspected it twice). So
//
//	estimate = list calls + Σ pods (their calls, up to the first failure)
//
// where a hanging call costs the runtime request timeout (the kubelet's
// --runtime-request-timeout, 2m by default) each time it is made. The
// kubelet's PLEG turns unhealthy when the time between two relist starts
// (the relist plus the relist period) exceeds the threshold (3m): with the
// default timeout, one hanging pod leaves it healthy (2m1s), two do not.
//
// # The shim probe
//
// On containerd 2.x the calls above are answered from containerd's memory
// and never reach a pod's shim, so a shim that stops answering shows only
// indirectly: a call waiting on it (UpdateContainerResources, say) holds
// its container's status lock, and that container's ContainerStatus and
// the node-wide ListContainers wait for the lock. The relist then fails at
// ListContainers, which names no pod. So when a list call hangs while
// ListPodSandbox answers, Run makes one call more than the kubelet does: a
// verbose PodSandboxStatus (`crictl inspectp`) of every sandbox, which asks
// the shim for its task's status. The sandboxes whose verbose status does
// not answer within the probe timeout are reported as stuck shims, and the
// first of them is named as the cause's pod. Options.ProbeShims makes the
// same probe on every diagnosis. The probe needs a runtime client that
// makes raw CRI calls (RawCRI, as *cri.Client) and takes at most three
// probe timeouts.
package diagnose

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"github.com/podlifecycle/pleg/metrics"
)

// Defaults, the kubelet's where it has one.
const (
	DefaultRequestTimeout = forecast.DefaultRequestTimeout
	DefaultProbeTimeout   = 5 * time.Second
	DefaultThreshold      = forecast.DefaultThreshold
	DefaultRelistPeriod   = forecast.DefaultPeriod
	DefaultMaxParallel    = 8
)

// Options configure Run.
type Options struct {
	// Endpoint names the runtime in the report. The shim probe dials it
	// (a unix socket: "unix:///path", "unix:/path" or "/path"); without
	// it no shim is probed.
	Endpoint string
	// RequestTimeout is the kubelet's --runtime-request-timeout: what one
	// hanging call costs its relist. Default 2m.
	RequestTimeout time.Duration
	// ProbeTimeout is how long a call may take before it is reported as
	// hanging. The runtime client should bound every call by it and make a
	// pod's calls one after another, stopping at the first failure, as the
	// kubelet does (for the CRI client: cri.WithTimeout(ProbeTimeout) and
	// cri.WithStatusConcurrency(1)); Run also bounds each pod's inspection
	// by it, as a safety net. Default 5s.
	ProbeTimeout time.Duration
	// Threshold is the PLEG health threshold. Default 3m.
	Threshold time.Duration
	// RelistPeriod is the time between the end of a relist and the start
	// of the next. Default 1s.
	RelistPeriod time.Duration
	// MaxParallel bounds how many pods (and, in the shim probe, sandboxes)
	// are probed at once. Default 8.
	MaxParallel int
	// ProbeShims makes the shim probe (a verbose PodSandboxStatus of every
	// sandbox, a call the kubelet does not make) on every diagnosis, not
	// only when a list call hangs.
	ProbeShims bool
}

func (o *Options) setDefaults() {
	k := forecast.Settings{RequestTimeout: o.RequestTimeout, Threshold: o.Threshold, Period: o.RelistPeriod}.WithDefaults()
	o.RequestTimeout, o.Threshold, o.RelistPeriod = k.RequestTimeout, k.Threshold, k.Period
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.MaxParallel <= 0 {
		o.MaxParallel = DefaultMaxParallel
	}
}

// Versioner is implemented by runtimes that report their name and version
// (CRI Version), such as *cri.Client.
type Versioner interface {
	Version(ctx context.Context) (name, version string, err error)
}

// Pod results.
const (
	ResultOK      = "ok"      // every call answered
	ResultError   = "error"   // a call failed
	ResultHung    = "hung"    // a call did not answer within the probe timeout
	ResultSkipped = "skipped" // not probed: the diagnosis was interrupted
)

// Report is what Run found. Its JSON form is what `pleg diagnose --output
// json` prints; durations are in seconds (floats) unless the key says
// otherwise.
type Report struct {
	Endpoint string `json:"endpoint,omitempty"`
	// Runtime is what the runtime says of itself (absent when it cannot
	// tell).
	Runtime *RuntimeInfo `json:"runtime,omitempty"`
	// StartedAt is when the diagnosis started; TookSeconds how long it took.
	StartedAt   time.Time `json:"startedAt"`
	TookSeconds float64   `json:"tookSeconds"`
	Settings    Settings  `json:"settings"`
	// List is the node-wide listing a relist starts with.
	List   List   `json:"list"`
	Counts Counts `json:"counts"`
	// Pods holds every listed pod, the most expensive for the kubelet
	// first.
	Pods     []PodReport `json:"pods"`
	Estimate Estimate    `json:"estimate"`
	// Healthy is true when the estimated relist keeps PLEG healthy.
	Healthy bool `json:"healthy"`
	// ShimProbe reports the shim probe: a verbose PodSandboxStatus of
	// every sandbox, beyond the kubelet's calls (absent when not made; see
	// the package documentation).
	ShimProbe *ShimProbe `json:"shimProbe,omitempty"`
	// StuckShims are the sandboxes whose shim does not answer, ready
	// sandboxes first (absent when there are none).
	StuckShims []StuckShim `json:"stuckShims,omitempty"`
	// Cause names the call that makes the relist slow or fail, or, on a
	// healthy node, the worst problem found (absent when there is none).
	Cause *Cause `json:"cause,omitempty"`
	// Verdict is one plain sentence, e.g. "relist would take ~35ms
	// (threshold 3m0s): healthy".
	Verdict string `json:"verdict"`
}

// RuntimeInfo is the runtime's own account (CRI Version and Status).
type RuntimeInfo struct {
	Name       string      `json:"name,omitempty"`
	Version    string      `json:"version,omitempty"`
	Conditions []Condition `json:"conditions,omitempty"`
	// Error is the error of Version or Status, if any.
	Error string `json:"error,omitempty"`
}

// Condition is one runtime condition (CRI RuntimeCondition).
type Condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Settings are the options the report was made with.
type Settings struct {
	RequestTimeoutSeconds float64 `json:"requestTimeoutSeconds"`
	ProbeTimeoutSeconds   float64 `json:"probeTimeoutSeconds"`
	ThresholdSeconds      float64 `json:"thresholdSeconds"`
	RelistPeriodSeconds   float64 `json:"relistPeriodSeconds"`
	MaxParallel           int     `json:"maxParallel"`
}

// List is the node-wide listing.
type List struct {
	Calls []Call `json:"calls"`
	// Error is the listing's error; a relist whose listing fails never
	// makes PLEG healthy.
	Error string `json:"error,omitempty"`
}

// Call is one runtime call.
type Call struct {
	// Call is the CRI method (ListPodSandbox, ListContainers,
	// PodSandboxStatus, ContainerStatus); Operation the operation_type
	// label of kubelet_runtime_operations_* for it.
	Call      string `json:"call"`
	Operation string `json:"operation"`
	// ID is the sandbox or container the call was about, if any.
	ID string `json:"id,omitempty"`
	// Seconds is how long the call took here (at most about the probe
	// timeout); KubeletSeconds what it costs the kubelet's relist (the
	// runtime request timeout when it hangs).
	Seconds        float64 `json:"seconds"`
	KubeletSeconds float64 `json:"kubeletSeconds"`
	// Hung is true when the call did not answer within the probe timeout.
	Hung  bool   `json:"hung,omitempty"`
	Error string `json:"error,omitempty"`
}

// Counts count the listing.
type Counts struct {
	Pods       int `json:"pods"`
	Sandboxes  int `json:"sandboxes"`
	Containers int `json:"containers"`
	// SandboxStates and ContainerStates count by state ("running" is a
	// ready sandbox, "exited" a not-ready one).
	SandboxStates   map[string]int `json:"sandboxStates"`
	ContainerStates map[string]int `json:"containerStates"`
}

// PodReport is the probe of one pod.
type PodReport struct {
	UID        string `json:"podUID"`
	Name       string `json:"podName"`
	Namespace  string `json:"podNamespace"`
	Sandboxes  int    `json:"sandboxes"`
	Containers int    `json:"containers"`
	// Result is "ok", "error", "hung" or "skipped".
	Result string `json:"result"`
	// InspectionSeconds is how long the pod's probe took here;
	// KubeletSeconds what one inspection of it costs the kubelet (its calls
	// up to the first that failed); KubeletInspections how often a relist
	// inspects it: 1 (0 when not probed).
	InspectionSeconds  float64 `json:"inspectionSeconds"`
	KubeletSeconds     float64 `json:"kubeletSeconds"`
	KubeletInspections int     `json:"kubeletInspections"`
	// SlowestCall is the call that costs the kubelet most; FailedCall the
	// call that failed or hung.
	SlowestCall *Call  `json:"slowestCall,omitempty"`
	FailedCall  *Call  `json:"failedCall,omitempty"`
	Error       string `json:"error,omitempty"`
	// Calls are every call made for the pod, in order.
	Calls []Call `json:"calls"`
}

// Ref returns "namespace/name", or the UID when the pod has no name.
func (p PodReport) Ref() string {
	if p.Name == "" {
		return p.UID
	}
	return textfmt.PodRef(p.Namespace, p.Name)
}

// Estimate is the kubelet's relist time, as estimated.
type Estimate struct {
	// RelistSeconds = ListSeconds + InspectionSeconds.
	RelistSeconds float64 `json:"relistSeconds"`
	// Relist is RelistSeconds as a Go duration, rounded ("4m0s", "35ms").
	Relist            string  `json:"relist"`
	ListSeconds       float64 `json:"listSeconds"`
	InspectionSeconds float64 `json:"inspectionSeconds"`
	// HungCalls counts the hanging calls one relist makes, each costing
	// the runtime request timeout.
	HungCalls int `json:"hungCalls"`
	// FailingPods counts pods whose inspection fails (hung included).
	FailingPods int `json:"failingPods"`
	// ThresholdSeconds is the health threshold; ExceedsThreshold is true
	// when the relist plus the relist period exceeds it.
	ThresholdSeconds float64 `json:"thresholdSeconds"`
	ExceedsThreshold bool    `json:"exceedsThreshold"`
	// ListFails is true when the listing itself fails: no relist succeeds.
	ListFails bool `json:"listFails"`
}

// Cause is the call to blame.
type Cause struct {
	// Pod is "namespace/name". For a list call it is the first pod whose
	// shim does not answer, when the shim probe found one (absent
	// otherwise).
	Pod    string `json:"pod,omitempty"`
	PodUID string `json:"podUID,omitempty"`
	Call   string `json:"call"`
	ID     string `json:"id,omitempty"`
	Hung   bool   `json:"hung"`
	Error  string `json:"error,omitempty"`
	// KubeletSeconds is what the call costs one relist.
	KubeletSeconds float64 `json:"kubeletSeconds"`
}

// Run diagnoses the runtime rt. rt may also implement Versioner and
// cruntime.StatusChecker, which add the runtime's own account to the
// report. Run returns a report even when the runtime cannot be reached (its
// verdict says so); it returns an error only when ctx ends first, with the
// partial report.
func Run(ctx context.Context, rt cruntime.Runtime, opts Options) (*Report, error) {
	opts.setDefaults()
	start := time.Now()
	r := &Report{
		Endpoint:  opts.Endpoint,
		StartedAt: start,
		Settings: Settings{
			RequestTimeoutSeconds: opts.RequestTimeout.Seconds(),
			ProbeTimeoutSeconds:   opts.ProbeTimeout.Seconds(),
			ThresholdSeconds:      opts.Threshold.Seconds(),
			RelistPeriodSeconds:   opts.RelistPeriod.Seconds(),
			MaxParallel:           opts.MaxParallel,
		},
		Counts: Counts{SandboxStates: map[string]int{}, ContainerStates: map[string]int{}},
		Pods:   []PodReport{},
	}
	d := &diagnoser{rt: rt, opts: opts}
	r.Runtime = d.runtimeInfo(ctx)

	pods, list := d.list(ctx)
	r.List = list
	for _, p := range pods {
		r.Counts.Pods++
		r.Counts.Sandboxes += len(p.Sandboxes)
		r.Counts.Containers += len(p.Containers)
		for _, s := range p.Sandboxes {
			if s != nil {
				r.Counts.SandboxStates[s.State.String()]++
			}
		}
		for _, c := range p.Containers {
			if c != nil {
				r.Counts.ContainerStates[c.State.String()]++
			}
		}
	}
	if list.Error == "" {
		r.Pods = d.inspectAll(ctx, pods)
	}
	r.ShimProbe, r.StuckShims = d.probeShims(ctx, pods, list)
	d.estimate(r)
	r.TookSeconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		// Past the deadline, its timer not yet run.
		return r, context.DeadlineExceeded
	}
	return r, nil
}

type diagnoser struct {
	rt   cruntime.Runtime
	opts Options
}

// runtimeInfo asks the runtime for its version and conditions.
func (d *diagnoser) runtimeInfo(ctx context.Context) *RuntimeInfo {
	v, hasV := d.rt.(Versioner)
	s, hasS := d.rt.(cruntime.StatusChecker)
	if !hasV && !hasS {
		return nil
	}
	info := &RuntimeInfo{}
	var errs []string
	if hasV {
		cctx, cancel := context.WithTimeout(ctx, d.opts.ProbeTimeout)
		name, version, err := v.Version(cctx)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
		}
		info.Name, info.Version = name, version
	}
	if hasS && len(errs) == 0 {
		cctx, cancel := context.WithTimeout(ctx, d.opts.ProbeTimeout)
		conds, err := s.Status(cctx)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
		}
		for _, c := range conds {
			info.Conditions = append(info.Conditions, Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
	}
	info.Error = strings.Join(errs, "; ")
	return info
}

// list runs the node-wide listing.
func (d *diagnoser) list(ctx context.Context) ([]*cruntime.Pod, List) {
	tr := &tracer{}
	// Two calls, each bounded by the client; the deadline is a safety net.
	start := time.Now()
	pods, err := d.bounded(ctx, tr, 2, func(ctx context.Context) ([]*cruntime.Pod, error) {
		return d.rt.ListPods(ctx)
	})
	l := List{Calls: d.calls(tr.snapshot())}
	if len(l.Calls) == 0 {
		// A runtime that reports no calls to tracers: time the listing.
		l.Calls = []Call{d.untraced("ListPods", time.Since(start), err)}
	}
	if err != nil {
		l.Error = err.Error()
		return nil, l
	}
	return pods, l
}

// bounded runs f under a tracer and a safety deadline of the probe timeout
// per call (calls calls at most) plus a second. If f does not return by
// then it is abandoned: its goroutine ends when the runtime answers.
func bounded[T any](ctx context.Context, tr *tracer, calls int, timeout time.Duration, f func(context.Context) (T, error)) (T, error) {
	budget := timeout*time.Duration(calls) + time.Second
	cctx, cancel := context.WithTimeout(cruntime.WithCallTracer(ctx, tr), budget)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f(cctx)
		done <- result{v, err}
	}()
	select {
	case res := <-done:
		return res.v, res.err
	case <-cctx.Done():
		// Prefer f's own answer when it came at the same time.
		select {
		case res := <-done:
			return res.v, res.err
		default:
		}
		var zero T
		return zero, cctx.Err()
	}
}

func (d *diagnoser) bounded(ctx context.Context, tr *tracer, calls int, f func(context.Context) ([]*cruntime.Pod, error)) ([]*cruntime.Pod, error) {
	return bounded(ctx, tr, calls, d.opts.ProbeTimeout, f)
}

// inspectAll probes every pod, at most MaxParallel at once.
func (d *diagnoser) inspectAll(ctx context.Context, pods []*cruntime.Pod) []PodReport {
	out := make([]PodReport, len(pods))
	sem := make(chan struct{}, d.opts.MaxParallel)
	var wg sync.WaitGroup
	for i, p := range pods {
		out[i] = PodReport{UID: string(p.UID), Name: p.Name, Namespace: p.Namespace,
			Sandboxes: len(p.Sandboxes), Containers: len(p.Containers), Result: ResultSkipped, Calls: []Call{}}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d.inspect(ctx, p, &out[i])
		}()
	}
	wg.Wait()
	slices.SortStableFunc(out, func(a, b PodReport) int {
		return cmp.Or(
			cmp.Compare(b.KubeletSeconds, a.KubeletSeconds),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out
}

// inspect probes one pod the way the kubelet's GetPodStatus does: the
// status of every sandbox, then of every container, stopping at the first
// call that fails.
func (d *diagnoser) inspect(ctx context.Context, pod *cruntime.Pod, pr *PodReport) {
	if ctx.Err() != nil {
		return
	}
	tr := &tracer{}
	start := time.Now()
	calls := len(pod.Sandboxes) + len(pod.Containers)
	_, err := bounded(ctx, tr, calls, d.opts.ProbeTimeout, func(ctx context.Context) (*cruntime.PodStatus, error) {
		return cruntime.FetchPodStatus(ctx, d.rt, pod)
	})
	pr.InspectionSeconds = time.Since(start).Seconds()
	pr.Calls = d.calls(tr.snapshot())
	pr.Result = ResultOK
	pr.KubeletInspections = 1
	if len(pr.Calls) == 0 && err == nil {
		// A runtime that reports no calls to tracers: time the inspection.
		pr.Calls = []Call{d.untraced("GetPodStatus", time.Since(start), nil)}
	}
	if err != nil {
		switch {
		case ctx.Err() != nil && lastFailed(pr.Calls) == nil:
			// Interrupted before anything failed: nothing to tell.
			pr.Result = ResultSkipped
			pr.KubeletInspections = 0
		case lastFailed(pr.Calls) == nil:
			// No traced call failed: the runtime failed outside a call.
			pr.Calls = append(pr.Calls, d.untraced("GetPodStatus", time.Since(start), err))
		}
		if pr.Result != ResultSkipped {
			pr.Error = err.Error()
			pr.Result = ResultError
		}
	}
	for _, c := range pr.Calls {
		pr.KubeletSeconds += c.KubeletSeconds
	}
	pr.SlowestCall = slowest(pr.Calls)
	if err != nil {
		pr.FailedCall = lastFailed(pr.Calls)
	}
	if pr.FailedCall != nil && pr.FailedCall.Hung && pr.Result == ResultError {
		pr.Result = ResultHung
	}
}

func slowest(calls []Call) *Call {
	var s *Call
	for i := range calls {
		if s == nil || calls[i].KubeletSeconds > s.KubeletSeconds {
			s = &calls[i]
		}
	}
	return s
}

func lastFailed(calls []Call) *Call {
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].Hung || calls[i].Error != "" {
			return &calls[i]
		}
	}
	return nil
}

// calls turns traced calls into report calls with their kubelet cost.
func (d *diagnoser) calls(traced []tracedCall) []Call {
	out := make([]Call, 0, len(traced))
	for _, t := range traced {
		c := Call{Call: metrics.Method(t.op), Operation: t.op, ID: t.id, Seconds: t.d.Seconds()}
		if t.err != nil {
			c.Error = t.err.Error()
		}
		c.Hung = hung(t.err, !t.done)
		if c.Hung {
			if c.Error == "" {
				c.Error = fmt.Sprintf("no answer within %v", d.opts.ProbeTimeout)
			}
			c.KubeletSeconds = d.opts.RequestTimeout.Seconds()
		} else {
			c.KubeletSeconds = min(t.d, d.opts.RequestTimeout).Seconds()
		}
		out = append(out, c)
	}
	return out
}

// untraced is a call standing for work the runtime did not report to the
// tracer.
func (d *diagnoser) untraced(name string, took time.Duration, err error) Call {
	c := Call{Call: name, Seconds: took.Seconds(), KubeletSeconds: min(took, d.opts.RequestTimeout).Seconds()}
	if err != nil {
		c.Error = err.Error()
		if c.Hung = hung(err, false); c.Hung {
			c.KubeletSeconds = d.opts.RequestTimeout.Seconds()
		}
	}
	return c
}

// hung tells whether a call hung: it never returned, or it ran out of time
// (the client bounds every call by the probe timeout).
func hung(err error, outstanding bool) bool {
	return outstanding || errors.Is(err, context.DeadlineExceeded)
}

// tracer records the runtime calls made under one context.
type tracer struct {
	mu    sync.Mutex
	calls []*tracedCall
}

type tracedCall struct {
	op, id string
	start  time.Time
	d      time.Duration
	err    error
	done   bool
}

func (t *tracer) StartCall(op, id string) func(time.Duration, error) {
	c := &tracedCall{op: op, id: id, start: time.Now()}
	t.mu.Lock()
	t.calls = append(t.calls, c)
	t.mu.Unlock()
	return func(d time.Duration, err error) {
		t.mu.Lock()
		c.d, c.err, c.done = d, err, true
		t.mu.Unlock()
	}
}

// snapshot returns the calls so far; an outstanding call's duration is the
// time since it started.
func (t *tracer) snapshot() []tracedCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]tracedCall, len(t.calls))
	for i, c := range t.calls {
		out[i] = *c
		if !c.done {
			out[i].d = time.Since(c.start)
		}
	}
	return out
}

// Package forecast tells how long the kubelet's PLEG would take to relist
// a node, and so whether and when it would report "PLEG is not healthy".
//
// The model (Settings.Estimate) is read from the kubelet v1.37.2's code
// (pkg/kubelet/pleg/generic.go, pkg/kubelet/kuberuntime); docs/forecast.md
// says it in full. In short, one global relist of the kubelet
//
//   - lists every sandbox and every container (ListPodSandbox, then
//     ListContainers); if the listing fails, the relist stops there and
//     its health timestamp does not move;
//   - inspects, one pod after another, every pod whose listing changed or
//     that is flagged for reinspection because its last inspection
//     failed: GetPodStatus makes a PodSandboxStatus per sandbox, then a
//     ContainerStatus per container, with the IDs of the listing, and
//     stops at the first call that fails (NotFound aside). A failed pod is
//     inspected once per relist (reconcilePodRecord; older kubelets
//     inspected it twice), again in every relist until it succeeds;
//   - bounds every call by the runtime request timeout
//     (--runtime-request-timeout, 2m by default): a call that hangs costs
//     exactly that, each time it is made.
//
// Relists run one after another with a sliding period (1 s), and the
// kubelet's PLEG is unhealthy while the time since the start of the last
// relist whose listing succeeded exceeds the threshold (3 m). So it turns
// unhealthy when a relist plus the period exceeds the threshold, or when
// listings keep failing. Single-pod relists (PLEGOnDemandRelist, GA and
// locked on in 1.37) run on the same worker between global relists; a pod
// asks for one only after a successful sync, which a pod whose inspection
// fails never has (its pod worker stops at the cached error), so they add
// nothing to a failing pod's cost.
//
// `pleg diagnose` feeds the model with calls it makes once; `pleg run`
// feeds it, through a Tracker, with what its own relists observe.
package forecast

import (
	"time"
)

// Defaults, the kubelet's.
const (
	DefaultRequestTimeout = 2 * time.Minute
	DefaultThreshold      = 3 * time.Minute
	DefaultPeriod         = time.Second
)

// Settings are the kubelet's: its --runtime-request-timeout, its PLEG's
// relist threshold and period.
type Settings struct {
	RequestTimeout time.Duration
	Threshold      time.Duration
	Period         time.Duration
}

// WithDefaults returns s with every unset field at the kubelet's default.
func (s Settings) WithDefaults() Settings {
	if s.RequestTimeout <= 0 {
		s.RequestTimeout = DefaultRequestTimeout
	}
	if s.Threshold <= 0 {
		s.Threshold = DefaultThreshold
	}
	if s.Period < 0 {
		s.Period = 0
	} else if s.Period == 0 {
		s.Period = DefaultPeriod
	}
	return s
}

// Call is one runtime call the kubelet's relist makes, as observed.
type Call struct {
	// Method is the CRI method, e.g. "ContainerStatus".
	Method string
	// ID is the sandbox or container the call is about, if any.
	ID string
	// Took is how long the call took where it was observed.
	Took time.Duration
	// Hung is true when the call did not answer in time where it was
	// observed (it may never answer): it costs the request timeout.
	Hung bool
	// Failed is true when the call failed (Hung included).
	Failed bool
}

// Cost returns what c costs one relist of the kubelet: the request timeout
// when it hangs, else its time, at most the request timeout.
func (s Settings) Cost(c Call) time.Duration {
	if c.Hung {
		return s.RequestTimeout
	}
	return min(c.Took, s.RequestTimeout)
}

// Pod is one pod the kubelet's relist inspects.
type Pod struct {
	// Ref is "namespace/name" (the UID when the pod has no name).
	Ref string
	UID string
	// Calls are the pod's GetPodStatus calls in order, up to the first
	// that failed.
	Calls []Call
}

// Failed returns the pod's failed call, or nil.
func (p *Pod) Failed() *Call {
	for i := range p.Calls {
		if p.Calls[i].Failed {
			return &p.Calls[i]
		}
	}
	return nil
}

// Relist is what one global relist of the kubelet meets.
type Relist struct {
	// List are the listing's calls (ListPodSandbox, ListContainers).
	List []Call
	// Pods are the pods it inspects.
	Pods []Pod
}

// Estimate is the model's answer for one relist.
type Estimate struct {
	// List is what the listing costs; Inspection what the pods'
	// inspections cost; Relist their sum.
	List, Inspection, Relist time.Duration
	// ListFails is true when a list call fails or hangs: the relist stops
	// there and never moves the health timestamp.
	ListFails bool
	// HungCalls counts the hanging calls one relist makes; FailingPods the
	// pods whose inspection fails (reinspected in every relist).
	HungCalls, FailingPods int
	// Exceeds is true when the kubelet's PLEG turns unhealthy: the
	// listing fails, or the relist plus the period exceeds the threshold.
	Exceeds bool
	// Cause is the call most to blame (the costliest failing pod's
	// failed call, else the costliest call), nil when there is none.
	Cause *Cause
}

// Cause is the call to blame.
type Cause struct {
	// Pod and PodUID are empty for a list call.
	Pod, PodUID string
	Call        Call
	// Cost is what the call costs one relist.
	Cost time.Duration
}

// Estimate estimates one relist of the kubelet that meets r.
func (s Settings) Estimate(r Relist) Estimate {
	s = s.WithDefaults()
	var e Estimate
	var worst *Cause
	blame := func(pod, uid string, c Call) {
		cost := s.Cost(c)
		// A failing call outranks one that answers; then the costlier.
		if worst == nil || (c.Failed && !worst.Call.Failed) || (c.Failed == worst.Call.Failed && cost > worst.Cost) {
			worst = &Cause{Pod: pod, PodUID: uid, Call: c, Cost: cost}
		}
	}
	for _, c := range r.List {
		e.List += s.Cost(c)
		if c.Hung {
			e.HungCalls++
		}
		if c.Failed {
			e.ListFails = true
		}
		blame("", "", c)
	}
	for _, p := range r.Pods {
		for _, c := range p.Calls {
			e.Inspection += s.Cost(c)
			if c.Hung {
				e.HungCalls++
			}
			blame(p.Ref, p.UID, c)
			if c.Failed {
				e.FailingPods++
				break // GetPodStatus stops at the first failure
			}
		}
	}
	e.Relist = e.List + e.Inspection
	e.Exceeds = e.ListFails || e.Relist+s.Period > s.Threshold
	e.Cause = worst
	return e
}

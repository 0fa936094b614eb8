package pleg

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"k8s.io/apimachinery/pkg/types"
)

// inspection is one runtime call made for one pod, running on its own
// goroutine: a fetch of its status, or (for a single-pod relist) a list call
// filtered to it. Whoever started it waits for it at most the pod inspection
// timeout; an inspection that outlives that wait is abandoned but tracked
// until its runtime calls return, so a pod that keeps hanging never has more
// than one call out.
type inspection struct {
	uid     types.UID
	pod     *cruntime.Pod       // the listing whose status is fetched; for a list call, the last one known (it names the pod), or nil
	prev    *cruntime.PodStatus // for a status fetch: the pod's last status, whose unchanged items are reused (nil: fetch all)
	list    bool                // a single-pod relist's filtered list call (ListPod)
	started time.Time
	done    chan struct{}
	status  *cruntime.PodStatus
	listed  *cruntime.Pod // the result of a list call
	err     error
	calls   callTracker

	// Single-pod relists only (set and read on the relist goroutine).
	gen      uint64    // the global relist generation it started in
	at       time.Time // the single-pod relist's start: its cache time
	work     work      // for a status fetch: what the core asked for
	reqSeq   uint64    // the RequestReinspect it serves (0: none)
	timedOut bool      // the pod inspection timeout expired first

	abandoned atomic.Bool // nobody waits for it any more
}

// returned reports whether the call of in has returned.
func (in *inspection) returned() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// inflightSet tracks the inspections nobody waits for synchronously: the
// abandoned ones that have not returned yet, and the single-pod relists'
// calls. A pod in it gets no second call.
type inflightSet struct {
	mu   sync.Mutex
	pods map[types.UID]*inspection
}

func (s *inflightSet) get(uid types.UID) *inspection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods[uid]
}

// put tracks in for uid. It never replaces a call that is still out: a pod
// has one call out at a time, and the one tracked is the one that blocks it.
func (s *inflightSet) put(uid types.UID, in *inspection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.pods[uid]; prev != nil && prev != in && !prev.returned() {
		return
	}
	s.pods[uid] = in
}

func (s *inflightSet) remove(uid types.UID, in *inspection) {
	s.mu.Lock()
	if s.pods[uid] == in {
		delete(s.pods, uid)
	}
	s.mu.Unlock()
}

// Len returns the number of abandoned inspections still outstanding.
func (s *inflightSet) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, in := range s.pods {
		if in.abandoned.Load() {
			n++
		}
	}
	return n
}

// callTracker remembers the runtime calls an inspection is waiting on
// (a pod's status calls may run concurrently).
type callTracker struct {
	mu   sync.Mutex
	next int
	out  map[int]trackedCall
}

type trackedCall struct{ op, id string }

func (c *callTracker) StartCall(op, id string) func(time.Duration, error) {
	c.mu.Lock()
	if c.out == nil {
		c.out = make(map[int]trackedCall)
	}
	key := c.next
	c.next++
	c.out[key] = trackedCall{op: op, id: id}
	c.mu.Unlock()
	return func(time.Duration, error) {
		c.mu.Lock()
		delete(c.out, key)
		c.mu.Unlock()
	}
}

// outstanding returns the oldest call still out (op "" when none).
func (c *callTracker) outstanding() (op, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := -1
	for k := range c.out {
		if first < 0 || k < first {
			first = k
		}
	}
	if first < 0 {
		return "", ""
	}
	call := c.out[first]
	return call.op, call.id
}

// InspectionTimeoutError is the error cached for a pod whose inspection
// exceeded the pod inspection timeout.
type InspectionTimeoutError struct {
	Pod       string // namespace/name
	UID       types.UID
	Operation string // the runtime call outstanding, e.g. "container_status"
	ID        string // the container or sandbox it was about
	Waited    time.Duration
	// StillRunning is true when an earlier inspection of the pod has not
	// returned yet, so no new call was made.
	StillRunning bool
}

// Call returns the CRI method name of the outstanding call, e.g.
// "ContainerStatus".
func (e *InspectionTimeoutError) Call() string { return callName(e.Operation) }

func (e *InspectionTimeoutError) Error() string {
	call := callName(e.Operation)
	if e.ID != "" {
		call += fmt.Sprintf(" %q", e.ID)
	}
	if e.StillRunning {
		return fmt.Sprintf("inspection of pod %q still outstanding after %v (%s)", e.Pod, e.Waited, call)
	}
	return fmt.Sprintf("inspection of pod %q exceeded the pod inspection timeout of %v (%s outstanding)", e.Pod, e.Waited, call)
}

// callName turns an operation type into the CRI method name.
func callName(op string) string {
	if op == "" {
		return "no runtime call"
	}
	return metrics.Method(op)
}

// inspectAll inspects the pods of todo, at most MaxParallelInspections at
// once, and calls apply on the calling goroutine for each, in the order the
// inspections finish (the order of todo when the bound is 1). Pods gone from
// the listing need no runtime call.
func (g *Generator) inspectAll(ctx context.Context, todo []work, apply func(work, *cruntime.PodStatus, error)) {
	type result struct {
		w      work
		status *cruntime.PodStatus
		err    error
	}
	var calls []work
	for _, w := range todo {
		if w.pod == nil {
			apply(w, nil, nil)
			continue
		}
		calls = append(calls, w)
	}
	if len(calls) == 0 {
		return
	}
	if g.opts.MaxParallelInspections <= 1 || len(calls) == 1 {
		for _, w := range calls {
			status, err := g.inspect(ctx, w)
			apply(w, status, err)
		}
		return
	}
	results := make(chan result, len(calls))
	slots := make(chan struct{}, g.opts.MaxParallelInspections)
	var wg sync.WaitGroup
	g.wg.Add(1)
	go func() { // the dispatcher: one goroutine per pod, bounded by slots
		defer g.wg.Done()
		for _, w := range calls {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				results <- result{w: w, err: ctx.Err()}
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, err := g.inspect(ctx, w)
				<-slots
				results <- result{w: w, status: status, err: err}
			}()
		}
		wg.Wait()
	}()
	for range calls {
		r := <-results
		apply(r.w, r.status, r.err)
	}
}

// inspect fetches the status of one listed pod, waiting at most the pod
// inspection timeout. When a single-pod relist has a call out for the pod,
// it makes no second call until that one returns, and the wait counts
// against the same timeout.
func (g *Generator) inspect(ctx context.Context, w work) (*cruntime.PodStatus, error) {
	pod := w.pod
	timeout := g.opts.PodInspectionTimeout
	var expired <-chan time.Time
	if timeout > 0 {
		t := g.clock.NewTimer(timeout)
		defer t.Stop()
		expired = t.C()
	}
	if prev := g.inflight.get(w.uid); prev != nil {
		if prev.abandoned.Load() {
			// An abandoned call for this pod is still out: make no other.
			op, id := prev.calls.outstanding()
			return nil, &InspectionTimeoutError{Pod: podRef(pod), UID: w.uid, Operation: op, ID: id,
				Waited: g.clock.Since(prev.started), StillRunning: true}
		}
		wait, bound := expired, timeout
		if wait == nil { // no pod inspection timeout: the single-pod relist's own bound
			bound = g.podCallTimeout()
			t := g.clock.NewTimer(bound)
			defer t.Stop()
			wait = t.C()
		}
		select {
		case <-prev.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wait:
			return nil, g.inspectionTimedOut(w.uid, pod, prev, bound)
		}
	}
	in := &inspection{uid: w.uid, pod: pod, prev: w.prev, started: g.clock.Now(), done: make(chan struct{})}
	g.call(in)
	select {
	case <-in.done:
		return in.status, in.err
	case <-ctx.Done():
		g.abandon(w.uid, in)
		return nil, ctx.Err()
	case <-expired:
		return nil, g.inspectionTimedOut(w.uid, pod, in, timeout)
	}
}

// inspectionTimedOut gives up waiting for in after waited: it names the
// call outstanding in the log, counts it, abandons in (tracked until it
// returns, then the pod is relisted) and returns the error to cache.
func (g *Generator) inspectionTimedOut(uid types.UID, pod *cruntime.Pod, in *inspection, waited time.Duration) error {
	op, id := in.calls.outstanding()
	g.m.InspectionTimeouts.WithLabelValues(op).Inc()
	err := &InspectionTimeoutError{Pod: podRef(pod), UID: uid, Operation: op, ID: id, Waited: waited}
	g.log.Error(err, "Pod inspection exceeded the timeout; the relist goes on without it",
		"pod", podRef(pod), "podUID", uid, "call", callName(op), "containerID", id, "after", waited)
	g.abandon(uid, in)
	return err
}

// call makes the runtime call of in on a goroutine of its own and closes
// in.done when it returns. The call runs under the generator's context, not
// a relist's, so that abandoning it does not cancel it: it ends by its own
// runtime request timeout, and a pod never has more than one call out.
func (g *Generator) call(in *inspection) {
	g.m.InspectionsInFlight.Inc()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer g.m.InspectionsInFlight.Dec()
		ctx := cruntime.WithCallTracer(g.rootCtx, &in.calls)
		if in.list {
			in.listed, in.err = g.rt.ListPod(ctx, in.uid)
		} else {
			in.status, in.err = g.fetchStatus(ctx, in.pod, in.prev)
			if in.err == nil {
				in.err = checkStatus(in.pod, in.status)
			}
		}
		close(in.done)
	}()
}

// abandon stops waiting for an inspection but tracks it until its call
// returns; then the pod is relisted on its own.
func (g *Generator) abandon(uid types.UID, in *inspection) {
	in.abandoned.Store(true)
	g.inflight.put(uid, in)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		<-in.done
		g.inflight.remove(uid, in)
		if g.rootCtx.Err() != nil {
			return
		}
		g.log.V(2).Info("Abandoned pod inspection returned; relisting the pod",
			"pod", podRef(in.pod), "podUID", uid, "after", g.clock.Since(in.started), "err", errString(in.err))
		g.RequestRelist(uid)
	}()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

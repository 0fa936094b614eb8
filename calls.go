package pleg

import (
	"context"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

// pool makes the runtime calls the core asks for, each on a goroutine of
// its own, and hands each result back to the loop as an input. It holds no
// rule: how many calls run at once (at most Options.MaxParallelInspections
// active, plus abandoned ones, one per pod at most) and when a call is
// given up are the core's. Every call runs under the generator's context,
// so that abandoning it does not cancel it (its pod keeps one call out
// until it returns, by the runtime's request timeout at the latest); Stop
// cancels them all.
//
// A call is out (in out, with its progress) until its result is queued
// (in done), in one step under the pool's lock, and the loop takes the
// results and the progress of the calls still out together (collect): a
// call that returned by the time the loop looks is a result, never a call
// out, so a call that returns at its deadline is not taken for a timeout
// with no runtime call to name.
type pool struct {
	rt    cruntime.Runtime
	ctx   context.Context
	wg    *sync.WaitGroup
	m     *metrics.Metrics
	ready chan struct{} // capacity 1: "there are results to collect"

	mu   sync.Mutex
	out  map[callID]*callTracker // the progress of each call out
	done []input                 // the results not collected yet
}

func newPool(ctx context.Context, rt cruntime.Runtime, wg *sync.WaitGroup, m *metrics.Metrics) *pool {
	return &pool{rt: rt, ctx: ctx, wg: wg, m: m, ready: make(chan struct{}, 1), out: make(map[callID]*callTracker)}
}

// start makes the call req on a goroutine of its own.
func (p *pool) start(req callReq) {
	tr := &callTracker{}
	p.mu.Lock()
	p.out[req.ID] = tr
	p.mu.Unlock()
	perPod := req.Kind != callList
	if perPod {
		p.m.InspectionsInFlight.Inc()
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		res := p.do(cruntime.WithCallTracer(p.ctx, tr), req)
		if perPod {
			p.m.InspectionsInFlight.Dec()
		}
		p.mu.Lock()
		delete(p.out, req.ID)
		p.done = append(p.done, res)
		p.mu.Unlock()
		select {
		case p.ready <- struct{}{}:
		default:
		}
	}()
}

// collect appends the results not collected yet to into, in the order
// the calls returned; with progress, it also returns what each call still
// out waits on (see waiting), taken at the same instant.
func (p *pool) collect(into []input, progress bool) ([]input, map[callID]trackedCall) {
	p.mu.Lock()
	defer p.mu.Unlock()
	into = append(into, p.done...)
	clear(p.done)
	p.done = p.done[:0]
	if !progress {
		return into, nil
	}
	return into, p.waitingLocked()
}

// do makes one call and returns its result as the core's input.
func (p *pool) do(ctx context.Context, req callReq) input {
	switch req.Kind {
	case callList:
		pods, err := p.rt.ListPods(ctx)
		return listed{call: req.ID, pods: pods, err: err}
	case callListPod:
		pod, err := p.rt.ListPod(ctx, req.UID)
		return podListed{call: req.ID, pod: pod, err: err}
	case callIdentity:
		ids, err := p.rt.Identities(ctx, req.Pod, req.Containers)
		return identitiesFetched{call: req.ID, ids: ids, err: err}
	}
	if !req.Delta {
		status, err := cruntime.FetchPodStatus(ctx, p.rt, req.Pod)
		return statusFetched{call: req.ID, status: status, err: err}
	}
	sbs, cts, err := p.rt.ItemStatuses(ctx, req.Pod, req.Sandboxes, req.Containers)
	return statusFetched{call: req.ID, sandboxes: sbs, containers: cts, err: err}
}

// waitingLocked returns, for each call out, the runtime call it is
// waiting on now; "unknown" when the runtime reported none (see cruntime.CallTracer).
func (p *pool) waitingLocked() map[callID]trackedCall {
	if len(p.out) == 0 {
		return nil
	}
	w := make(map[callID]trackedCall, len(p.out))
	for id, tr := range p.out {
		op, cid := tr.outstanding()
		if op == "" {
			op = opUnknown
		}
		w[id] = trackedCall{op: op, id: cid}
	}
	return w
}

// callTracker remembers the runtime calls one call is waiting on (a pod's
// status calls may run concurrently).
type callTracker struct {
	mu   sync.Mutex
	next int
	out  map[int]trackedCall
}

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

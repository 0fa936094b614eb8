package pleg

import (
	"context"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

// Single-pod relists (docs/semantics.md, "Single-pod relists") never run on
// the relist goroutine's time: the goroutine only starts their calls and
// steps the core with their results, so no pod, however slow, delays a
// global relist.
//
// A single-pod relist is two calls made one after the other, each on a
// goroutine of its own and each bounded by the pod inspection timeout: the
// list call filtered to the pod, then (when the listing changed or the pod
// is flagged) the pod's status. A pod has at most one call out at a time,
// whoever made it. A result is applied only if no global relist started
// since its call did: the global relist's listing is newer.

// podCallTimeout bounds each call of a single-pod relist: the pod
// inspection timeout, or the default when that is disabled (the kubelet
// has no single-pod relists, so its "no limit" does not apply to them).
func (g *Generator) podCallTimeout() time.Duration {
	if g.opts.PodInspectionTimeout > 0 {
		return g.opts.PodInspectionTimeout
	}
	return DefaultPodInspectionTimeout
}

// podRelistSlots is how many single-pod relist calls run at once.
func (g *Generator) podRelistSlots() int { return max(1, g.opts.MaxParallelInspections) }

// dispatchPodRelists starts the single-pod relists queued, as many as there
// are free slots. A request that a global relist covered is dropped; one
// for a pod with a call out is remembered and made when that call ends.
func (g *Generator) dispatchPodRelists() {
	for g.podCalls < g.podRelistSlots() {
		req, ok := g.requests.pop()
		if !ok {
			return
		}
		if covered(req.at, g.core.lastRelist) {
			g.m.PodRelistSkipped.WithLabelValues(metrics.SkipCovered).Inc()
			g.log.V(6).Info("Skipping single-pod relist: a global relist already covered it", "podUID", req.uid)
			g.takeHint(req.uid)
			continue
		}
		if in := g.inflight.get(req.uid); in != nil {
			if !in.abandoned.Load() {
				g.again[req.uid] = struct{}{}
			} // else: the abandoned call's return relists the pod
			continue
		}
		var last *cruntime.Pod
		if r := g.core.records[req.uid]; r != nil {
			last = r.pod()
		}
		g.startPodCall(&inspection{uid: req.uid, pod: last, list: true, at: g.clock.Now()})
	}
}

// startPodCall starts one call of a single-pod relist and a watcher that
// hands it back to the relist goroutine (podResults) when it returns or
// when the timeout expires, whichever comes first.
func (g *Generator) startPodCall(in *inspection) {
	in.started = g.clock.Now()
	in.done = make(chan struct{})
	in.gen = g.core.gen
	g.podCalls++
	g.inflight.put(in.uid, in)
	g.call(in)
	timeout := g.podCallTimeout()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		t := g.clock.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-in.done:
		case <-t.C():
			in.timedOut = true
		case <-g.rootCtx.Done():
			return
		}
		select {
		case g.podResults <- in:
		case <-g.rootCtx.Done():
		}
	}()
}

// podCallDone steps the core with the outcome of one single-pod relist
// call, on the relist goroutine.
func (g *Generator) podCallDone(in *inspection) {
	g.podCalls--
	uid := in.uid
	if in.abandoned.Load() {
		// A global relist waited for this call, gave up and abandoned it:
		// it counted and cached the timeout, and the call's return
		// relists the pod.
		delete(g.again, uid)
		return
	}
	if in.timedOut && !in.returned() {
		g.podCallTimedOut(in)
		return
	}
	// (A call that returned just after its timer fired is handled as
	// returned: abandoning it would untrack whatever call is out now.)
	g.inflight.remove(uid, in)
	if _, again := g.again[uid]; again {
		// A hint came while the call was out; it may be about a later
		// change than the call saw.
		delete(g.again, uid)
		g.RequestRelist(uid)
	}
	if !in.list {
		g.m.PodRelistDuration.Observe(g.clock.Since(in.at).Seconds())
		if o := g.apply(in.work, in.status, in.err, in.at); o.OK && in.reqSeq != 0 {
			g.clearReinspect(uid, in.reqSeq)
		}
		return
	}
	if in.err == nil {
		in.err = checkPod(in.listed)
	}
	if in.err != nil {
		if g.rootCtx.Err() == nil {
			g.log.Error(in.err, "GenericPLEG: Unable to relist pod", "podUID", uid)
		}
		return
	}
	// An outside reinspection request is served by this relist only if its
	// inspection succeeds; until then the request stays for the next one.
	reqSeq, requested := g.peekReinspect(uid)
	w, inspect, stale := g.core.podListed(uid, in.listed, in.gen, requested)
	switch {
	case stale:
		// A global relist started since the call did: its listing is
		// newer, and it inspected the pod itself.
	case !inspect:
		g.takeHint(uid)
		g.cache.MarkObserved(uid, in.at)
		g.m.PodRelistDuration.Observe(g.clock.Since(in.at).Seconds())
	case w.pod == nil:
		// Gone: no runtime call, the cache entry goes.
		if o := g.apply(w, nil, nil, in.at); o.OK && requested {
			g.clearReinspect(uid, reqSeq)
		}
		g.m.PodRelistDuration.Observe(g.clock.Since(in.at).Seconds())
	default:
		in2 := &inspection{uid: uid, pod: w.pod, prev: w.prev, at: in.at, work: w}
		if requested {
			in2.reqSeq = reqSeq
		}
		g.startPodCall(in2)
	}
}

// podCallTimedOut handles a single-pod relist call that exceeded the
// timeout like a timed-out inspection: named in the log, counted, cached as
// the pod's error, retried later (the pod is flagged for reinspection and
// relisted when the call returns), and tracked so the pod gets no second
// call meanwhile. Its transitions stay in the record for the retry.
func (g *Generator) podCallTimedOut(in *inspection) {
	uid := in.uid
	timeout := g.podCallTimeout()
	op, id := in.calls.outstanding()
	g.m.InspectionTimeouts.WithLabelValues(op).Inc()
	err := &InspectionTimeoutError{Pod: podRef(in.pod), UID: uid, Operation: op, ID: id, Waited: timeout}
	g.log.Error(err, "Single-pod relist call exceeded the pod inspection timeout; the pod is retried later",
		"pod", podRef(in.pod), "podUID", uid, "call", callName(op), "containerID", id, "after", timeout)
	g.abandon(uid, in)
	delete(g.again, uid) // the abandoned call's return relists the pod
	if !in.list {
		g.apply(in.work, nil, err, in.at)
		return
	}
	if g.core.listTimedOut(uid, in.gen) {
		// Keep what the cache knew of the pod, with the error.
		status, _ := g.cache.Get(uid)
		g.cache.Set(uid, status, err, in.at)
		g.m.InspectionFailures.Inc()
	}
}

// settlePodRelists runs the queued single-pod relists to the end, waiting
// for their calls (bounded by the timeout): for generators driven by hand
// (tests, tools), where no relist goroutine runs.
func (g *Generator) settlePodRelists(ctx context.Context) error {
	for {
		g.dispatchPodRelists()
		if g.podCalls == 0 {
			return nil
		}
		select {
		case in := <-g.podResults:
			g.podCallDone(in)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

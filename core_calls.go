package pleg

import (
	"cmp"
	"slices"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// Runtime calls out. The core asks for calls (Ready.Calls); the pool makes
// each on a goroutine of its own and hands back its result as an input. A
// pod has at most one call out, whoever made it. At most cfg.slots calls
// are active; a per-pod call that exceeds its bound is abandoned: its pod
// is handled as a failed inspection, its slot is freed, but it stays out
// (tracked, so that its pod gets no second call) until it returns, by the
// runtime request timeout at the latest. Abandoned calls are therefore
// bounded by one per pod.

type callKind uint8

const (
	callList     callKind = iota // ListPods: a global relist's listing
	callListPod                  // ListPod: a single-pod relist's listing
	callStatus                   // the status of one listed pod
	callIdentity                 // the identities of some of a pod's containers
)

// call is one runtime call out.
type call struct {
	id   callID
	kind callKind
	uid  types.UID
	// pod: for a status call, the listing whose status is fetched; for a
	// single-pod list call, the pod's last listing (it names the pod), or
	// nil.
	pod *cruntime.Pod
	// plan: a delta inspection's plan (nil: fetch every item).
	plan *delta
	// items: an identity call's containers.
	items []*cruntime.Container
	// started is when it was asked for; deadline when its pod stops
	// waiting for it (zero: no bound but the runtime request timeout).
	started, deadline time.Time
	gen               uint64 // the global listing generation it started in
	// forRelist: a status call of the global relist in progress.
	forRelist bool
	// podRelist is when the single-pod relist it belongs to started (zero:
	// none).
	podRelist time.Time
	// reqSeq is the RequestReinspect it serves if it succeeds (0: none).
	reqSeq    uint64
	abandoned bool
	// op and opID: the runtime call it was waiting on when abandoned.
	op, opID string
}

// callReq is a call for the pool to make.
type callReq struct {
	ID   callID
	Kind callKind
	UID  types.UID
	Pod  *cruntime.Pod
	// Sandboxes and Containers are the items whose status to fetch, for a
	// delta inspection (Delta true; otherwise every item of Pod), and the
	// containers whose identity to fetch.
	Delta      bool
	Sandboxes  []*cruntime.Container
	Containers []*cruntime.Container
}

// trackedCall is the runtime call a call out is waiting on.
type trackedCall struct{ op, id string }

// startCall asks for k.
func (c *core) startCall(k *call) {
	c.nextID++
	k.id = c.nextID
	k.started = c.stepNow
	k.gen = c.gen
	c.calls[k.id] = k
	req := callReq{ID: k.id, Kind: k.kind, UID: k.uid, Pod: k.pod}
	if k.kind != callList {
		c.active++
		c.records[k.uid].call = k
		timeout := c.cfg.timeout
		if k.forRelist {
			timeout = c.cfg.statusTimeout
		}
		if timeout > 0 {
			k.deadline = k.started.Add(timeout)
		}
	}
	if k.plan != nil {
		req.Delta, req.Sandboxes, req.Containers = true, k.plan.fetchSbs, k.plan.fetchCts
	}
	if k.kind == callIdentity {
		req.Containers = k.items
	}
	c.out.Calls = append(c.out.Calls, req)
}

// endCall forgets call id, which returned, and returns it (nil: unknown).
// An abandoned call's return relists its pod: it may have missed a change.
func (c *core) endCall(id callID) *call {
	k := c.calls[id]
	if k == nil {
		return nil
	}
	delete(c.calls, id)
	if k.kind == callList {
		return k
	}
	r := c.records[k.uid]
	if r != nil && r.call == k {
		r.call = nil
	}
	if k.abandoned {
		c.abandoned--
		if k.kind != callIdentity {
			c.note(note{kind: noteAbandonedReturned, uid: k.uid, pod: k.pod, d: c.stepNow.Sub(k.started)})
			c.addHint(k.uid, pendingHint{first: c.stepNow, last: c.stepNow})
		}
		// A hint that came while the call was out is queued (or merged
		// into the relist queued above) as for any call that returns.
		c.afterCall(k.uid)
		return nil
	}
	c.active--
	if k.forRelist {
		c.relist.out--
	}
	return k
}

// callReturned forgets call id, which returned, and returns it with its
// pod's record; nil when there is nothing to step: the call is unknown or
// was abandoned, or its pod is forgotten.
func (c *core) callReturned(id callID) (*call, *record) {
	k := c.endCall(id)
	if k == nil || c.records[k.uid] == nil {
		return nil, nil
	}
	return k, c.records[k.uid]
}

// startStatus inspects r's current listing: it starts its status call, or,
// when a delta inspection has nothing to fetch (only items gone since the
// last status), applies the outcome at once.
func (c *core) startStatus(uid types.UID, r *record, forRelist bool, podRelist time.Time) {
	k := &call{kind: callStatus, uid: uid, pod: r.current, forRelist: forRelist, podRelist: podRelist,
		reqSeq: r.requested}
	if !c.cfg.full && !r.flagged && r.requested == 0 && r.status != nil {
		d := planDelta(r.current, r.status)
		if len(d.fetchSbs)+len(d.fetchCts) == 0 {
			status, err := c.assemble(k, &d, statusFetched{})
			c.apply(uid, r, forRelist && c.relist.phase == relistInspecting, k.reqSeq, status, err, r.currentAt)
			if !podRelist.IsZero() {
				c.note(note{kind: notePodRelistDone, d: c.stepNow.Sub(podRelist)})
			}
			return
		}
		k.plan = &d
	}
	if forRelist {
		c.relist.out++
	}
	c.startCall(k)
}

// expire abandons the calls whose deadline has passed: each is handled as
// its pod's failed inspection (named, counted and cached), and its pod is
// reinspected once it returns.
func (c *core) expire(waiting map[callID]trackedCall) {
	now := c.stepNow
	var expired []*call
	for _, k := range c.calls {
		if !k.abandoned && !k.deadline.IsZero() && !now.Before(k.deadline) {
			expired = append(expired, k)
		}
	}
	// Calls are numbered in the order they were made.
	sortCalls(expired)
	for _, k := range expired {
		w := waiting[k.id]
		k.abandoned, k.op, k.opID = true, w.op, w.id
		c.active--
		c.abandoned++
		if k.forRelist {
			c.relist.out--
		}
		r := c.records[k.uid]
		err := &InspectionTimeoutError{Pod: podRef(k.pod), UID: k.uid, Operation: w.op, ID: w.id,
			Waited: k.deadline.Sub(k.started)}
		if k.kind == callIdentity {
			c.note(note{kind: noteIdentityFailed, uid: k.uid, pod: k.pod, err: err})
			c.learn(r, k.items, nil)
			continue
		}
		c.note(note{kind: noteTimeout, uid: k.uid, pod: k.pod, err: err, op: w.op, single: !k.forRelist})
		r.hint.again = false // the call's return relists the pod
		switch {
		case k.kind == callStatus && r.current != nil:
			c.apply(k.uid, r, c.relistOwns(k), 0, nil, err, r.currentAt)
		case r.current != nil && (k.gen == c.gen || r.owed):
			// A single-pod list call: keep what the cache knew, with the
			// error.
			c.failList(k.uid, r, err, k.started)
		}
	}
	if len(expired) > 0 {
		c.maybeEndRelist()
	}
}

// failList caches err for the listed pod r whose single-pod list call
// failed by timing out, keeping its last status, and flags it.
func (c *core) failList(uid types.UID, r *record, err error, at time.Time) {
	status := r.status
	if status == nil {
		status = placeholderStatus(uid, r.current)
	}
	r.flagged, r.owed = true, false
	r.ips, r.status = nil, nil
	c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheSet, uid: uid, status: status, err: err, at: at})
	c.note(note{kind: noteInspectionFailed, uid: uid, pod: r.current, err: err})
}

// dispatch starts what the free slots allow: the global relist's status
// calls first, then single-pod relists for hints.
func (c *core) dispatch() {
	for len(c.relist.todo) > 0 && c.active < c.cfg.slots {
		uid := c.relist.todo[0]
		c.relist.todo = c.relist.todo[1:]
		c.startStatus(uid, c.records[uid], true, time.Time{})
	}
	c.maybeEndRelist()
	c.dispatchHints()
	c.dispatchIdentities()
}

func sortCalls(ks []*call) {
	slices.SortFunc(ks, func(a, b *call) int { return cmp.Compare(a.id, b.id) })
}

package pleg

import (
	"fmt"
	"slices"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// One pod's inspection and its outcome (docs/semantics.md, "One relist",
// step 6): the status is fetched for the pod's latest listing; a failure is
// cached with its error and flags the pod, delivering nothing; a success is
// cached, delivers the events between what was delivered and the listing
// (PodSync if none), and advances the record.

// onPodListed steps the result of a single-pod relist's list call.
func (c *core) onPodListed(in podListed) {
	k, r := c.callReturned(in.call)
	if k == nil {
		return
	}
	uid := k.uid
	err := in.err
	if err == nil {
		err = checkPod(in.pod)
	}
	switch {
	case err != nil:
		c.note(note{kind: notePodRelistFailed, uid: uid, pod: k.pod, err: err})
		c.inspectOwed(uid, r)
	case k.gen != c.gen:
		// A global relist listed since the call started: its listing is
		// newer; it inspected the pod itself, or handed it over.
		c.inspectOwed(uid, r)
	default:
		r.current, r.currentAt = in.pod, k.started
		r.idleRelist = time.Time{}
		switch {
		case !r.needsInspection():
			r.idleRelist = c.stepNow
			settle(r)
			c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheObserved, uid: uid, at: k.started})
			c.note(note{kind: notePodRelistDone, d: c.stepNow.Sub(k.started)})
			r.hint.clearLatency()
		case r.current == nil:
			// Gone: no runtime call, the cache entry goes.
			c.apply(uid, r, false, r.requested, nil, nil, k.started)
			c.note(note{kind: notePodRelistDone, d: c.stepNow.Sub(k.started)})
		default:
			c.startStatus(uid, r, false, k.started)
		}
	}
	c.afterCall(uid)
}

// inspectOwed inspects a pod handed over by a global relist, now that its
// call is back.
func (c *core) inspectOwed(uid types.UID, r *record) {
	if !r.owed {
		return
	}
	if r.current == nil || !r.needsInspection() {
		r.owed = false
		settle(r)
		c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheObserved, uid: uid, at: r.currentAt})
		return
	}
	c.startStatus(uid, r, false, time.Time{})
}

// afterCall relists the pod uid if a hint came while its call was out,
// and forgets it if nothing is left. The hint joins the queue within its
// bound, as any hint does (core_hints.go): over it, it is dropped, and
// the next global relist covers the pod.
func (c *core) afterCall(uid types.UID) {
	r := c.records[uid]
	if r == nil {
		return
	}
	if r.call == nil && r.hint.again {
		r.hint.again = false
		switch {
		case r.hint.queued:
			// It waits in the queue already (queued before the call
			// started).
		case len(c.hints.order) >= c.cfg.budget.queue:
			r.hint = pendingHint{}
			c.note(note{kind: noteHintDropped, uid: uid})
			c.toBase()
		default:
			c.queueHint(uid, r)
		}
	}
	c.forget(uid)
}

// onStatus steps the result of a status call.
func (c *core) onStatus(in statusFetched) {
	k, r := c.callReturned(in.call)
	if k == nil {
		return
	}
	uid := k.uid
	status, err := c.assemble(k, k.plan, in)
	switch {
	case r.current == nil:
		// A newer global listing found the pod gone and delivered that.
	case !sameStates(k.pod, r.current):
		// A newer global listing changed the pod since: fetch again for
		// it (the pod was handed over).
		c.inspectOwed(uid, r)
	default:
		c.apply(uid, r, c.relistOwns(k), k.reqSeq, status, err, r.currentAt)
		if !k.podRelist.IsZero() {
			c.note(note{kind: notePodRelistDone, d: c.stepNow.Sub(k.podRelist)})
		}
	}
	c.maybeEndRelist()
	c.afterCall(uid)
}

// assemble checks a status call's result and, for a delta inspection (d
// not nil), builds the pod's status from the fetched items and the reused
// ones.
func (c *core) assemble(k *call, d *delta, in statusFetched) (*cruntime.PodStatus, error) {
	if d == nil {
		status, err := in.status, in.err
		if err == nil {
			err = checkStatus(k.pod, status)
		} else if status != nil && checkStatus(k.pod, status) != nil {
			status = nil // a partial status with nil entries: keep none of it
		}
		if err == nil {
			c.note(note{kind: noteStatusItems, n: len(status.SandboxStatuses) + len(status.ContainerStatuses)})
		}
		return status, err
	}
	if in.err != nil {
		return nil, in.err
	}
	if len(in.sandboxes) != len(d.fetchSbs) || len(in.containers) != len(d.fetchCts) {
		return nil, fmt.Errorf("%w: ItemStatuses for pod %q returned %d sandbox and %d container statuses for %d and %d items",
			ErrMalformed, podRef(k.pod), len(in.sandboxes), len(in.containers), len(d.fetchSbs), len(d.fetchCts))
	}
	sbs, cts := fill(d.sandboxes, in.sandboxes), fill(d.containers, in.containers)
	fetched := len(d.fetchSbs) + len(d.fetchCts)
	c.note(note{kind: noteStatusItems, n: fetched, reused: len(k.pod.Sandboxes) + len(k.pod.Containers) - fetched})
	return cruntime.NewPodStatus(k.pod, sbs, cts), nil
}

// apply carries out the outcome of inspecting pod uid (record r) with
// status and err (both nil for a pod gone from the listing), cached at
// at. forRelist counts it in the global relist's statistics; a success
// serves the RequestReinspect numbered reqSeq, unless a newer one came. It
// reports whether the inspection succeeded.
func (c *core) apply(uid types.UID, r *record, forRelist bool, reqSeq uint64, status *cruntime.PodStatus, err error, at time.Time) bool {
	r.owed = false
	if r.current == nil {
		c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheDelete, uid: uid, at: at})
	} else {
		if err == nil {
			status.IPs = carryIPs(r.ips, status)
			r.ips, r.status = status.IPs, status
		} else {
			r.ips, r.status = nil, nil
			if status == nil {
				status = placeholderStatus(uid, r.current)
			}
		}
		c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheSet, uid: uid, status: status, err: err, at: at})
	}
	if err != nil {
		r.flagged = true
		c.note(note{kind: noteInspectionFailed, uid: uid, pod: r.current, err: err})
		if forRelist {
			c.relist.stat.Failed++
			if isTimeout(err) {
				c.relist.stat.TimedOut++
			}
		}
		return false
	}
	reinspected := r.flagged || r.requested != 0
	r.flagged = false
	settle(r)
	if r.requested == reqSeq {
		r.requested = 0
	}
	if r.current != nil {
		r.current = advance(r.current, status)
	}
	events := Diff(uid, r.old, r.current)
	if mid := withObserved(r.old, r.current, r.observed); mid != nil {
		events = append(Diff(uid, r.old, mid), Diff(uid, mid, r.current)...)
	}
	pruneObserved(r)
	pod := r.pod()
	if len(events) == 0 {
		if !reinspected {
			// The status showed the change the listing did undone by
			// now (advance): nothing to tell.
			r.old = r.current
			return true
		}
		events = []Event{{PodUID: uid, Type: PodSync}}
	}
	r.old = r.current
	out := events[:0] // events is this outcome's own: filtered in place
	for _, e := range events {
		if e.Type == ContainerChanged {
			continue
		}
		e.Time = c.stepNow
		if pod != nil {
			e.PodName, e.PodNamespace = pod.Name, pod.Namespace
		}
		if e.Type == ContainerDied && status != nil {
			if cs := findContainerStatus(status, e.ContainerID); cs != nil {
				code := cs.ExitCode
				e.ExitCode = &code
			}
		}
		out = append(out, e)
	}
	c.out.Publish = append(c.out.Publish, publication{uid: uid, pod: r.current, last: pod, status: status, events: out,
		relist: forRelist, identities: r.identity})
	c.wantIdentities(uid, r)
	if forRelist {
		c.relist.stat.Events += len(out)
	}
	if first, ok := r.hint.takeLatency(); ok && len(out) > 0 {
		c.note(note{kind: noteHintLatency, d: c.stepNow.Sub(first)})
	}
	return true
}

// advance returns the listing p with each item in the state its fresh
// status shows, where that state is further along the item's lifecycle
// (a container: created, running, exited; a sandbox: ready, not ready):
// the status was fetched after the listing, and the item moved on in
// between. The kubelet's next relist would see that state; pleg reports
// it now, so that a container that starts and dies between two listings
// is not reported only dead. p is returned when nothing moved on (listed
// pods are never modified).
func advance(p *cruntime.Pod, status *cruntime.PodStatus) *cruntime.Pod {
	if status == nil {
		return p
	}
	later := func(listed, seen cruntime.State) bool {
		// An unknown listed state is nowhere on the lifecycle.
		if listed != cruntime.StateCreated && listed != cruntime.StateRunning {
			return false
		}
		return lifecycleRank(stateOf(seen)) > lifecycleRank(stateOf(listed))
	}
	var out *cruntime.Pod
	move := func(items []*cruntime.Container, i int, state cruntime.State, sandbox bool) {
		if out == nil {
			cp := *p
			cp.Sandboxes, cp.Containers = slices.Clone(p.Sandboxes), slices.Clone(p.Containers)
			out = &cp
		}
		it := *items[i]
		it.State = state
		if sandbox {
			out.Sandboxes[i] = &it
		} else {
			out.Containers[i] = &it
		}
	}
	for i, c := range p.Containers {
		for _, st := range status.ContainerStatuses {
			if st.ID == c.ID && later(c.State, st.State) {
				move(p.Containers, i, st.State, false)
			}
		}
	}
	for i, sb := range p.Sandboxes {
		for _, st := range status.SandboxStatuses {
			if st.ID == sb.ID && sb.State == cruntime.StateRunning && st.State == cruntime.StateExited {
				move(p.Sandboxes, i, st.State, true)
			}
		}
	}
	if out == nil {
		return p
	}
	return out
}

// withObserved returns the pod's state between old and current that
// runtime events observed, or nil when they saw nothing between: a
// container the events saw reach a state later than old's and earlier
// than current's (it started, then died before a listing showed it
// running). Only containers current lists count: an event cannot make up
// a container.
func withObserved(old, current *cruntime.Pod, observed map[string]cruntime.State) *cruntime.Pod {
	if len(observed) == 0 || current == nil {
		return nil
	}
	rank := lifecycleRank
	var mid *cruntime.Pod
	for _, c := range current.Containers {
		seen, ok := observed[c.ID]
		if !ok {
			continue
		}
		was, _, _ := find(old, c.ID)
		now := stateOf(c.State)
		at := stateOf(seen)
		if rank(at) <= rank(was) || rank(at) >= rank(now) {
			continue
		}
		if mid == nil {
			mid = &cruntime.Pod{UID: current.UID, Name: current.Name, Namespace: current.Namespace}
			if old != nil {
				mid.Sandboxes, mid.Containers = slices.Clone(old.Sandboxes), slices.Clone(old.Containers)
			}
		}
		it := *c
		it.State = seen
		replaced := false
		for i, o := range mid.Containers {
			if o.ID == c.ID {
				mid.Containers[i], replaced = &it, true
			}
		}
		if !replaced {
			mid.Containers = append(mid.Containers, &it)
		}
	}
	return mid
}

// lifecycleRank orders a container's states along its life: not there
// yet, created (or unknown), running, exited.
func lifecycleRank(s state) int {
	switch s {
	case stateUnknown:
		return 1
	case stateRunning:
		return 2
	case stateExited:
		return 3
	}
	return 0 // non-existent
}

// pruneObserved forgets what runtime events saw that r's listing has
// reached (or whose container it no longer lists): only a state the
// listing has yet to show can still come before one it shows.
func pruneObserved(r *record) {
	for id, seen := range r.observed {
		st, _, _ := find(r.current, id)
		if st == stateNonExistent || lifecycleRank(st) >= lifecycleRank(stateOf(seen)) {
			delete(r.observed, id)
		}
	}
	if len(r.observed) == 0 {
		r.observed = nil
	}
}

// placeholderStatus is the status cached for a pod whose inspection
// failed without one: its identity and no items.
func placeholderStatus(uid types.UID, p *cruntime.Pod) *cruntime.PodStatus {
	s := &cruntime.PodStatus{UID: uid}
	if p != nil {
		s.Name, s.Namespace = p.Name, p.Namespace
	}
	return s
}

// carryIPs keeps a dead pod's last IPs: when the fresh status has none and
// no sandbox is ready, the previous IPs stay.
func carryIPs(prev []string, status *cruntime.PodStatus) []string {
	if len(status.IPs) != 0 || len(prev) == 0 {
		return status.IPs
	}
	for _, s := range status.SandboxStatuses {
		if s.State == cruntime.StateRunning {
			return status.IPs
		}
	}
	return prev
}

func findContainerStatus(s *cruntime.PodStatus, id string) *cruntime.ContainerStatus {
	for _, c := range s.ContainerStatuses {
		if c.ID == id && c.State == cruntime.StateExited {
			return c
		}
	}
	return nil
}

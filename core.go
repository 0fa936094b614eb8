package pleg

import (
	"slices"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// core is the kubelet's PLEG rules as a deterministic state machine
// (docs/semantics.md): listings, inspection outcomes and times go in; the
// pods to inspect, cache writes and events come out. It does no I/O, starts
// no goroutine, reads no clock and logs nothing. The relist loop
// (relist.go, podrelist.go) is its shell: it makes the runtime calls under
// their bounds, feeds the answers in and carries the outputs out to the
// cache, delivery, metrics and logs.
//
// Its steps:
//
//	listed      a global relist's listing: the pods to inspect
//	podListed   a single-pod relist's listing: the pod to inspect, if any
//	inspected   one pod's inspection outcome: the cache write and events
//
// A core is owned by one goroutine.
type core struct {
	records map[types.UID]*record
	// reinspect: pods whose last inspection failed (or that were deferred
	// from a global relist): the next relist inspects them even if their
	// listing did not change, and a success emits PodSync.
	reinspect map[types.UID]struct{}
	// gen counts successful global relists, and lastRelist is the start
	// of the last one: a single-pod relist's listing from an earlier
	// generation is older than the records, and a hint from before
	// lastRelist is covered.
	gen        uint64
	lastRelist time.Time
	// full makes every inspection fetch every item of the pod, as the
	// kubelet does (Options.FullInspection); otherwise a pod's work carries
	// its last status for a delta inspection (delta.go).
	full bool
}

// record is what the core knows of one pod.
type record struct {
	// old is the listing events have been emitted for; current the
	// latest listing (nil: the pod is not listed).
	old, current *cruntime.Pod
	// ips are the IPs of the pod's last successfully cached status: a
	// status without IPs and without a ready sandbox keeps them (the
	// kubelet's carry-over for a dead pod).
	ips []string
	// status is the pod's last successfully inspected status (nil after a
	// failure): the items a delta inspection may reuse.
	status *cruntime.PodStatus
}

// pod returns the most recent listing of the record.
func (r *record) pod() *cruntime.Pod {
	if r.current != nil {
		return r.current
	}
	return r.old
}

// work is one pod to inspect: the listing to fetch the status of (nil: the
// pod is gone, no call needed) and the events its listing changed by
// (possibly none, when it was flagged for reinspection).
type work struct {
	uid    types.UID
	pod    *cruntime.Pod
	events []Event
	gen    uint64 // the generation of the listing
	// prev, when not nil, is the pod's last status: the inspection may
	// reuse its items whose listing has not changed (delta.go). It is nil
	// for a full inspection: after a failure, when asked for from outside
	// (RequestReinspect), or with Options.FullInspection.
	prev *cruntime.PodStatus
}

// outcome is what the shell does after an inspection.
type outcome struct {
	// The cache write: Delete the entry, or Set Status and Err at At.
	Delete bool
	Status *cruntime.PodStatus
	Err    error
	At     time.Time
	// OK is whether the inspection succeeded; only then are Events
	// delivered, leading to State (nil: the pod is gone).
	OK     bool
	Events []Event
	State  *cruntime.Pod
	// Stale is true when the outcome was dropped because a newer global
	// relist superseded its listing: nothing to do.
	Stale bool
}

func newCore(full bool) *core {
	return &core{records: make(map[types.UID]*record), reinspect: make(map[types.UID]struct{}), full: full}
}

// prev returns the status a delta inspection of r may reuse: none when the
// core inspects fully, or when the pod is flagged (its last inspection
// failed, or a full one was asked for).
func (c *core) prev(r *record, flagged bool) *cruntime.PodStatus {
	if c.full || flagged {
		return nil
	}
	return r.status
}

// covered reports whether something that happened at t (a hint's enqueue
// time, a runtime event's creation) is covered by the global relist that
// started at last: its listing already shows it.
func covered(t, last time.Time) bool { return !last.IsZero() && t.Before(last) }

// flagged reports whether uid is flagged for reinspection by the core.
func (c *core) flagged(uid types.UID) bool {
	_, ok := c.reinspect[uid]
	return ok
}

// listed steps a successful global relist that started at t with its
// listing. requested are the pods asked for reinspection from outside
// (RequestReinspect). It returns the pods to inspect, in UID order.
func (c *core) listed(t time.Time, pods []*cruntime.Pod, requested []types.UID) []work {
	c.gen++
	c.lastRelist = t
	for _, r := range c.records {
		r.current = nil
	}
	for _, p := range pods {
		r := c.records[p.UID]
		if r == nil {
			r = &record{}
			c.records[p.UID] = r
		}
		r.current = p
	}
	flagged := c.reinspect
	for _, uid := range requested {
		flagged[uid] = struct{}{}
	}
	// Rebuilt by this relist's outcomes.
	c.reinspect = make(map[types.UID]struct{})
	var todo []work
	for uid, r := range c.records {
		events := Diff(uid, r.old, r.current)
		_, ok := flagged[uid]
		if len(events) == 0 && !ok {
			continue
		}
		todo = append(todo, work{uid: uid, pod: r.current, events: events, gen: c.gen, prev: c.prev(r, ok)})
	}
	// A stable order makes runs reproducible; it costs only the changed pods.
	slices.SortFunc(todo, func(a, b work) int { return strings.Compare(string(a.uid), string(b.uid)) })
	return todo
}

// podListed steps a single-pod relist: the listing of uid (nil: the runtime
// has nothing for it), taken in generation gen. requested is an outside
// request to reinspect the pod. It returns the pod to inspect, or ok false
// when nothing changed (the shell marks the cache entry observed) or when
// the listing is older than the records (stale).
func (c *core) podListed(uid types.UID, pod *cruntime.Pod, gen uint64, requested bool) (w work, ok, stale bool) {
	if gen != c.gen {
		return work{}, false, true
	}
	r := c.records[uid]
	if r == nil {
		if pod == nil {
			return work{}, false, false
		}
		r = &record{}
		c.records[uid] = r
	}
	r.current = pod
	events := Diff(uid, r.old, r.current)
	flagged := requested || c.flagged(uid)
	if len(events) == 0 && !flagged {
		if r.old == nil && r.current == nil {
			delete(c.records, uid)
		}
		return work{}, false, false
	}
	return work{uid: uid, pod: r.current, events: events, gen: gen, prev: c.prev(r, flagged)}, true, false
}

// inspected steps the outcome of inspecting w at t: status and err from the
// runtime (nil, nil for a pod gone from the listing). An outcome for a
// listing the records have moved past (a single-pod relist's, overtaken by
// a global relist) is dropped as Stale.
func (c *core) inspected(w work, status *cruntime.PodStatus, err error, t time.Time) outcome {
	r := c.records[w.uid]
	if w.gen != c.gen || r == nil || r.current != w.pod {
		return outcome{Stale: true}
	}
	var o outcome
	if r.current == nil {
		o.Delete = true
	} else {
		if err == nil {
			status.IPs = carryIPs(r.ips, status)
			r.ips = status.IPs
			r.status = status
		} else {
			r.ips = nil
			r.status = nil
			if status == nil {
				status = &cruntime.PodStatus{UID: w.uid, Name: r.current.Name, Namespace: r.current.Namespace}
			}
		}
		o.Status, o.Err, o.At = status, err, t
	}
	if err != nil {
		c.reinspect[w.uid] = struct{}{}
		return o
	}
	delete(c.reinspect, w.uid)
	o.OK = true
	events := w.events
	if len(events) == 0 {
		events = []Event{{PodUID: w.uid, Type: PodSync}}
	}
	pod := r.pod()
	if r.current == nil {
		delete(c.records, w.uid)
	} else {
		r.old = r.current
	}
	o.State = r.current
	out := make([]Event, 0, len(events))
	for _, e := range events {
		if e.Type == ContainerChanged {
			continue
		}
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
	o.Events = out
	return o
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

// listTimedOut steps a single-pod relist whose list call for uid, made in
// generation gen, exceeded its bound: the pod is flagged for reinspection,
// and ok says whether the shell caches the error for it (a listed pod of
// the current generation).
func (c *core) listTimedOut(uid types.UID, gen uint64) (ok bool) {
	r := c.records[uid]
	if gen != c.gen || r == nil || r.current == nil {
		return false
	}
	c.reinspect[uid] = struct{}{}
	r.ips = nil
	r.status = nil
	return true
}

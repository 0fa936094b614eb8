package pleg

import (
	"slices"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"k8s.io/apimachinery/pkg/types"
)

// The global relist (docs/semantics.md, "One relist"): list every pod, then
// inspect those whose listing changed or that are flagged, at most
// cfg.slots at once. One runs at a time; the next is due one period after
// the end of the last (sliding; the period adapts, core_adapt.go), or
// earlier when hints wait for the budget (core_hints.go).
//
// A global relist never waits for a single-pod relist's call: a pod that
// has a call out when the listing comes is handed over (owed) and inspected
// as soon as that call returns; its cache entry is held out of the relist's
// cache timestamp until then.

type relistPhase uint8

const (
	relistIdle relistPhase = iota
	relistListing
	relistInspecting
)

// relistState is the global relist in progress, and when the next is due.
type relistState struct {
	phase relistPhase
	start time.Time
	// due is when the next global relist starts (the zero time: at once).
	due time.Time
	// end is when the last one ended.
	end time.Time
	// todo: the pods waiting for a slot for their status call, in UID
	// order; out: the relist's own status calls out (not abandoned).
	todo []types.UID
	out  int
	// held: the pods handed over to their call out.
	held []types.UID
	// early: due was brought forward for hints waiting for the budget.
	early bool
	stat  RelistStat
}

// startRelist starts a global relist: its list call.
func (c *core) startRelist() {
	now := c.stepNow
	early := c.relist.early
	c.relist = relistState{phase: relistListing, start: now, end: c.relist.end,
		stat: RelistStat{Start: now}}
	c.out.RelistStarted = now
	if !c.lastRelist.IsZero() {
		c.note(note{kind: noteRelistInterval, d: now.Sub(c.lastRelist)})
	}
	if early {
		c.note(note{kind: noteEarlyRelist})
	}
	c.startCall(&call{kind: callList})
}

// onListed steps the result of the global relist's list call.
func (c *core) onListed(in listed) {
	k := c.endCall(in.call)
	if k == nil || c.relist.phase != relistListing {
		return
	}
	pods, err := in.pods, in.err
	same := err == nil && samePods(pods, c.lastListing)
	if err == nil && !same {
		err = checkPods(pods)
	}
	if err != nil {
		c.relist.stat.Err, c.relist.stat.err = err.Error(), err
		c.note(note{kind: noteListFailed, err: err})
		if c.reachable >= 0 {
			c.reachable = -1
			c.out.Runtime = &journal.RuntimeStatus{State: journal.RuntimeUnreachable, Message: err.Error()}
		}
		c.endRelist()
		return
	}
	if c.reachable <= 0 {
		c.reachable = 1
		c.out.Runtime = &journal.RuntimeStatus{State: journal.RuntimeReachable}
	}
	start, prev := c.relist.start, c.lastRelist
	c.gen++
	c.lastRelist = start
	c.out.Healthy = start
	if !same {
		c.note(gaugesNote(pods))
		c.lastListing = append(c.lastListing[:0], pods...)
	}
	for _, p := range pods {
		r := c.record(p.UID)
		r.current, r.currentAt, r.listedGen = p, start, c.gen
		c.relist.stat.Pods++
		c.relist.stat.Containers += len(p.Containers) + len(p.Sandboxes)
	}
	c.coverHints(start)

	var todo []types.UID
	for uid, r := range c.records {
		if r.listedGen != c.gen {
			r.current = nil // not in this listing: gone
		}
		if r.needsInspection() {
			c.unannounced(uid, r, prev)
			todo = append(todo, uid)
			continue
		}
		// Unchanged: what events saw that the listing shows is moot;
		// what it does not show yet (the listing is older than the
		// event) stays.
		pruneObserved(r)
		if r.current == nil {
			c.forget(uid)
		}
	}
	// A stable order makes runs reproducible; it costs only the changed pods.
	slices.SortFunc(todo, func(a, b types.UID) int { return strings.Compare(string(a), string(b)) })
	c.relist.stat.Inspected = len(todo)
	c.relist.phase = relistInspecting
	for _, uid := range todo {
		r := c.records[uid]
		switch {
		case r.current == nil:
			// Gone: no runtime call, the cache entry goes.
			c.apply(uid, r, true, r.requested, nil, nil, start)
			c.forget(uid)
		case r.call != nil && r.call.abandoned:
			// An abandoned call for the pod is still out: make no other.
			k := r.call
			err := &InspectionTimeoutError{Pod: podRef(r.current), UID: uid, Operation: k.op, ID: k.opID,
				Waited: c.stepNow.Sub(k.started), StillRunning: true}
			c.apply(uid, r, true, 0, nil, err, start)
		case r.call != nil:
			r.owed = true
			c.relist.held = append(c.relist.held, uid)
		default:
			c.relist.todo = append(c.relist.todo, uid)
		}
	}
	c.maybeEndRelist()
}

// maybeEndRelist ends the global relist once its status calls are all
// done.
func (c *core) maybeEndRelist() {
	if c.relist.phase == relistInspecting && len(c.relist.todo) == 0 && c.relist.out == 0 {
		c.setCacheTime(c.relist.start, c.relist.held)
		c.endRelist()
	}
}

// endRelist ends the global relist (successful or not) and schedules the
// next.
func (c *core) endRelist() {
	now := c.stepNow
	stat := c.relist.stat
	stat.Duration = now.Sub(c.relist.start)
	c.adaptAfterRelist(stat.err == nil)
	stat.NextPeriod = c.period()
	c.out.Relist = &stat
	c.relist = relistState{end: now, due: now.Add(stat.NextPeriod)}
	c.foldHints()
}

// relistOwns reports whether the global relist in progress inspects pods
// now (its listing is in): their outcomes count in its statistics.
func (c *core) relistOwns(k *call) bool {
	return k.forRelist && c.relist.phase == relistInspecting
}

// samePods reports whether a and b are the same pods, the same pointers in
// the same order: a listing that is the last one again.
func samePods(a, b []*cruntime.Pod) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// gaugesNote counts a listing for the running-pods and running-containers
// gauges: pods with at least one running sandbox, and containers (not
// sandboxes) per state.
func gaugesNote(pods []*cruntime.Pod) note {
	n := note{kind: noteGauges}
	for _, p := range pods {
		for _, s := range p.Sandboxes {
			if s.State == cruntime.StateRunning {
				n.n++
				break
			}
		}
		for _, c := range p.Containers {
			st := c.State
			if st < cruntime.StateUnknown || st > cruntime.StateExited {
				st = cruntime.StateUnknown
			}
			n.byState[st]++
		}
	}
	return n
}

// RelistStat describes one global relist.
type RelistStat struct {
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration"`
	// Pods and Containers count the listing (containers include sandboxes).
	Pods       int `json:"pods"`
	Containers int `json:"containers"`
	// Inspected pods needed a status fetch or a cache deletion; Failed of
	// them failed (TimedOut of those by the pod inspection timeout).
	Inspected int `json:"inspected"`
	Failed    int `json:"failed"`
	TimedOut  int `json:"timedOut"`
	// Events delivered by this relist.
	Events int `json:"events"`
	// NextPeriod is the period this relist's end set to the next: the
	// base period, or the adaptive relist's stretched one.
	NextPeriod time.Duration `json:"nextPeriod,omitempty"`
	// Err is the listing error of a failed relist.
	Err string `json:"error,omitempty"`
	err error
}

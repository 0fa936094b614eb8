package pleg

import (
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// Hints (docs/semantics.md, "Hints and their budget"): a runtime event or
// RequestRelist suggests that one pod changed. The periodic global relist
// stays the truth; a hint only makes the change show sooner, through a
// single-pod relist (a list call filtered to the pod, then its status if
// its listing changed). Its cost to the runtime is bounded:
//
//   - a hint older than the start of the last successful global listing is
//     covered: that listing already shows it (containerd 2.x replays events
//     minutes old to a new subscriber);
//   - a runtime event that names a container in the state the records
//     already show changes nothing;
//   - a pod has one hint pending at most: later ones merge into it, and one
//     that comes while the pod's call is out relists it when the call
//     returns;
//   - single-pod relists draw on a token bucket (budget.rate a second, up
//     to budget.burst at once), and a pod whose single-pod relist found
//     nothing is not relisted on its own again for budget.spacing (a pod
//     whose relist found a change is, at once: a container's start is two
//     events, CREATED then STARTED, tens of milliseconds apart);
//   - hints that wait for the budget bring the next global relist forward
//     to budget.early after the end of the last: one listing covers them
//     all (on containerd a filtered list call costs the runtime about what
//     the full listing costs);
//   - hints wait while a global relist lists or has status calls waiting
//     for a slot: the global relist goes first;
//   - the queue holds at most budget.queue pods; a hint over it is dropped,
//     and the next global relist covers its pod.

// hintBudget bounds what hints cost the runtime.
type hintBudget struct {
	rate    float64       // single-pod relists a second; <= 0: unlimited
	burst   int           // single-pod relists at once
	spacing time.Duration // between two single-pod relists of one pod
	early   time.Duration // a global relist this long after the last, when hints wait for the budget (0: no early relist)
	queue   int           // pods waiting at most
}

// pendingHint is the hint pending for one pod.
type pendingHint struct {
	// first and last are the earliest and latest times of the hints it
	// stands for: last decides coverage.
	first, last time.Time
	queued      bool // waiting in the queue
	again       bool // waiting for the pod's call to return
	// latency is the creation time of the earliest runtime event not yet
	// turned into a delivered event (zero: none), for the event-to-delivery
	// latency.
	latency time.Time
}

func (h *pendingHint) pending() bool { return h.queued || h.again }

func (h *pendingHint) merge(o pendingHint) {
	if h.first.IsZero() || o.first.Before(h.first) {
		h.first = o.first
	}
	if o.last.After(h.last) {
		h.last = o.last
	}
	if !o.latency.IsZero() && (h.latency.IsZero() || o.latency.Before(h.latency)) {
		h.latency = o.latency
	}
}

// takeLatency returns and forgets the latency start of the pod's hints.
func (h *pendingHint) takeLatency() (time.Time, bool) {
	t := h.latency
	h.latency = time.Time{}
	return t, !t.IsZero()
}

func (h *pendingHint) clearLatency() { h.latency = time.Time{} }

// hintQueue is the queue of pods waiting for a single-pod relist, and the
// budget's token bucket.
type hintQueue struct {
	order    []types.UID
	tokens   float64
	tokensAt time.Time
	started  bool // the bucket has been filled once
}

// covered reports whether something that happened at t (a hint, a runtime
// event's creation) is covered by the global listing that started at last:
// that listing already shows it.
func covered(t, last time.Time) bool { return !last.IsZero() && t.Before(last) }

// onHint steps a hint.
func (c *core) onHint(in hintIn) {
	delete(c.adapt.found, in.uid) // whatever it says, the pod's change was announced
	at := in.at
	if at.IsZero() {
		at = c.stepNow
	}
	if in.event {
		// Even a covered event says what it saw: the listing that covers
		// it may already show a later state (the container started, and
		// was killed before that listing).
		c.observe(in.uid, in.container, in.eventType)
	}
	if covered(at, c.lastRelist) {
		reason := SkipCovered
		if in.event {
			reason = SkipStaleEvent
		}
		c.note(note{kind: noteHintSkipped, uid: in.uid, reason: reason, container: in.container})
		return
	}
	if in.event && in.container != "" && unchangedBy(c.records[in.uid], in.container, in.eventType) {
		c.note(note{kind: noteHintSkipped, uid: in.uid, reason: SkipUnchanged, container: in.container})
		return
	}
	h := pendingHint{first: at, last: at}
	if in.event {
		h.latency = at
	}
	c.addHint(in.uid, h)
}

// maxObserved bounds the states a pod's record keeps from runtime events.
const maxObserved = 16

// observe records what a fresh runtime event says a container reached
// (STARTED: running, STOPPED: exited), for the pod's next outcome: when its
// listing has moved past that state (a container that started and was
// killed before the relist that the event triggered could list it), the
// outcome delivers the state the event saw before the listed one
// (core_pod.go, withObserved). Of several events about one container, the
// earliest state counts: only a state before the listed one can be missing.
func (c *core) observe(uid types.UID, id string, t cruntime.EventType) {
	var st cruntime.State
	switch t {
	case cruntime.EventStarted:
		st = cruntime.StateRunning
	case cruntime.EventStopped:
		st = cruntime.StateExited
	default:
		return
	}
	r := c.records[uid]
	if id == "" || r == nil {
		return // an event cannot make up a pod either
	}
	if r.observed == nil {
		r.observed = make(map[string]cruntime.State)
	}
	prev, ok := r.observed[id]
	switch {
	case ok && lifecycleRank(stateOf(prev)) <= lifecycleRank(stateOf(st)):
		// Keep the earliest state: STARTED then STOPPED before any
		// listing means the container was running, which the exited
		// listing alone would lose.
	case ok || len(r.observed) < maxObserved:
		r.observed[id] = st
	}
}

// unchangedBy reports whether a runtime event of type t about container
// (or sandbox) id changes nothing the record r shows: a container cannot
// start, stop, be created or be deleted twice.
func unchangedBy(r *record, id string, t cruntime.EventType) bool {
	var p *cruntime.Pod
	if r != nil {
		p = r.pod()
	}
	st, _, _ := find(p, id)
	switch t {
	case cruntime.EventCreated:
		return st != stateNonExistent
	case cruntime.EventStarted:
		return st == stateRunning
	case cruntime.EventStopped:
		return st == stateExited
	case cruntime.EventDeleted:
		return st == stateNonExistent
	}
	return false
}

// addHint makes h pending for pod uid.
func (c *core) addHint(uid types.UID, h pendingHint) {
	r := c.records[uid]
	switch {
	case r != nil && r.call != nil:
		r.hint.merge(h)
		r.hint.again = true
	case r != nil && r.hint.queued:
		r.hint.merge(h)
	case len(c.hints.order) >= c.cfg.budget.queue:
		c.note(note{kind: noteHintDropped, uid: uid})
		c.toBase()
	default:
		r = c.record(uid)
		r.hint.merge(h)
		c.queueHint(uid, r)
	}
	if r != nil {
		r.announced = true
	}
}

// queueHint queues pod uid for a single-pod relist.
func (c *core) queueHint(uid types.UID, r *record) {
	if r.hint.queued {
		return
	}
	r.hint.queued = true
	c.hints.order = append(c.hints.order, uid)
	c.refill()
	if c.cfg.budget.rate > 0 && c.hints.tokens < 1 {
		c.note(note{kind: noteHintDeferred, uid: uid, reason: DeferBudget})
		c.toBase()
		c.foldHints()
	} else if c.spaced(r) {
		c.note(note{kind: noteHintDeferred, uid: uid, reason: DeferSpacing})
	}
}

// spaced reports whether r's pod was relisted on its own, for nothing,
// too recently to be relisted again now.
func (c *core) spaced(r *record) bool {
	s := c.cfg.budget.spacing
	return s > 0 && !r.idleRelist.IsZero() && c.stepNow.Before(r.idleRelist.Add(s))
}

// refill adds the tokens earned since the last refill.
func (c *core) refill() {
	b := c.cfg.budget
	if b.rate <= 0 {
		return
	}
	q := &c.hints
	if !q.started {
		q.started, q.tokens, q.tokensAt = true, float64(b.burst), c.stepNow
		return
	}
	if el := c.stepNow.Sub(q.tokensAt); el > 0 {
		q.tokens = min(float64(b.burst), q.tokens+b.rate*el.Seconds())
		q.tokensAt = c.stepNow
	}
}

// tokensNow returns the tokens the bucket holds at the step's time,
// without refilling it: queries (Settled) change nothing.
func (c *core) tokensNow() float64 {
	b, q := c.cfg.budget, &c.hints
	if !q.started {
		return float64(b.burst)
	}
	if el := c.stepNow.Sub(q.tokensAt); el > 0 {
		return min(float64(b.burst), q.tokens+b.rate*el.Seconds())
	}
	return q.tokens
}

// hintsBlocked reports whether the global relist holds hints back now.
func (c *core) hintsBlocked() bool {
	return c.relist.phase == relistListing || len(c.relist.todo) > 0
}

// dispatchHints starts single-pod relists for queued pods, oldest first, as
// far as slots, budget and spacing allow.
func (c *core) dispatchHints() {
	q := &c.hints
	if len(q.order) == 0 || c.hintsBlocked() {
		return
	}
	c.refill()
	limited := c.cfg.budget.rate > 0
	for i := 0; i < len(q.order) && c.active < c.cfg.slots; {
		uid := q.order[i]
		r := c.records[uid]
		if r.call != nil {
			// The global relist made a call for the pod since: the hint
			// waits for it.
			q.order = append(q.order[:i], q.order[i+1:]...)
			r.hint.queued, r.hint.again = false, true
			continue
		}
		if c.spaced(r) {
			i++
			continue
		}
		if limited && q.tokens < 1 {
			break
		}
		if limited {
			q.tokens--
		}
		q.order = append(q.order[:i], q.order[i+1:]...)
		r.hint.queued = false
		c.startCall(&call{kind: callListPod, uid: uid, pod: r.pod(), podRelist: c.stepNow, reqSeq: r.requested})
	}
	if len(q.order) == 0 {
		q.order = nil // let the backing array go
	}
}

// hintsDispatchable reports whether a queued pod could start a single-pod
// relist now.
func (c *core) hintsDispatchable() bool {
	if len(c.hints.order) == 0 || c.hintsBlocked() || c.active >= c.cfg.slots {
		return false
	}
	if c.cfg.budget.rate > 0 && c.tokensNow() < 1 {
		return false
	}
	for _, uid := range c.hints.order {
		if !c.spaced(c.records[uid]) {
			return true
		}
	}
	return false
}

// hintWake returns when a queued pod can next be dispatched (zero: none
// waits for time).
func (c *core) hintWake() time.Time {
	q := &c.hints
	if len(q.order) == 0 || c.hintsBlocked() {
		return time.Time{}
	}
	var w time.Time
	if b := c.cfg.budget; b.rate > 0 && q.tokens < 1 {
		w = q.tokensAt.Add(time.Duration((1 - q.tokens) / b.rate * float64(time.Second)))
	}
	if c.cfg.budget.spacing <= 0 {
		return w
	}
	var spaced time.Time
	for _, uid := range q.order {
		r := c.records[uid]
		if !c.spaced(r) {
			return w // one is ready but for the budget (or a slot)
		}
		if t := r.idleRelist.Add(c.cfg.budget.spacing); spaced.IsZero() || t.Before(spaced) {
			spaced = t
		}
	}
	if w.IsZero() || spaced.After(w) {
		return spaced
	}
	return w
}

// foldHints brings the next global relist forward when hints wait for the
// budget.
func (c *core) foldHints() {
	e := c.cfg.budget.early
	if e <= 0 || len(c.hints.order) == 0 || c.relist.phase != relistIdle || c.cfg.budget.rate <= 0 || c.hints.tokens >= 1 {
		return
	}
	if t := c.relist.end.Add(e); t.Before(c.relist.due) {
		c.relist.due, c.relist.early = t, true
	}
}

// coverHints drops the hints that the global listing that started at start
// covers.
func (c *core) coverHints(start time.Time) {
	q := &c.hints
	keep := q.order[:0]
	for _, uid := range q.order {
		r := c.records[uid]
		if covered(r.hint.last, start) {
			r.hint = pendingHint{}
			c.note(note{kind: noteHintSkipped, uid: uid, reason: SkipCovered})
			continue
		}
		keep = append(keep, uid)
	}
	clear(q.order[len(keep):])
	q.order = keep
	// A hint waits for a call only while one is out (afterCall): the calls
	// out, not every record, hold them.
	for _, k := range c.calls {
		if r := c.records[k.uid]; k.kind != callList && r != nil && r.hint.again && covered(r.hint.last, start) {
			r.hint.again = false
		}
	}
}

// onReinspect steps RequestReinspect: the pod is inspected at its next
// relist even if its listing did not change. A pod the core does not know
// needs no request: if it shows up, its first listing has events anyway.
func (c *core) onReinspect(in reinspectIn) {
	r := c.records[in.uid]
	if r == nil {
		return
	}
	c.reqSeq++
	r.requested = c.reqSeq
}

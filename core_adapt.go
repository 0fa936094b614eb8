package pleg

import (
	"time"

	"github.com/podlifecycle/pleg/journal"
	"k8s.io/apimachinery/pkg/types"
)

// The adaptive global relist (docs/semantics.md, "Relisting when there is
// something to find"): while the runtime's event stream is connected and
// the global relists find nothing no event announced, the period between
// global relists doubles after each, from cfg.period up to cfg.maxPeriod.
// It is off unless cfg.maxPeriod is above cfg.period (and in generators
// driven by hand).
//
//   - An unannounced change is a pod whose global listing differs from what
//     events were emitted for, while no hint for it was received since its
//     record last settled (no hint pending, deferred, in flight, or covered
//     by the listing) and none arrives before the relist ends. It is counted
//     by kind whether or not the period adapts, only while the stream has
//     been connected since before the previous global listing started.
//   - Back to cfg.period, for the next adaptHold successful relists at
//     least: an unannounced change; the stream connecting (a replay may
//     follow) or being lost; a hint dropped (the core's queue, or the
//     loop's inbox: hintsLost) or deferred by the budget; a failed listing;
//     the runtime in doubt (runtimeDoubted: its status check was slow or
//     failed). A runtime that stops answering sends no event and closes
//     no stream, so without the last the next listing, the first call to
//     find out, would wait the stretched period.
//     A fall back while waiting brings the next relist forward to a period
//     after the end of the last.
//   - Trust is earned: the period never exceeds 1/AdaptiveTrust of the time
//     the stream has been clean, connected with every change a global
//     relist found announced (since it connected or since the last
//     unannounced change; cleanSince). A runtime that drops events
//     (containerd 1.7 hands each to one of its subscribers) keeps finding
//     unannounced changes and stays near the base period; one that does
//     not reaches a 30 s maximum after two clean minutes.
//   - Without a connected stream the period is cfg.period.
//
// The cache's freshness: while adaptive and streaming, the global
// timestamp moves between global relists, at most once a cfg.period, to
// the time of the loop's last take of its inbox (taken), and only when
// a reader of the cache was waiting at that take (GetNewerThan: the hook
// the generator sets on the cache wakes the loop to take) and everything
// taken is processed: no hint queued, no call out (no single-pod relist,
// no handed-over pod), no global relist running. Nobody waiting, nothing
// moves it and nothing wakes the loop for it: an idle node's loop sleeps
// until the next global relist. Every
// hint received by then has had its single-pod relist or was found to
// change nothing, so no entry is claimed fresher than what the events
// said. It never moves backwards and never past the last take.

// adaptHold is how many successful global relists stay at the base period
// after a fall back.
const adaptHold = 3

// AdaptiveTrust: the adaptive relist's period is at most the time the
// event stream has been clean (connected, every change a global relist
// found announced) over this: a 30 s maximum is reached after two clean
// minutes.
const AdaptiveTrust = 4

// adaptState is the adaptive relist's state.
type adaptState struct {
	period    time.Duration // the period after the next relist ends
	hold      int           // relists left at the base period
	streaming bool
	// connectedAt is when the stream connected (zero: not connected).
	connectedAt time.Time
	// cleanSince is when the stream's clean run began: its connect, or
	// the end of the last global relist that found an unannounced change.
	cleanSince time.Time
	// taken is the time of the loop's last take of its inbox: every hint
	// received before it has been stepped. wanted: a reader of the cache
	// was waiting then.
	taken  time.Time
	wanted bool
	// cacheAt is the cache's global timestamp as the core last set it;
	// freshDue is when it may next move between global relists.
	cacheAt, freshDue time.Time
	// found: the pods the running global relist found changed without a
	// hint, with the change's kind.
	found map[types.UID]string
}

// taken: the loop took its inbox at time at; the inputs taken have been
// stepped before this one. waiters is how many readers of the cache were
// waiting for it to be fresher (podcache.Cache.Waiters) right after.
type taken struct {
	at      time.Time
	waiters int
}

// hintsLost: the loop's inbox dropped hints (it was full).
type hintsLost struct{}

// runtimeDoubted: a call to the runtime outside the loop (the readiness
// check's Status) was slow or failed (Generator.DoubtRuntime).
type runtimeDoubted struct{}

func (taken) isInput()          {}
func (hintsLost) isInput()      {}
func (runtimeDoubted) isInput() {}

// Kinds of unannounced changes, the label values of
// pleg_unannounced_changes_total.
const (
	UnannouncedStarted = "started"
	UnannouncedDied    = "died"
	UnannouncedRemoved = "removed"
	UnannouncedCreated = "created"
	UnannouncedOther   = "other"
)

// adaptive reports whether the global relist's period adapts.
func (c *core) adaptive() bool { return !c.cfg.manual && c.cfg.maxPeriod > c.cfg.period }

// period returns the period after the relist now ending.
func (c *core) period() time.Duration {
	if !c.adaptive() || c.adapt.period < c.cfg.period {
		return c.cfg.period
	}
	return c.adapt.period
}

// toBase brings the period back to the base for adaptHold relists, and the
// next relist forward to a base period after the end of the last.
func (c *core) toBase() {
	c.adapt.period, c.adapt.hold = c.cfg.period, adaptHold
	if !c.adaptive() || c.relist.phase != relistIdle {
		return
	}
	if t := c.relist.end.Add(c.cfg.period); t.Before(c.relist.due) {
		c.relist.due = t
	}
}

// onStream steps a change of the event stream's status.
func (c *core) onStream(s journal.RuntimeStatus) {
	switch s.State {
	case journal.RuntimeEventStreamConnected:
		c.adapt.streaming, c.adapt.connectedAt, c.adapt.cleanSince = true, c.stepNow, c.stepNow
	case journal.RuntimeEventStreamLost:
		c.adapt.streaming, c.adapt.connectedAt, c.adapt.cleanSince = false, time.Time{}, time.Time{}
	default:
		return
	}
	c.toBase()
}

// streamedSince reports whether the stream has been connected since
// before t (and t is not zero).
func (c *core) streamedSince(t time.Time) bool {
	return c.adapt.streaming && !t.IsZero() && c.adapt.connectedAt.Before(t)
}

// unannounced notes pod uid (record r) if its new listing, taken by a
// global listing after the one that started at prev, shows a change no
// hint announced.
func (c *core) unannounced(uid types.UID, r *record, prev time.Time) {
	if r.announced || !changed(r.old, r.current) || !c.streamedSince(prev) {
		return
	}
	if c.adapt.found == nil {
		c.adapt.found = make(map[types.UID]string)
	}
	c.adapt.found[uid] = changeKind(uid, r)
}

// changeKind names the first change between r's old and current listings.
func changeKind(uid types.UID, r *record) string {
	for _, e := range Diff(uid, r.old, r.current) {
		switch e.Type {
		case ContainerStarted:
			return UnannouncedStarted
		case ContainerDied:
			return UnannouncedDied
		case ContainerRemoved:
			return UnannouncedRemoved
		case ContainerChanged:
			if st, _, _ := find(r.old, e.ContainerID); st == stateNonExistent {
				return UnannouncedCreated
			}
		}
	}
	return UnannouncedOther
}

// announce notes that a hint for uid came: a change its global relist
// finds is not unannounced.
func (c *core) announce(uid types.UID) {
	delete(c.adapt.found, uid)
	if r := c.records[uid]; r != nil {
		r.announced = true
	}
}

// settle notes that r's pod was inspected or found unchanged: a hint
// still pending keeps it announced.
func settle(r *record) {
	if !r.hint.pending() {
		r.announced = false
	}
}

// adaptAfterRelist sets the period after the global relist now ending
// (ok: its listing succeeded).
func (c *core) adaptAfterRelist(ok bool) {
	found := c.adapt.found
	c.adapt.found = nil
	for uid, kind := range found {
		c.note(note{kind: noteUnannounced, uid: uid, reason: kind})
	}
	if len(found) > 0 && c.adapt.streaming {
		c.adapt.cleanSince = c.stepNow
	}
	switch {
	case !ok || len(found) > 0 || !c.adapt.streaming:
		c.adapt.period, c.adapt.hold = c.cfg.period, adaptHold
		if !c.adapt.streaming {
			c.adapt.hold = 0
		}
	case c.adapt.hold > 0:
		c.adapt.hold--
		c.adapt.period = c.cfg.period
	default:
		p := min(2*max(c.adapt.period, c.cfg.period), c.cfg.maxPeriod)
		if c.cfg.trust > 0 {
			p = min(p, c.stepNow.Sub(c.adapt.cleanSince)/time.Duration(c.cfg.trust))
		}
		c.adapt.period = max(p, c.cfg.period)
	}
}

// freshen moves the cache's global timestamp between global relists, when
// everything taken from the inbox has been processed (see above).
func (c *core) freshen() {
	a := &c.adapt
	if !c.freshening() || !a.wanted || c.stepNow.Before(a.freshDue) || !a.taken.After(a.cacheAt) || !a.connectedAt.Before(a.taken) {
		return
	}
	c.setCacheTime(a.taken, nil)
	a.freshDue = c.stepNow.Add(c.cfg.period)
}

// setCacheTime moves the cache's global timestamp to at, held pods left
// out; never backwards.
func (c *core) setCacheTime(at time.Time, held []types.UID) {
	if at.Before(c.adapt.cacheAt) {
		return
	}
	c.adapt.cacheAt = at
	c.out.Cache = append(c.out.Cache, cacheOp{kind: cacheTime, at: at, held: held})
}

// freshening reports whether the cache's timestamp may move between global
// relists now: adaptive, streaming, and caught up with everything taken.
func (c *core) freshening() bool {
	return c.adaptive() && c.adapt.streaming && c.relist.phase == relistIdle && c.active == 0 && len(c.hints.order) == 0
}

// freshWake returns when freshen may next move the cache's timestamp (zero:
// not now; what would let it, a call's return or a hint, steps the core).
func (c *core) freshWake() time.Time {
	if !c.freshening() || !c.adapt.wanted || c.adapt.freshDue.IsZero() {
		return time.Time{}
	}
	return c.adapt.freshDue
}

package pleg

import (
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"k8s.io/apimachinery/pkg/types"
)

// core owns every per-pod rule and all per-pod state (docs/semantics.md):
// the records of what events were emitted for, reinspection, the runtime
// calls out (one per pod at most) and their timeouts, hints and their
// budget, the global relist's schedule, IP carry-over, the cache writes and
// the events to publish.
//
// It is a deterministic state machine in the manner of etcd's raft: Step
// takes one input and the time, and returns the effects to carry out
// (Ready). It reads no clock, takes no lock, starts no goroutine and does no
// I/O; the loop (loop.go) owns it, makes the calls it asks for under their
// bounds (calls.go), and feeds their results back as inputs. The scripts in
// testdata/core drive it directly.
//
// The files core_*.go hold its rules by concern: core_relist.go the global
// relist, core_pod.go one pod's inspection and its outcome,
// core_calls.go the calls out and their timeouts, core_hints.go hints, their
// coverage and their budget, core_identity.go containers' identities,
// core_adapt.go the adaptive period and the cache's freshness between
// global relists.
type core struct {
	cfg coreConfig

	// records: every pod the core knows of (listed, delivered for, or
	// with a hint or a call pending).
	records map[types.UID]*record
	// calls: every runtime call out, including abandoned ones (their pod
	// has timed out waiting for them, but they have not returned).
	calls  map[callID]*call
	nextID callID
	// active counts the calls out that are not abandoned: at most
	// cfg.slots.
	active    int
	abandoned int

	relist relistState
	adapt  adaptState // the adaptive period and the cache's freshness (core_adapt.go)
	// gen counts successful global listings; lastRelist is the start of
	// the last one: the health timestamp, and the time before which a hint
	// is covered (its listing already shows what the hint says).
	gen        uint64
	lastRelist time.Time
	// lastListing is the last global listing, to recognize the very same
	// listing again (cruntime.Runtime's contract: an unchanged listing may
	// be returned as the same slice of the same pods).
	lastListing []*cruntime.Pod

	// reachable: whether the last listing succeeded (0: none yet, 1:
	// yes, -1: no).
	reachable int8

	// identityWanted: some watcher wants containers' identities; idTodo:
	// the pods waiting for an identity call.
	identityWanted bool
	idTodo         []types.UID

	hints   hintQueue
	reqSeq  uint64 // numbers RequestReinspect requests
	out     Ready  // the effects of the Step in progress
	stepNow time.Time
}

// coreConfig is what the core needs of Options.
type coreConfig struct {
	period time.Duration // sliding period between global relists
	// maxPeriod: the adaptive relist's longest period (core_adapt.go);
	// not above period: the period never adapts.
	maxPeriod time.Duration
	// trust: the period is at most the stream's clean time over this
	// (AdaptiveTrust; 0: no bound, for scripts of the other rules).
	trust   int
	manual  bool          // global relists start only on relistNow (Generator.Relist)
	slots   int           // calls out at once (MaxParallelInspections)
	timeout time.Duration // bound of each per-pod call (the pod inspection timeout)
	// statusTimeout is the bound of the global relist's status calls: 0
	// when Options.PodInspectionTimeout is negative (no bound but the
	// runtime request timeout, as the kubelet); single-pod relists'
	// calls always have timeout.
	statusTimeout time.Duration
	full          bool // inspect every item, as the kubelet (Options.FullInspection)
	budget        hintBudget
	// check: check the core's invariants after every step (Ready.Broken);
	// the scripts and the fuzzer set it.
	check bool
}

// callID identifies one runtime call the core asked for.
type callID uint64

// record is what the core knows of one pod.
type record struct {
	// old is the listing events have been emitted for; current the
	// latest listing (nil: the pod is not listed), taken by a list call
	// that started at currentAt.
	old, current *cruntime.Pod
	currentAt    time.Time
	// listedGen is the global listing generation (core.gen) that last
	// listed the pod.
	listedGen uint64
	// ips are the IPs of the pod's last successfully cached status: a
	// status without IPs and without a ready sandbox keeps them (the
	// kubelet's carry-over for a dead pod).
	ips []string
	// status is the last successfully inspected status (nil after a
	// failure): the items a delta inspection may reuse.
	status *cruntime.PodStatus
	// flagged: the last inspection failed; the next relist inspects the
	// pod fully even if its listing did not change, and a success emits
	// PodSync if nothing else changed (the kubelet's reinspection).
	flagged bool
	// requested is the number of a RequestReinspect not yet served (0:
	// none): it works as flagged until an inspection that started after it
	// succeeds.
	requested uint64
	// call is the pod's one call out (nil: none).
	call *call
	// owed: a global relist found the pod to inspect while its call was
	// out; the pod is inspected as soon as that call returns, and its cache
	// entry is held out of the relist's cache timestamp until then.
	owed bool
	// hint is the pod's pending hint, if any: queued, or waiting for the
	// call out to return.
	hint pendingHint
	// idleRelist is when the pod's last single-pod relist found nothing
	// to inspect (zero: it found something, or there was none): the
	// budget's per-pod spacing runs from then.
	idleRelist time.Time
	// identity: the identities fetched of the pod's containers, by ID (nil
	// value: asked for, none given); idQueued: waiting for an identity
	// call.
	identity map[string]*cruntime.Identity
	idQueued bool
	// observed: the states fresh runtime events said containers reached,
	// until the pod's next outcome (core_hints.go, observe).
	observed map[string]cruntime.State
	// announced: a hint for the pod came since its record last settled
	// (core_adapt.go).
	announced bool
}

// pod returns the most recent listing of the record.
func (r *record) pod() *cruntime.Pod {
	if r.current != nil {
		return r.current
	}
	return r.old
}

// needsInspection reports whether the record's pod must be inspected: its
// listing makes events since what events were emitted for, or it is
// flagged or asked for.
func (r *record) needsInspection() bool {
	return r.flagged || r.requested != 0 || changed(r.old, r.current)
}

// idle reports whether the record holds nothing worth keeping.
func (r *record) idle() bool {
	return r.old == nil && r.current == nil && r.call == nil && !r.hint.pending() &&
		!r.flagged && r.requested == 0 && !r.owed && !r.idQueued
}

func newCore(cfg coreConfig) *core {
	cfg.slots = max(1, cfg.slots)
	return &core{cfg: cfg, records: make(map[types.UID]*record), calls: make(map[callID]*call)}
}

// record returns the record of uid, creating it.
func (c *core) record(uid types.UID) *record {
	r := c.records[uid]
	if r == nil {
		r = &record{}
		c.records[uid] = r
	}
	return r
}

// forget deletes the record of uid if it holds nothing.
func (c *core) forget(uid types.UID) {
	if r := c.records[uid]; r != nil && r.idle() {
		delete(c.records, uid)
	}
}

// An input is something that happened: time passing, a call's result, a
// hint, a request.
type input interface{ isInput() }

// tick: time passed. waiting names, for each call out, the runtime call it
// is waiting on now (the pool's progress, from cruntime.CallTracer), for the
// errors of calls that time out.
type tick struct{ waiting map[callID]trackedCall }

// relistNow asks for a global relist at once (Generator.Relist).
type relistNow struct{}

// listed: a global relist's list call returned.
type listed struct {
	call callID
	pods []*cruntime.Pod
	err  error
}

// podListed: a single-pod relist's list call returned (pod nil: the
// runtime has nothing for the UID).
type podListed struct {
	call callID
	pod  *cruntime.Pod
	err  error
}

// statusFetched: a status call returned. For a delta inspection, status
// holds only the fetched items' statuses, in the order they were asked for.
type statusFetched struct {
	call       callID
	status     *cruntime.PodStatus // a full inspection's status
	sandboxes  []*cruntime.SandboxStatus
	containers []*cruntime.ContainerStatus
	err        error
}

// hintIn: something suggests that pod uid changed: a runtime event (event
// set, container its ID) or RequestRelist. at is when it happened (the
// event's creation, the request's time).
type hintIn struct {
	uid       types.UID
	at        time.Time
	event     bool
	eventType cruntime.EventType
	container string
}

// reinspectIn: RequestReinspect(uid).
type reinspectIn struct{ uid types.UID }

// identityIn: whether some watcher wants containers' identities now.
type identityIn struct{ wanted bool }

// streamChanged: the runtime's event stream connected or was lost
// (stream.go): a runtime status change for the journal, stamped and
// appended by the loop like every other.
type streamChanged struct{ status journal.RuntimeStatus }

// identitiesFetched: an identity call returned.
type identitiesFetched struct {
	call callID
	ids  []*cruntime.Identity
	err  error
}

func (tick) isInput()              {}
func (relistNow) isInput()         {}
func (listed) isInput()            {}
func (podListed) isInput()         {}
func (statusFetched) isInput()     {}
func (hintIn) isInput()            {}
func (reinspectIn) isInput()       {}
func (identityIn) isInput()        {}
func (identitiesFetched) isInput() {}
func (streamChanged) isInput()     {}

// Ready is what a Step asks the loop to carry out, in this order: start the
// calls, apply the cache operations in order, publish the events in order,
// then report the notes (logs and metrics).
type Ready struct {
	Calls   []callReq
	Cache   []cacheOp
	Publish []publication
	Notes   []note
	// RelistStarted is the start of a global relist that began; Relist
	// is the statistics of one that ended.
	RelistStarted time.Time
	Relist        *RelistStat
	// Healthy is the new health timestamp, when a listing succeeded.
	Healthy time.Time
	// Runtime is the runtime's new status, when it changed: a listing
	// succeeded after none or after a failure, or failed after a
	// success; or its event stream connected or was lost.
	Runtime *journal.RuntimeStatus
	// Abandoned is how many abandoned calls are out after the step.
	Abandoned int
	// Broken is the first invariant the step left broken (core_invariants.go),
	// when the core checks them (coreConfig.check).
	Broken error
}

// Step steps the core with in at time now and returns what to carry out.
func (c *core) Step(now time.Time, in input) Ready {
	c.stepNow = now
	switch in := in.(type) {
	case tick:
		c.expire(in.waiting)
		if c.relist.phase == relistIdle && !c.cfg.manual && !now.Before(c.relist.due) {
			c.startRelist()
		}
	case relistNow:
		if c.relist.phase == relistIdle {
			c.startRelist()
		}
	case listed:
		c.onListed(in)
	case podListed:
		c.onPodListed(in)
	case statusFetched:
		c.onStatus(in)
	case hintIn:
		c.onHint(in)
	case reinspectIn:
		c.onReinspect(in)
	case identityIn:
		c.onIdentityWanted(in.wanted)
	case identitiesFetched:
		c.onIdentities(in)
	case streamChanged:
		c.out.Runtime = &in.status
		c.onStream(in.status)
	case taken:
		c.adapt.taken, c.adapt.wanted = in.at, in.waiters > 0
	case hintsLost, runtimeDoubted:
		c.toBase()
	}
	c.dispatch()
	c.freshen()
	c.out.Abandoned = c.abandoned
	if c.cfg.check {
		c.out.Broken = c.invariants()
	}
	out := c.out
	c.out = Ready{}
	return out
}

// Wake returns when the core next needs a tick: the next global relist, a
// call's deadline, or a hint the budget let wait. The zero time: never.
func (c *core) Wake() time.Time {
	var w time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (w.IsZero() || t.Before(w)) {
			w = t
		}
	}
	if c.relist.phase == relistIdle && !c.cfg.manual {
		earlier(c.relist.due)
	}
	for _, k := range c.calls {
		if !k.abandoned {
			earlier(k.deadline)
		}
	}
	earlier(c.hintWake())
	earlier(c.freshWake())
	return w
}

// Settled reports whether nothing is left to do now but wait for time:
// no global relist runs and no call is out but abandoned ones. Generators
// driven by hand (Generator.Relist) run until it.
func (c *core) Settled() bool {
	return c.relist.phase == relistIdle && c.active == 0 && !c.hintsDispatchable()
}

// LastRelist returns the start of the last successful global listing.
func (c *core) LastRelist() time.Time { return c.lastRelist }

func (c *core) note(n note) { c.out.Notes = append(c.out.Notes, n) }

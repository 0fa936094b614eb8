package pleg

import (
	"sync"

	"github.com/podlifecycle/pleg/journal"
	"k8s.io/apimachinery/pkg/types"
)

// inbox carries inputs from other goroutines (the runtime event stream,
// RequestRelist, RequestReinspect) to the loop, which takes them all each
// time it wakes. Putting never blocks. Hints are bounded (a hint over the
// bound is dropped: hints are only hints, the next global relist covers
// the pod); reinspection requests coalesce per pod and are never dropped;
// the event stream's connections and losses are kept in order and never
// dropped (two at most a connection attempt, which the stream's backoff
// paces).
//
// The inbox's bound is on hints the loop has not taken yet (a hand-off
// that holds one entry per event), not on pods waiting for a single-pod
// relist (the core's queue, whose drops are the core's noteHintDropped):
// each has its own counter, so that pleg_pod_relist_requests_dropped_total
// means what semantics.md says it means.
type inbox struct {
	mu        sync.Mutex
	limit     int
	hints     []hintIn
	reinspect map[types.UID]struct{}
	identity  *bool           // the last identity wish, if any since the last take
	stream    []streamChanged // the event stream's changes, in order
	lost      bool            // hints were dropped since the last take
	doubt     bool            // the runtime was doubted since the last take
	wake      chan struct{}   // capacity 1: "there is something to take"
}

// hint puts h in the inbox (RequestRelist, a runtime event); a hint over
// the inbox's bound is dropped and counted (pleg_hints_inbox_dropped_total).
// It reports whether h was put.
func (g *Generator) hint(h hintIn) bool {
	ok := g.inbox.hint(h)
	if !ok {
		g.m.HintsInboxDropped.Inc()
	}
	return ok
}

func newInbox(limit int) *inbox {
	return &inbox{limit: limit, reinspect: make(map[types.UID]struct{}), wake: make(chan struct{}, 1)}
}

// hint puts h; it reports false when the inbox is full.
func (b *inbox) hint(h hintIn) bool {
	b.mu.Lock()
	if len(b.hints) >= b.limit {
		b.lost = true
		b.mu.Unlock()
		return false
	}
	b.hints = append(b.hints, h)
	b.mu.Unlock()
	b.signal()
	return true
}

func (b *inbox) reinspectPod(uid types.UID) {
	b.mu.Lock()
	b.reinspect[uid] = struct{}{}
	b.mu.Unlock()
	b.signal()
}

// streamChanged puts a change of the event stream's status: the loop
// appends it to the journal (the journal's one writer), stamped with the
// loop's clock.
func (b *inbox) streamChanged(s journal.RuntimeStatus) {
	b.mu.Lock()
	b.stream = append(b.stream, streamChanged{status: s})
	b.mu.Unlock()
	b.signal()
}

// doubtRuntime puts runtimeDoubted, coalesced with any not taken yet.
func (b *inbox) doubtRuntime() {
	b.mu.Lock()
	b.doubt = true
	b.mu.Unlock()
	b.signal()
}

func (b *inbox) identityWanted(wanted bool) {
	b.mu.Lock()
	b.identity = &wanted
	b.mu.Unlock()
	b.signal()
}

func (b *inbox) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// take returns everything put since the last take: the event stream's
// changes in the order they came, hintsLost if hints were dropped,
// runtimeDoubted if the runtime was doubted, reinspection requests, then
// hints in the order they came. into is
// reused.
func (b *inbox) take(into []input) []input {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.stream {
		into = append(into, s)
	}
	if b.lost {
		into = append(into, hintsLost{})
		b.lost = false
	}
	if b.doubt {
		into = append(into, runtimeDoubted{})
		b.doubt = false
	}
	clear(b.stream)
	b.stream = b.stream[:0]
	if b.identity != nil {
		into = append(into, identityIn{wanted: *b.identity})
		b.identity = nil
	}
	for uid := range b.reinspect {
		into = append(into, reinspectIn{uid: uid})
	}
	clear(b.reinspect)
	for _, h := range b.hints {
		into = append(into, h)
	}
	clear(b.hints)
	b.hints = b.hints[:0]
	return into
}

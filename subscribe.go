package pleg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/metrics"
	"k8s.io/apimachinery/pkg/types"
)

// ErrStopped is returned by Subscription.Next once its generator stopped
// (Generator.Stop ends every subscription). It is an ErrClosed.
var ErrStopped = fmt.Errorf("%w: the generator stopped", ErrClosed)

// Subscription receives every lifecycle event of a generator, in order,
// from the generator's journal: first a resync with the state of every
// pod, then the events. A subscriber that falls behind the journal's
// retention gets a resync instead of the events it missed; nothing is lost
// silently, and a subscriber never holds up the generator.
type Subscription struct {
	g *Generator
	j *journal.Journal
	// ctx is done when the subscription is closed (cause ErrClosed) or
	// the generator stops: it ends a Next waiting on another goroutine.
	ctx    context.Context
	cancel context.CancelCauseFunc
	m      *metrics.Metrics
	log    logr.Logger

	// turn is held (a value in it) by the one Next or end that reads or
	// changes w, pending, closed and err: a Next waits for its turn only
	// as long as its context lets it, never on a lock held across
	// another Next's wait.
	turn    chan struct{}
	w       *journal.Watcher // nil once closed
	pending []Event          // the rest of the last entry's events
	closed  bool
	err     error // once closed: ErrClosed or ErrStopped
}

// subscriptions are a generator's open subscriptions, which Stop ends.
type subscriptions struct {
	mu    sync.Mutex
	open  map[*Subscription]struct{}
	ended bool // Stop ended them: no more open
}

// Subscribe returns a subscription that receives every event, in order per
// pod. Its first update is a resync with the state of every pod; a
// subscription that falls behind the journal's retention (Options.Journal)
// gets a resync instead of the events it missed. Close it when done, or
// Stop the generator: Stop ends every subscription (Next then returns
// ErrStopped), and a subscription made after Stop is ended already.
func (g *Generator) Subscribe() *Subscription {
	ctx, cancel := context.WithCancelCause(g.rootCtx)
	s := &Subscription{g: g, j: g.journal, ctx: ctx, cancel: cancel, m: g.m, log: g.log, turn: make(chan struct{}, 1)}
	g.subs.mu.Lock()
	defer g.subs.mu.Unlock()
	if g.subs.ended {
		s.closed, s.err = true, ErrStopped
		cancel(ErrStopped)
		return s
	}
	s.w, _ = g.journal.Watch("", nil) // no cursor: cannot fail
	if g.subs.open == nil {
		g.subs.open = make(map[*Subscription]struct{})
	}
	g.subs.open[s] = struct{}{}
	return s
}

// endSubscriptions ends every open subscription (Stop): their Next
// returns ErrStopped, and their journal watchers are closed.
func (g *Generator) endSubscriptions() {
	g.subs.mu.Lock()
	open := g.subs.open
	g.subs.open, g.subs.ended = nil, true
	g.subs.mu.Unlock()
	for s := range open {
		s.end(ErrStopped)
	}
}

// Next returns the next update, blocking until there is one, the context
// ends, or the subscription is closed (ErrClosed) or its generator
// stopped (ErrStopped).
func (s *Subscription) Next(ctx context.Context) (Update, error) {
	select {
	case s.turn <- struct{}{}:
	default:
		if err := s.waitTurn(ctx); err != nil {
			return Update{}, err
		}
	}
	defer func() { <-s.turn }()
	if s.closed {
		return Update{}, s.err
	}
	if len(s.pending) > 0 {
		e := s.pending[0]
		s.pending = s.pending[1:]
		return Update{Event: e}, nil
	}
	// The watcher's Next ends with ctx, or when the subscription is
	// closed or the generator stops.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	var pods []PodState
	for {
		m, err := s.w.Next(wctx)
		if err != nil {
			if ctx.Err() == nil && s.ctx.Err() != nil {
				return Update{}, s.endedErr()
			}
			return Update{}, err
		}
		switch m.Type {
		case journal.Snapshot:
			pods = append(pods, podState(m.Pod))
		case journal.SnapshotEnd:
			if pods == nil {
				pods = []PodState{}
			}
			return Update{Resync: true, Pods: pods}, nil
		case journal.ResyncRequired:
			// Fell behind the retention: start over with a snapshot.
			s.m.SubscriberResyncs.Inc()
			s.log.Info("Subscriber fell behind the journal; it is resynced", "reason", m.Reason)
			s.w.Close()
			s.w, _ = s.j.Watch("", nil)
		case journal.Event:
			events := eventsOf(m)
			if len(events) == 0 {
				continue
			}
			s.pending = events[1:]
			return Update{Event: events[0]}, nil
		}
	}
}

// endedErr is the error of a subscription whose ctx is done: ErrClosed if
// Close ended it, ErrStopped if its generator stopped.
func (s *Subscription) endedErr() error {
	if c := context.Cause(s.ctx); errors.Is(c, ErrClosed) && !errors.Is(c, ErrStopped) {
		return ErrClosed
	}
	return ErrStopped // the generator's context, or Stop
}

// waitTurn waits for the turn while ctx lets it and the subscription is
// open.
func (s *Subscription) waitTurn(ctx context.Context) error {
	select {
	case s.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		if ctx.Err() == nil {
			return s.endedErr()
		}
		return ctx.Err()
	}
}

// Close ends the subscription; Next then returns ErrClosed, also a Next
// waiting on another goroutine. Closing a subscription its generator's
// Stop ended does nothing.
func (s *Subscription) Close() {
	s.g.subs.mu.Lock()
	delete(s.g.subs.open, s)
	s.g.subs.mu.Unlock()
	s.end(ErrClosed)
}

// end closes the subscription with err (unless it is closed already):
// its journal watcher is closed and what it holds let go.
func (s *Subscription) end(err error) {
	s.cancel(err) // before the turn: a waiting Next holds it, and returns
	s.turn <- struct{}{}
	defer func() { <-s.turn }()
	if s.closed {
		return
	}
	s.closed, s.err = true, err
	s.w.Close()
	s.w, s.pending = nil, nil
}

// podState is the subscription's view of a journal pod.
func podState(p *journal.Pod) PodState {
	ps := PodState{UID: p.UID, Name: p.Name, Namespace: p.Namespace,
		Containers: make([]ContainerState, 0, len(p.Sandboxes)+len(p.Containers))}
	for _, s := range p.Sandboxes {
		ps.Containers = append(ps.Containers, ContainerState{ID: s.ID, Name: s.Name, Sandbox: true, State: stateOf(s.State).String()})
	}
	for _, c := range p.Containers {
		ps.Containers = append(ps.Containers, ContainerState{ID: c.ID, Name: c.Name, State: stateOf(c.State).String()})
	}
	return ps
}

// eventsOf returns the lifecycle events of a journal event.
func eventsOf(m journal.Message) []Event {
	out := make([]Event, 0, len(m.Transitions))
	for _, t := range m.Transitions {
		if t.Type == journal.PodUpdated {
			continue
		}
		out = append(out, Event{Time: m.Time, Type: EventType(t.Type), PodUID: m.Pod.UID, PodName: m.Pod.Name,
			PodNamespace: m.Pod.Namespace, ContainerID: t.ContainerID, ContainerName: t.ContainerName,
			Sandbox: t.Sandbox, ExitCode: t.ExitCode})
	}
	return out
}

// journalEntry is the journal's record of a publication at now.
func journalEntry(p publication, now time.Time) journal.Entry {
	e := journal.Entry{Kind: journal.KindPod, Time: now, Pod: journalPod(p.uid, p.last, p.pod, p.status, p.identities, now), Source: journal.SourceHint,
		Transitions: make([]journal.Transition, 0, len(p.events))}
	if p.relist {
		e.Source = journal.SourceRelist
	}
	for _, ev := range p.events {
		e.Transitions = append(e.Transitions, journal.Transition{Type: string(ev.Type), ContainerID: ev.ContainerID,
			ContainerName: ev.ContainerName, Sandbox: ev.Sandbox, ExitCode: ev.ExitCode})
	}
	return e
}

// journalPod is the state of pod uid: its listing (nil: gone, last: the
// listing before) joined with its status, its sandboxes and containers
// newest first (by creation, as listed), as docs/stream.md says.
func journalPod(uid types.UID, last, listing *cruntime.Pod, status *cruntime.PodStatus, ids map[string]*cruntime.Identity, now time.Time) *journal.Pod {
	if listing == nil {
		p := &journal.Pod{UID: uid, Gone: true, ObservedAt: now}
		if last != nil {
			p.Name, p.Namespace = last.Name, last.Namespace
		}
		return p
	}
	p := &journal.Pod{UID: uid, Name: listing.Name, Namespace: listing.Namespace, ObservedAt: now,
		Sandboxes: make([]*journal.Sandbox, 0, len(listing.Sandboxes)), Containers: make([]*journal.Container, 0, len(listing.Containers))}
	// One array of each: the journal shares those unchanged with the
	// pod's last state (journal.Pod) and then copies the others out.
	sbArr := make([]journal.Sandbox, len(listing.Sandboxes))
	ctArr := make([]journal.Container, len(listing.Containers))
	if status == nil {
		status = &cruntime.PodStatus{}
	}
	p.IPs = status.IPs
	sbs := map[string]*cruntime.SandboxStatus{}
	for _, s := range status.SandboxStatuses {
		sbs[s.ID] = s
	}
	for i, c := range newestFirst(listing.Sandboxes) {
		s := &sbArr[i]
		*s = journal.Sandbox{ID: c.ID, Name: c.Name, State: c.State, Attempt: c.Attempt}
		if st := sbs[c.ID]; st != nil {
			s.CreatedAt, s.IPs, s.HostNetwork, s.Labels, s.Annotations = st.CreatedAt, st.IPs, st.HostNetwork, st.Labels, st.Annotations
		}
		p.Sandboxes = append(p.Sandboxes, s)
	}
	cts := map[string]*cruntime.ContainerStatus{}
	for _, s := range status.ContainerStatuses {
		cts[s.ID] = s
	}
	for i, c := range newestFirst(listing.Containers) {
		jc := &ctArr[i]
		*jc = journal.Container{ID: c.ID, Name: c.Name, State: c.State, Attempt: c.Attempt, Image: c.Image, ListCreatedAt: c.CreatedAt}
		if st := cts[c.ID]; st != nil {
			// The cache's status, shared: statuses are not changed once
			// made.
			*jc = jc.WithStatus(st)
			if st.Image != "" {
				jc.Image = st.Image
			}
		}
		if id := ids[c.ID]; id != nil {
			jc.Identity = &journal.Identity{PID: id.PID, CgroupPath: id.CgroupPath}
		}
		p.Containers = append(p.Containers, jc)
	}
	// The pod's labels and annotations are its newest sandbox's.
	var newest *journal.Sandbox
	for _, s := range p.Sandboxes {
		if newest == nil || s.CreatedAt.After(newest.CreatedAt) {
			newest = s
		}
	}
	if newest != nil {
		p.Labels, p.Annotations = newest.Labels, newest.Annotations
	}
	return p
}

// newestFirst returns cs ordered by creation time, newest first (ties in
// their listed order); cs itself when it already is.
func newestFirst(cs []*cruntime.Container) []*cruntime.Container {
	newer := func(a, b *cruntime.Container) int { return cmp.Compare(b.CreatedAt, a.CreatedAt) }
	if slices.IsSortedFunc(cs, newer) {
		return cs
	}
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, newer)
	return cs
}

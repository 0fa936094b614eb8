package pleg

import (
	"context"
	"errors"
	"sort"
	"sync"

	"github.com/go-logr/logr"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"k8s.io/apimachinery/pkg/types"
)

// ErrClosed is returned by Subscription.Next once the subscription or its
// generator is closed.
var ErrClosed = errors.New("pleg: subscription closed")

// Update is what a subscription delivers: a lifecycle event, or a resync.
type Update struct {
	// Event is the lifecycle event, unless Resync is true.
	Event Event
	// Resync is true when Pods replaces everything the subscriber knew:
	// the first update of every subscription, and the update that follows
	// when a subscriber fell too far behind (instead of the events it
	// missed). Events after it apply on top of it.
	Resync bool
	Pods   []PodState
}

// PodState is the state of one pod as of the events delivered so far.
type PodState struct {
	UID        types.UID        `json:"podUID"`
	Name       string           `json:"podName"`
	Namespace  string           `json:"podNamespace"`
	Containers []ContainerState `json:"containers"`
}

// ContainerState is the state of one container or sandbox of a PodState.
type ContainerState struct {
	ID      string `json:"containerID"`
	Name    string `json:"containerName,omitempty"`
	Sandbox bool   `json:"sandbox,omitempty"`
	// State is "running", "exited" or "unknown".
	State string `json:"state"`
}

// hub delivers events: to the kubelet-compatible channel, which drops on a
// full buffer, and to subscriptions, which never lose an event silently.
type hub struct {
	log      logr.Logger
	m        *metrics.Metrics
	capacity int
	buffer   int

	// mu guards the fields below. It is never held while logging or
	// while pushing to subscriptions (each has its own lock); lock order
	// is hub, then subscription.
	mu     sync.Mutex
	ch     chan *Event
	subs   map[*Subscription]struct{}
	pods   map[types.UID]*cruntime.Pod // the listing events were delivered for
	seq    uint64                      // publishes so far: the state pods is at
	closed bool

	// scratch is the publisher's copy of subs (publish is called from
	// one goroutine at a time: the relist goroutine).
	scratch []*Subscription
}

func newHub(capacity, buffer int, log logr.Logger, m *metrics.Metrics) *hub {
	return &hub{log: log, m: m, capacity: capacity, buffer: buffer,
		subs: make(map[*Subscription]struct{}), pods: make(map[types.UID]*cruntime.Pod)}
}

func (h *hub) watch() <-chan *Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ch == nil {
		h.ch = make(chan *Event, h.capacity)
		if h.closed {
			close(h.ch)
		}
	}
	return h.ch
}

// publish delivers the events of one pod and records pod (nil: gone) as
// the state they lead to. The relist goroutine calls it; it never blocks on
// a consumer, and holds no lock while it logs.
func (h *hub) publish(uid types.UID, pod *cruntime.Pod, events []Event) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	if pod == nil {
		delete(h.pods, uid)
	} else {
		h.pods[uid] = pod
	}
	h.seq++
	seq := h.seq
	discarded := 0
	if h.ch != nil {
		// Under the lock: close() closes the channel.
		for i := range events {
			ev := events[i]
			select {
			case h.ch <- &ev:
			default:
				discarded++
			}
		}
	}
	subs := h.scratch[:0]
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.scratch = subs
	h.mu.Unlock()

	for i := range events {
		e := &events[i]
		h.m.EventsDelivered.WithLabelValues(string(e.Type)).Inc()
		if h.log.V(2).Enabled() {
			h.log.V(2).Info("SyncLoop (PLEG): event for pod", "pod", e.Pod(), "event", logEvent{e})
		}
	}
	for range discarded {
		h.m.DiscardEvents.Inc()
		h.log.Error(nil, "Event channel is full, discard this relist() cycle event")
	}
	for i, s := range subs {
		if s.push(seq, events) {
			h.m.SubscriberResyncs.Inc()
			h.log.Info("Subscriber fell behind; it will be resynced", "buffer", s.limit)
		}
		subs[i] = nil
	}
}

// logEvent renders an event the way the kubelet logs it.
type logEvent struct{ e *Event }

func (l logEvent) MarshalLog() any {
	data := any(l.e.ContainerID)
	if l.e.Type == PodSync {
		data = nil
	}
	return struct {
		ID   types.UID
		Type EventType
		Data any
	}{l.e.PodUID, l.e.Type, data}
}

// snapshotLocked returns the listings of every pod, for snapshot.
func (h *hub) snapshotLocked() []*cruntime.Pod {
	pods := make([]*cruntime.Pod, 0, len(h.pods))
	for _, p := range h.pods {
		pods = append(pods, p)
	}
	return pods
}

// snapshot returns the state of every pod, sorted by namespace/name. It
// runs without the hub's lock: the listings it reads are never changed once
// published.
func snapshot(pods []*cruntime.Pod) []PodState {
	out := make([]PodState, 0, len(pods))
	for _, p := range pods {
		ps := PodState{UID: p.UID, Name: p.Name, Namespace: p.Namespace,
			Containers: make([]ContainerState, 0, len(p.Containers)+len(p.Sandboxes))}
		for _, s := range p.Sandboxes {
			ps.Containers = append(ps.Containers, ContainerState{ID: s.ID, Name: s.Name, Sandbox: true, State: stateOf(s.State).String()})
		}
		for _, c := range p.Containers {
			ps.Containers = append(ps.Containers, ContainerState{ID: c.ID, Name: c.Name, State: stateOf(c.State).String()})
		}
		out = append(out, ps)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].UID < out[j].UID
	})
	return out
}

func (h *hub) subscribe() *Subscription {
	s := &Subscription{h: h, wake: make(chan struct{}, 1), resync: true, limit: h.buffer}
	h.mu.Lock()
	if h.closed {
		s.closed = true
	} else {
		h.subs[s] = struct{}{}
	}
	h.mu.Unlock()
	return s
}

func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	if h.ch != nil {
		close(h.ch)
	}
	for s := range h.subs {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.signal()
	}
	clear(h.subs)
}

// Subscription receives every event of a generator, in order per pod.
type Subscription struct {
	h     *hub
	wake  chan struct{}
	limit int

	mu     sync.Mutex
	queue  []Event
	resync bool   // the next update is a resync
	seen   uint64 // the hub's seq of the last resync: older publishes are in it
	closed bool
}

// push queues the events of publish number seq. A full queue turns into a
// pending resync: the queued events are dropped, and the subscriber will
// get the state they led to instead. It reports whether that happened.
func (s *Subscription) push(seq uint64, events []Event) (resynced bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.resync || seq <= s.seen {
		return false // the snapshot of the next (or last) resync includes them
	}
	if len(s.queue)+len(events) > s.limit {
		s.queue = nil
		s.resync = true
		s.signal()
		return true
	}
	s.queue = append(s.queue, events...)
	if len(events) > 0 {
		s.signal()
	}
	return false
}

func (s *Subscription) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Next returns the next update, blocking until there is one, the context
// ends, or the subscription is closed (ErrClosed).
func (s *Subscription) Next(ctx context.Context) (Update, error) {
	for {
		if u, ok, err := s.next(); ok || err != nil {
			return u, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Update{}, ctx.Err()
		}
	}
}

// next returns the next update if there is one.
func (s *Subscription) next() (Update, bool, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Update{}, false, ErrClosed
	}
	if s.resync {
		s.mu.Unlock()
		// The snapshot and the seq it is at come from the hub; taking the
		// subscription's lock inside keeps pushes from slipping between.
		s.h.mu.Lock()
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.h.mu.Unlock()
			return Update{}, false, ErrClosed
		}
		s.resync = false
		s.queue = nil
		s.seen = s.h.seq
		pods := s.h.snapshotLocked()
		s.mu.Unlock()
		s.h.mu.Unlock()
		return Update{Resync: true, Pods: snapshot(pods)}, true, nil
	}
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		e := s.queue[0]
		s.queue[0] = Event{}
		s.queue = s.queue[1:]
		if len(s.queue) == 0 {
			s.queue = nil // let the backing array go
		}
		return Update{Event: e}, true, nil
	}
	return Update{}, false, nil
}

// Close ends the subscription; Next then returns ErrClosed.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	delete(s.h.subs, s)
	s.h.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.signal()
}

package pleg

import (
	"errors"
	"sync"

	"github.com/go-logr/logr"
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
	// when a subscriber fell behind the journal's retention (instead of
	// the events it missed). Events after it apply on top of it.
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

// hub delivers events to the kubelet-compatible channel, which drops on a
// full buffer as the kubelet's does, and logs and counts them.
// Subscriptions read the journal instead (subscribe.go).
type hub struct {
	log      logr.Logger
	m        *metrics.Metrics
	capacity int

	// mu guards ch and closed; it is never held while logging.
	mu     sync.Mutex
	ch     chan *Event
	closed bool
}

func newHub(capacity int, log logr.Logger, m *metrics.Metrics) *hub {
	return &hub{log: log, m: m, capacity: capacity}
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

// publish delivers the events of one pod. The loop calls it; it never
// blocks on a consumer, and holds no lock while it logs.
func (h *hub) publish(events []Event) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
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
}

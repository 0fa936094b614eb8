package sim

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// subscriber is one GetContainerEvents stream. Events are queued without
// blocking the model; when the queue is full they are dropped.
type subscriber struct {
	ch     chan *runtimeapi.ContainerEventResponse
	closed chan struct{} // closed when events are switched off
}

// EventStats counts container events.
type EventStats struct {
	// Emitted is the number of events the model produced while events
	// were on (whether or not anyone was subscribed).
	Emitted int64
	// Queued is the number of (event, subscriber) deliveries queued.
	Queued int64
	// DroppedFull counts deliveries dropped because a subscriber's buffer
	// was full (a slow subscriber).
	DroppedFull int64
	// DroppedRandom counts deliveries dropped by EventDropRate.
	DroppedRandom int64
}

// EventStats returns the event counters.
func (r *Runtime) EventStats() EventStats {
	return EventStats{
		Emitted:       r.evEmitted.Load(),
		Queued:        r.evQueued.Load(),
		DroppedFull:   r.evDroppedFull.Load(),
		DroppedRandom: r.evDroppedRandom.Load(),
	}
}

// Subscribers returns the number of open GetContainerEvents streams.
func (r *Runtime) Subscribers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

// emitLocked sends one event about id (a container, or the sandbox sb
// itself) to every subscriber. The payload carries the status of sb and the
// statuses of every container of its pod, as they are now.
func (r *Runtime) emitLocked(typ runtimeapi.ContainerEventType, id string, sb *sandbox) {
	r.kmu.Lock()
	on := r.events
	r.kmu.Unlock()
	if !on {
		return
	}
	r.evEmitted.Add(1)
	if len(r.subs) == 0 {
		return
	}
	ev := &runtimeapi.ContainerEventResponse{
		ContainerId:        id,
		ContainerEventType: typ,
		CreatedAt:          r.now(),
		PodSandboxStatus:   r.sandboxStatus(sb),
		ContainersStatuses: podContainerStatuses(sb.pod),
	}
	// Subscribers in a stable order (subscription order) so that the fault
	// generator is used in a reproducible way.
	for _, s := range r.subs {
		if r.dropEvent() {
			r.evDroppedRandom.Add(1)
			continue
		}
		select {
		case s.ch <- ev:
			r.evQueued.Add(1)
		default:
			r.evDroppedFull.Add(1)
		}
	}
}

func (r *Runtime) dropEvent() bool {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return r.dropRate > 0 && r.frng.Float64() < r.dropRate
}

func (r *Runtime) subscribe() *subscriber {
	s := &subscriber{
		ch:     make(chan *runtimeapi.ContainerEventResponse, r.eventBuffer),
		closed: make(chan struct{}),
	}
	r.mu.Lock()
	r.subs = append(r.subs, s)
	r.mu.Unlock()
	return s
}

func (r *Runtime) unsubscribe(s *subscriber) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.subs {
		if o == s {
			r.subs = append(r.subs[:i:i], r.subs[i+1:]...)
			return
		}
	}
}

// closeSubscribers ends every open stream (events switched off).
func (r *Runtime) closeSubscribers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.subs {
		close(s.closed)
	}
	r.subs = nil
}

package sim

import (
	"maps"
	"slices"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// subscriber is one GetContainerEvents stream. Events are queued without
// blocking the model; when the queue is full they are dropped.
type subscriber struct {
	ch     chan *runtimeapi.ContainerEventResponse
	closed chan struct{} // closed when events are switched off
	// held is an event held back to be sent after the next
	// (SetEventReorderRate); guarded by the runtime's mu, as emitLocked.
	held *runtimeapi.ContainerEventResponse
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
	// Reordered counts deliveries held back by EventReorderRate (sent
	// after the next, or never: see Runtime.SetEventReorderRate).
	Reordered int64
}

// EventStats returns the event counters.
func (r *Runtime) EventStats() EventStats {
	return EventStats{
		Emitted:       r.evEmitted.Load(),
		Queued:        r.evQueued.Load(),
		DroppedFull:   r.evDroppedFull.Load(),
		DroppedRandom: r.evDroppedRandom.Load(),
		Reordered:     r.evReordered.Load(),
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
	on, keep := r.events, r.keepEvents
	r.kmu.Unlock()
	if !on {
		return
	}
	r.evEmitted.Add(1)
	if len(r.subs) == 0 && keep <= 0 {
		return
	}
	ev := r.eventLocked(typ, id, sb, r.now())
	if len(r.subs) == 0 {
		// Kept for the next subscriber (SetKeepEvents), the oldest
		// dropped beyond the buffer.
		r.kept = append(r.kept, ev)
		if over := len(r.kept) - r.eventBuffer; over > 0 {
			r.kept = append(r.kept[:0:0], r.kept[over:]...)
		}
		return
	}
	// Subscribers in a stable order (subscription order) so that the fault
	// generator is used in a reproducible way.
	for _, s := range r.subs {
		if r.dropEvent() {
			r.evDroppedRandom.Add(1)
			continue
		}
		if s.held == nil && r.reorderEvent() {
			s.held = ev
			r.evReordered.Add(1)
			continue
		}
		r.sendLocked(s, ev)
		if h := s.held; h != nil {
			s.held = nil
			r.sendLocked(s, h)
		}
	}
}

// sendLocked queues ev for s, or counts it dropped when s's buffer is full.
func (r *Runtime) sendLocked(s *subscriber, ev *runtimeapi.ContainerEventResponse) {
	select {
	case s.ch <- ev:
		r.evQueued.Add(1)
	default:
		r.evDroppedFull.Add(1)
	}
}

func (r *Runtime) reorderEvent() bool {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return r.reorderRate > 0 && r.frng.Float64() < r.reorderRate
}

func (r *Runtime) eventLocked(typ runtimeapi.ContainerEventType, id string, sb *sandbox, createdAt int64) *runtimeapi.ContainerEventResponse {
	return &runtimeapi.ContainerEventResponse{
		ContainerId:        id,
		ContainerEventType: typ,
		CreatedAt:          createdAt,
		PodSandboxStatus:   r.sandboxStatus(sb),
		ContainersStatuses: podContainerStatuses(sb.pod),
	}
}

func (r *Runtime) dropEvent() bool {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return r.dropRate > 0 && r.frng.Float64() < r.dropRate
}

// subscribe adds a subscriber and returns it with the events to send it
// before the live ones: the events kept while nobody subscribed (oldest
// first, those younger than the keep time), then the replayed ones.
func (r *Runtime) subscribe() (*subscriber, []*runtimeapi.ContainerEventResponse) {
	s := &subscriber{
		ch:     make(chan *runtimeapi.ContainerEventResponse, r.eventBuffer),
		closed: make(chan struct{}),
	}
	r.kmu.Lock()
	keep, n, age := r.keepEvents, r.replayN, r.replayAge
	r.kmu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	var first []*runtimeapi.ContainerEventResponse
	if keep > 0 {
		oldest := r.now() - int64(keep)
		for _, ev := range r.kept {
			if ev.CreatedAt >= oldest {
				first = append(first, ev)
			}
		}
	}
	r.kept = nil
	first = append(first, r.replayLocked(n, age)...)
	r.subs = append(r.subs, s)
	return s, first
}

// replayLocked returns n old events, created age ago, about the sandboxes
// and containers of the model in turn (creation order, again from the
// first when there are fewer than n): each says the item's current state
// (created, started or stopped) and carries its pod's statuses as they
// are now.
func (r *Runtime) replayLocked(n int, age time.Duration) []*runtimeapi.ContainerEventResponse {
	if n <= 0 {
		return nil
	}
	type item struct {
		id  string
		typ runtimeapi.ContainerEventType
		sb  *sandbox
	}
	var items []item
	for _, p := range r.order {
		for _, sb := range p.sandboxes {
			typ := runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
			if sb.state != runtimeapi.PodSandboxState_SANDBOX_READY {
				typ = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
			}
			items = append(items, item{sb.id, typ, sb})
		}
		for _, c := range p.containers {
			items = append(items, item{c.id, containerEventType(c.state), c.sandbox})
		}
	}
	if len(items) == 0 {
		return nil
	}
	at := r.now() - int64(age)
	out := make([]*runtimeapi.ContainerEventResponse, n)
	for i := range out {
		it := items[i%len(items)]
		out[i] = r.eventLocked(it.typ, it.id, it.sb, at)
	}
	return out
}

// containerEventType is the event that brought a container to state.
func containerEventType(state runtimeapi.ContainerState) runtimeapi.ContainerEventType {
	switch state {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	}
	return runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
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

// Event generators and replays: faults of the event stream.

// SetKeepEvents makes the runtime keep the events emitted while nobody
// subscribes, for d of the runtime's clock (at most Config.EventBuffer of
// them, the oldest dropped first), and send them to the next subscriber
// before the live events, with their own CreatedAt, as containerd 2.x does
// after a client reconnects (it keeps them 5 minutes). 0 keeps none and
// forgets those kept.
func (r *Runtime) SetKeepEvents(d time.Duration) {
	r.kmu.Lock()
	r.keepEvents = max(d, 0)
	r.kmu.Unlock()
	if d <= 0 {
		r.mu.Lock()
		r.kept = nil
		r.mu.Unlock()
	}
}

// SetReplay makes every new GetContainerEvents subscriber receive n old
// events before the live ones, about the model's sandboxes and containers
// in turn, with CreatedAt age ago (by the runtime's clock; a non-positive
// age means DefaultReplayAge): what a client sees when it reconnects to a
// runtime that kept minutes of events, without waiting minutes. n <= 0
// replays none.
func (r *Runtime) SetReplay(n int, age time.Duration) {
	if age <= 0 {
		age = DefaultReplayAge
	}
	r.kmu.Lock()
	r.replayN, r.replayAge = max(n, 0), age
	r.kmu.Unlock()
}

// EmitEvents makes the runtime stream a container event for pod uid every
// interval of real time, with CreatedAt now, as a runtime does for a
// crash-looping or flapping container: a STOPPED then a STARTED event about
// each of the pod's containers in turn (its sandbox when it has none),
// carrying the pod's statuses. The events are the stream's only: the model
// does not change, so a listing of the pod stays the same. The events go
// through the stream's faults (SetEvents, SetEventDropRate, a full
// subscriber buffer) and count in EventStats. A pod that does not exist
// (yet, or any more) gets no event. every <= 0 stops the pod's events.
// Stop ends every generator.
func (r *Runtime) EmitEvents(uid string, every time.Duration) {
	r.kmu.Lock()
	old := r.emitters[uid]
	delete(r.emitters, uid)
	var g *generator
	if every > 0 {
		g = newGenerator()
		r.emitters[uid] = g
	}
	r.kmu.Unlock()
	old.end()
	if g == nil {
		return
	}
	var turn int
	r.startGenerator(g, every, func() {
		r.mu.Lock()
		if p := r.pods[uid]; p != nil {
			r.flapLocked(p, turn)
			turn++
		}
		r.mu.Unlock()
	})
}

// generator is a goroutine emitting events (EmitEvents, SetEventStorm).
type generator struct {
	stop, done chan struct{}
}

func newGenerator() *generator {
	return &generator{stop: make(chan struct{}), done: make(chan struct{})}
}

// end stops the generator and waits for it (nil-safe).
func (g *generator) end() {
	if g == nil {
		return
	}
	close(g.stop)
	<-g.done
}

// startGenerator calls tick every interval of real time on an owned
// goroutine until g ends or the runtime stops.
func (r *Runtime) startGenerator(g *generator, every time.Duration, tick func()) {
	r.smu.Lock()
	defer r.smu.Unlock()
	if r.stopped {
		close(g.done)
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(g.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-r.stopCh:
				return
			case <-t.C:
				tick()
			}
		}
	}()
}

// Emitting returns the UIDs of the pods EmitEvents streams events for,
// sorted.
func (r *Runtime) Emitting() []string {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return slices.Sorted(maps.Keys(r.emitters))
}

// flapLocked emits the turn-th event of a flapping pod: STOPPED (even
// turns) or STARTED (odd turns) about its containers in turn, two events
// each.
func (r *Runtime) flapLocked(p *pod, turn int) {
	typ := runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	if turn%2 == 1 {
		typ = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	}
	r.aboutPodLocked(p, turn/2, typ)
}

// aboutPodLocked emits an event of type typ about the i-th container of
// the pod (in turn), or about its sandbox when it has no container.
func (r *Runtime) aboutPodLocked(p *pod, i int, typ runtimeapi.ContainerEventType) {
	if n := len(p.containers); n > 0 {
		c := p.containers[i%n]
		r.emitLocked(typ, c.id, c.sandbox)
		return
	}
	if sb := p.currentSandbox(); sb != nil {
		r.emitLocked(typ, sb.id, sb)
	}
}

// StormEvents says what the events of SetEventStorm say about a container.
type StormEvents int

const (
	// StormFlap says STOPPED and STARTED in turn (the default).
	StormFlap StormEvents = iota
	// StormStarted says STARTED only: of a running container, the state it
	// is in.
	StormStarted
	// StormStopped says STOPPED only: of a running container, a state it
	// is not in (it keeps running).
	StormStopped
)

// SetStormEvents sets what the event storm's events say from now on.
func (r *Runtime) SetStormEvents(k StormEvents) {
	r.kmu.Lock()
	r.stormEvents = k
	r.kmu.Unlock()
}

// stormTick is how often the event storm emits its due events.
const stormTick = 5 * time.Millisecond

// SetEventStorm makes the runtime stream perSecond container events per
// second of real time, spread over every pod in turn (creation order), as
// EmitEvents does for one pod: each event says a container of the pod
// stopped or started (SetStormEvents says which), with CreatedAt now, and
// the model does not change.
// The events are emitted in batches every few milliseconds, as many as are
// due. perSecond <= 0 stops the storm; Stop ends it.
func (r *Runtime) SetEventStorm(perSecond int) {
	r.kmu.Lock()
	old := r.storm
	r.storm = nil
	if perSecond > 0 {
		r.storm = newGenerator()
	}
	g := r.storm
	r.kmu.Unlock()
	old.end()
	if g == nil {
		return
	}
	start := time.Now()
	var sent int64
	next := 0 // pod index in creation order
	turn := map[*pod]int{}
	r.startGenerator(g, stormTick, func() {
		due := int64(time.Since(start).Seconds()*float64(perSecond)) - sent
		if due <= 0 {
			return
		}
		sent += due
		r.kmu.Lock()
		kind := r.stormEvents
		r.kmu.Unlock()
		r.mu.Lock()
		defer r.mu.Unlock()
		for range due {
			if len(r.order) == 0 {
				break
			}
			p := r.order[next%len(r.order)]
			next = (next + 1) % len(r.order)
			switch kind {
			case StormStarted:
				r.aboutPodLocked(p, turn[p], runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
			case StormStopped:
				r.aboutPodLocked(p, turn[p], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
			default:
				r.flapLocked(p, turn[p])
			}
			turn[p]++
		}
		if len(turn) > 2*len(r.order)+64 { // pods come and go
			clear(turn)
		}
	})
}

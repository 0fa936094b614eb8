package pleg

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"github.com/podlifecycle/pleg/journal"
	"github.com/prometheus/client_golang/prometheus"
)

// EventsMode says whether the generator uses the runtime's container event
// stream (CRI GetContainerEvents) as hints.
type EventsMode string

const (
	// EventsAuto uses the stream when the runtime has one; a runtime
	// without one is reported once and probed again rarely.
	EventsAuto EventsMode = "auto"
	// EventsOn always tries to use the stream and reports every failure
	// to connect as an error.
	EventsOn EventsMode = "on"
	// EventsOff never opens the stream: the periodic relist alone.
	EventsOff EventsMode = "off"
)

// Event stream connection states, as reported by EventStream.
const (
	StreamOff         = "off"
	StreamConnecting  = "connecting"
	StreamConnected   = "connected"
	StreamBackoff     = "backoff"
	StreamUnsupported = "unsupported"
)

// Backoff of the event stream's reconnection.
const (
	streamBackoffBase     = 500 * time.Millisecond
	streamBackoffCap      = 60 * time.Second
	streamHealthyAfter    = 60 * time.Second // a stream up this long resets the backoff
	streamUnsupportedWait = 10 * time.Minute // how rarely a runtime without events is probed
	streamClosesAtOnce    = time.Second      // a stream closing this fast without events counts as unsupported
)

// EventStreamStatus describes the runtime event stream, for /readyz.
type EventStreamStatus struct {
	Mode        EventsMode `json:"mode"`
	State       string     `json:"state"`
	Connects    int64      `json:"connects"`
	Events      int64      `json:"events"`
	LastEvent   time.Time  `json:"lastEvent,omitzero"`
	LastError   string     `json:"lastError,omitempty"`
	RetryAt     time.Time  `json:"retryAt,omitzero"`
	ConnectedAt time.Time  `json:"connectedAt,omitzero"`
}

// eventStream holds the state of the stream consumer, which its goroutine
// publishes for EventStream.
type eventStream struct {
	mu     sync.Mutex
	status EventStreamStatus
	// counters: pleg_runtime_events_total by known event type, resolved
	// as first used (by the stream's goroutine only).
	counters [cruntime.EventDeleted + 1]prometheus.Counter
}

// EventStream returns the state of the runtime event stream.
func (g *Generator) EventStream() EventStreamStatus {
	g.stream.mu.Lock()
	defer g.stream.mu.Unlock()
	return g.stream.status
}

func (g *Generator) setStream(f func(*EventStreamStatus)) {
	g.stream.mu.Lock()
	f(&g.stream.status)
	g.stream.mu.Unlock()
}

// onRuntimeEvent hands one runtime event to the loop as a hint. It never
// blocks: the stream is read continuously. Which hints make a runtime call
// is the core's to decide (core_hints.go).
func (g *Generator) onRuntimeEvent(e cruntime.Event) {
	// This runs for every runtime event (a thousand a second on a busy
	// node): no label is hashed and no log line built unless it is logged.
	g.eventCounter(e.Type).Inc()
	now := g.clock.Now()
	if !e.CreatedAt.IsZero() {
		g.m.EventedConnectionLatency.Observe(now.Sub(e.CreatedAt).Seconds())
	}
	g.stream.mu.Lock()
	g.stream.status.Events++
	g.stream.status.LastEvent = now
	g.stream.mu.Unlock()
	if e.PodUID == "" {
		// Without a pod the hint cannot be targeted; the relist covers it.
		if l := g.log.V(4); l.Enabled() {
			l.Info("Runtime event without a pod; leaving it to the relist", "containerID", e.ContainerID, "type", e.Type.String())
		}
		return
	}
	if l := g.log.V(4); l.Enabled() {
		l.Info("Runtime event", "podUID", e.PodUID, "pod", textfmt.PodRef(e.PodNamespace, e.PodName), "containerID", e.ContainerID, "type", e.Type.String())
	}
	at := e.CreatedAt
	if at.IsZero() {
		at = now
	}
	g.hint(hintIn{uid: e.PodUID, at: at, event: true, eventType: e.Type, container: e.ContainerID})
}

// eventCounter returns pleg_runtime_events_total's counter of type t,
// resolved once per type (a label lookup hashes the label each time).
func (g *Generator) eventCounter(t cruntime.EventType) prometheus.Counter {
	if t >= 0 && int(t) < len(g.stream.counters) {
		if c := g.stream.counters[t]; c != nil {
			return c
		}
		c := g.m.RuntimeEvents.WithLabelValues(t.String())
		g.stream.counters[t] = c
		return c
	}
	return g.m.RuntimeEvents.WithLabelValues(t.String())
}

// watchEvents consumes the runtime's event stream until ctx ends,
// reconnecting forever with jittered exponential backoff.
func (g *Generator) watchEvents(ctx context.Context, src cruntime.EventSource) {
	mode := g.opts.Events
	failures := 0
	rng := rand.New(rand.NewPCG(uint64(g.clock.Now().UnixNano()), 0x5eed))
	loggedUnsupported := false
	// A runtime that has streamed events has a stream: a later
	// Unimplemented or quick close is a failure to retry, not a verdict.
	hasStream := false
	for ctx.Err() == nil {
		g.setStream(func(s *EventStreamStatus) { s.State = StreamConnecting })
		start := g.clock.Now()
		var connectedAt time.Time
		var events int64
		err := src.WatchEvents(ctx, func() {
			connectedAt = g.clock.Now()
			g.m.EventedConnectionSuccess.Inc()
			g.m.EventStreamUp.Set(1)
			g.setStream(func(s *EventStreamStatus) {
				s.State, s.Connects, s.ConnectedAt, s.LastError = StreamConnected, s.Connects+1, connectedAt, ""
			})
			g.log.V(2).Info("Connected to the runtime's container event stream")
			g.inbox.streamChanged(journal.RuntimeStatus{State: journal.RuntimeEventStreamConnected})
		}, func(e cruntime.Event) {
			events++
			g.onRuntimeEvent(e)
		})
		g.m.EventStreamUp.Set(0)
		if ctx.Err() != nil {
			return
		}
		if !connectedAt.IsZero() {
			msg := "event stream ended"
			if err != nil {
				msg = err.Error()
			}
			g.inbox.streamChanged(journal.RuntimeStatus{State: journal.RuntimeEventStreamLost, Message: msg})
		}
		if events > 0 || (!connectedAt.IsZero() && g.clock.Since(start) >= streamClosesAtOnce) {
			hasStream = true
		}
		// Unsupported: Unimplemented, or a stream the runtime closes
		// cleanly right after it opened, without an event (CRI-O with pod
		// events off). Any other error, however early, is transient.
		unsupported := !hasStream && (errors.Is(err, cruntime.ErrEventsUnsupported) ||
			(errors.Is(err, io.EOF) && events == 0 && !connectedAt.IsZero() && g.clock.Since(start) < streamClosesAtOnce))
		var wait time.Duration
		if unsupported {
			wait = streamUnsupportedWait
			if mode == EventsOn {
				g.log.Error(err, "The runtime has no container event stream; relying on the periodic relist", "retryIn", wait)
			} else if !loggedUnsupported {
				g.log.Info("The runtime has no container event stream; relying on the periodic relist", "reason", errorString(err))
			}
			loggedUnsupported = true
			g.setStream(func(s *EventStreamStatus) { s.State, s.LastError = StreamUnsupported, errorString(err) })
		} else {
			if err == nil {
				err = errors.New("event stream ended")
			}
			g.m.EventedConnectionErrors.Inc()
			if !connectedAt.IsZero() && g.clock.Since(connectedAt) >= streamHealthyAfter {
				failures = 0
			}
			wait = streamBackoff(failures, rng)
			failures++
			g.log.Error(err, "Runtime event stream failed; reconnecting", "retryIn", wait)
			g.setStream(func(s *EventStreamStatus) { s.State, s.LastError = StreamBackoff, err.Error() })
		}
		if wait == 0 {
			continue
		}
		g.setStream(func(s *EventStreamStatus) { s.RetryAt = g.clock.Now().Add(wait) })
		t := g.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

func errorString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// streamBackoff is the wait before reconnection attempt n+1 after n
// consecutive failures: at once for the first, then exponential from
// streamBackoffBase with ±20% jitter, capped at streamBackoffCap.
func streamBackoff(failures int, rng *rand.Rand) time.Duration {
	if failures == 0 {
		return 0
	}
	d := streamBackoffBase
	for i := 1; i < failures && d < streamBackoffCap; i++ {
		d *= 2
	}
	d = min(d, streamBackoffCap)
	jitter := 0.8 + 0.4*rng.Float64()
	return min(time.Duration(float64(d)*jitter), streamBackoffCap)
}

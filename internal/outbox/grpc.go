package outbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// GRPCConfig configures the outbox of a gRPC server stream (ForGRPC).
type GRPCConfig[T any] struct {
	Max          int           // messages that may wait behind the one being sent
	StallTimeout time.Duration // see Config
	Clock        Clock         // nil: the real clock
	// Send sends one message whole (a stream's Send or SendMsg): its
	// return is the message's progress, gRPC's flow control having taken
	// it.
	Send func(T) error
	// Sent, if set, is called after each message sent.
	Sent func(T)
	// Cancel cancels the handler's context: with the Send's error when one
	// fails, with Cut when the client is cut off. Either ends the
	// handler's wait on the journal, and the handler's return ends the
	// stream, which makes a Send blocked on the client's flow control
	// return.
	Cancel context.CancelCauseFunc
	Cut    error
	// Senders counts the outbox's sender until it has none left, for a
	// server that waits for them when it stops: a handler cannot wait
	// for a sender blocked on the client's flow control (see Close).
	Senders *sync.WaitGroup
}

// GRPC is the outbox of a gRPC server stream: an Outbox whose Close keeps
// the stream out of its sender's hands once the handler returns.
type GRPC[T any] struct {
	*Outbox[T]
	gate gate
}

// ForGRPC returns the outbox of a gRPC server stream's handler, which
// closes it as it returns (defer Close).
func ForGRPC[T any](c GRPCConfig[T]) *GRPC[T] {
	g := &GRPC[T]{}
	c.Senders.Add(1)
	g.Outbox = New(Config[T]{
		Max:          c.Max,
		StallTimeout: c.StallTimeout,
		Clock:        c.Clock,
		Send: func(m T, progress func()) error {
			if !g.gate.enter() {
				return ErrClosed // the handler returned: the stream is not ours
			}
			err := c.Send(m)
			g.gate.leave()
			if err != nil {
				c.Cancel(err)
				return err
			}
			if c.Sent != nil {
				c.Sent(m)
			}
			progress()
			return nil
		},
		Abort:  func() { c.Cancel(c.Cut) },
		Exited: c.Senders.Done,
	})
	return g
}

// Close stops the outbox (messages not begun are dropped) and returns once
// its sender no longer uses the stream: no Send begins after it returned,
// and a Send in progress has returned, so that the handler, which returns
// next, never has its stream used after it did (grpc-go does not promise
// that is safe). A Send still in progress CloseGrace after Close began, or
// one the outbox cut off for making no progress (Stalled), is held by the
// client's flow control, and only the end of the stream, which the
// handler's return brings, makes it return (SendMsg blocks "until the
// stream is done"): Close returns then without waiting for it, so that a
// stalled client holds the handler no longer than the stall timeout, or
// CloseGrace past the handler's end.
func (g *GRPC[T]) Close() {
	g.Outbox.Stop()
	idle := g.gate.close()
	if idle == nil {
		return
	}
	var drop *DropError
	if errors.As(g.Err(), &drop) {
		return // it made no progress for StallTimeout: it will not now
	}
	expired := make(chan struct{})
	t := g.cfg.Clock.AfterFunc(CloseGrace, func() { close(expired) })
	defer t.Stop()
	select {
	case <-idle:
	case <-expired:
	}
}

// gate is the stream's use by the sender: a Send enters it and leaves it,
// and once closed no Send enters.
type gate struct {
	mu     sync.Mutex
	closed bool
	busy   bool          // a Send is in progress
	idle   chan struct{} // made by close while busy; closed by leave
}

// enter reports whether a Send may use the stream, and marks it busy.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.busy = true
	return true
}

// leave marks the Send in progress returned.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy = false
	if g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// close lets no Send enter, and returns nil when none is in progress,
// otherwise a channel closed when it returns.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if !g.busy {
		return nil
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	return g.idle
}

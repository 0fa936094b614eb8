package outbox

import (
	"context"
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
	// for its own (see Config.Exited).
	Senders *sync.WaitGroup
}

// ForGRPC returns the outbox of a gRPC server stream's handler, which
// stops it as it returns (Stop, not Close).
func ForGRPC[T any](c GRPCConfig[T]) *Outbox[T] {
	c.Senders.Add(1)
	return New(Config[T]{
		Max:          c.Max,
		StallTimeout: c.StallTimeout,
		Clock:        c.Clock,
		Send: func(m T, progress func()) error {
			if err := c.Send(m); err != nil {
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
}

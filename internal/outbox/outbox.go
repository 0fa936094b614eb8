// Package outbox bounds what a server holds for one streaming client.
//
// An Outbox queues the messages for one client and sends them in order
// from a goroutine of its own, so that the producer never waits for the
// client. Two bounds cut a client off:
//
//   - bytes: at most MaxBytes may wait behind the message being sent (a
//     single message larger than that is accepted when nothing waits, so
//     that a large first snapshot can go out); a Put beyond it cuts the
//     client off at once (QueueFull);
//   - time: a Send that reports no progress for StallTimeout cuts the
//     client off (Stalled). Send reports progress as it goes (for a byte
//     stream, after each chunk the connection took), so a slow client that
//     keeps taking data is not cut off by one large message, and one that
//     takes nothing is cut off StallTimeout after it stopped.
//
// When a client is cut off, Abort is called to make a Send in progress
// return. The memory an Outbox holds is therefore at most MaxBytes plus the
// message being sent, and a client that stops taking data is dropped
// within StallTimeout of its connection refusing more, however long its
// queue is.
//
// It carries any message type; the SSE stream (internal/httpapi) is its
// one user. The gRPC Watch (api/lifecycle/server/watch.go) does not use
// it: its bound is a count of messages converted ahead of the client (64),
// and its stall timeout runs while that queue has no room, on the
// server's clock (fake in its tests), because a gRPC SendMsg takes a whole
// message and reports no progress within one; an HTTP write is cut in
// chunks, each one progress, and its bound is in bytes. Both cut only a
// client that takes nothing for the stall timeout, and both let the
// journal hold what the client has not read yet.
package outbox

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Reason says why an Outbox cut its client off.
type Reason string

const (
	// QueueFull: a Put would have left more than MaxBytes waiting behind
	// the message being sent.
	QueueFull Reason = "queue_full"
	// Stalled: a Send reported no progress for StallTimeout.
	Stalled Reason = "stalled"
)

// DropError is the error of an Outbox that cut its client off.
type DropError struct {
	Reason Reason
	// Queued is how many bytes were queued (the message being sent
	// included) when the client was cut off.
	Queued int
	// The bound that was hit: MaxBytes for QueueFull, StallTimeout for
	// Stalled.
	MaxBytes     int
	StallTimeout time.Duration
}

func (e *DropError) Error() string {
	switch e.Reason {
	case QueueFull:
		return fmt.Sprintf("client cut off: more than %d bytes queued for it (%d queued)", e.MaxBytes, e.Queued)
	case Stalled:
		return fmt.Sprintf("client cut off: it took nothing for %v (%d bytes queued)", e.StallTimeout, e.Queued)
	}
	return fmt.Sprintf("client cut off (%s, %d bytes queued)", e.Reason, e.Queued)
}

// ErrClosed is the error of an Outbox its owner closed.
var ErrClosed = errors.New("outbox closed")

// Config configures an Outbox. Every field is required.
type Config[T any] struct {
	// MaxBytes bounds the bytes waiting behind the message being sent.
	MaxBytes int
	// StallTimeout cuts the client off when a Send reports no progress for
	// this long.
	StallTimeout time.Duration
	// Size returns a message's size in bytes.
	Size func(T) int
	// Send delivers one message and calls progress each time part of it
	// was taken by the client (at least once, before returning nil, for a
	// message that went out in one piece). It is called from one goroutine
	// at a time, in the order of Put.
	Send func(msg T, progress func()) error
	// Abort makes a Send in progress return (with an error), and every
	// later one: for example by putting a write deadline in the past or
	// closing the connection. It may be called from any goroutine, at
	// most once.
	Abort func()
}

// Outbox is the queue of one client. Create it with New; its owner must
// call Close.
type Outbox[T any] struct {
	cfg Config[T]

	mu      sync.Mutex
	queue   []T   // queue[0] is being sent, or about to be
	sizes   []int // of queue's messages
	queued  int   // bytes in queue
	err     error // set once: why the outbox stopped
	sending bool  // a Send is in progress
	watch   uint64
	timer   *time.Timer // the stall watchdog of the Send in progress
	aborted bool

	wake    chan struct{} // one token: the queue or err changed
	emptied chan struct{} // closed (and replaced) when the queue empties
	done    chan struct{} // closed when err is set
	exited  chan struct{} // closed when the sender goroutine returns
}

// New returns an outbox and starts its sender goroutine.
func New[T any](cfg Config[T]) *Outbox[T] {
	o := &Outbox[T]{cfg: cfg, wake: make(chan struct{}, 1), emptied: make(chan struct{}), done: make(chan struct{}), exited: make(chan struct{})}
	go o.run()
	return o
}

// Put queues msg for the client without waiting. It returns the reason the
// outbox stopped (a *DropError, the error of a failed Send, or ErrClosed),
// cutting the client off with QueueFull if msg does not fit.
func (o *Outbox[T]) Put(msg T) error {
	size := o.cfg.Size(msg)
	o.mu.Lock()
	if o.err != nil {
		err := o.err
		o.mu.Unlock()
		return err
	}
	// What waits behind the message being sent (or about to be), in
	// bytes: a message that does not fit is accepted only when nothing
	// waits, so that one larger than the bound (a first resync) can go.
	if waiting := o.waitingLocked(); waiting > 0 && waiting+size > o.cfg.MaxBytes {
		err := o.stopLocked(&DropError{Reason: QueueFull, Queued: o.queued, MaxBytes: o.cfg.MaxBytes})
		abort := o.abortLocked()
		o.mu.Unlock()
		abort()
		return err
	}
	o.queue = append(o.queue, msg)
	o.sizes = append(o.sizes, size)
	o.queued += size
	o.mu.Unlock()
	o.signal()
	return nil
}

// waitingLocked returns the bytes queued behind the first message.
func (o *Outbox[T]) waitingLocked() int {
	if len(o.queue) == 0 {
		return 0
	}
	return o.queued - o.sizes[0]
}

// Done is closed when the outbox stops: cut off, failed or closed.
func (o *Outbox[T]) Done() <-chan struct{} { return o.done }

// Err returns nil while the outbox runs, then why it stopped.
func (o *Outbox[T]) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Queued returns the bytes queued, the message being sent included.
func (o *Outbox[T]) Queued() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queued
}

// Close stops the outbox: messages not sent yet are dropped, a Send in
// progress is aborted, and Close returns once the sender goroutine has.
func (o *Outbox[T]) Close() {
	o.mu.Lock()
	o.stopLocked(ErrClosed)
	abort := func() {}
	if o.sending {
		abort = o.abortLocked()
	}
	o.mu.Unlock()
	abort()
	o.signal()
	<-o.exited
}

func (o *Outbox[T]) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// stopLocked records why the outbox stops, unless it already has, and
// returns the outbox's error.
func (o *Outbox[T]) stopLocked(err error) error {
	if o.err == nil {
		o.err = err
		clear(o.queue) // release the messages now, not when the owner lets go
		o.queue, o.sizes, o.queued = nil, nil, 0
		close(o.done)
	}
	return o.err
}

// abortLocked returns Abort the first time, a no-op afterwards.
func (o *Outbox[T]) abortLocked() func() {
	if o.aborted {
		return func() {}
	}
	o.aborted = true
	return o.cfg.Abort
}

func (o *Outbox[T]) run() {
	defer close(o.exited)
	for {
		o.mu.Lock()
		for o.err == nil && len(o.queue) == 0 {
			o.mu.Unlock()
			<-o.wake
			o.mu.Lock()
		}
		if o.err != nil {
			o.mu.Unlock()
			return
		}
		msg := o.queue[0]
		o.sending = true
		o.rearmLocked()
		o.mu.Unlock()

		err := o.cfg.Send(msg, o.progress)

		o.mu.Lock()
		o.sending = false
		o.disarmLocked()
		if err != nil {
			o.stopLocked(err) // keeps a DropError set while Send was aborted
			o.mu.Unlock()
			return
		}
		if o.err == nil {
			var zero T
			o.queue[0] = zero
			o.queue, o.queued = o.queue[1:], o.queued-o.sizes[0]
			o.sizes = o.sizes[1:]
			if len(o.queue) == 0 {
				close(o.emptied)
				o.emptied = make(chan struct{})
			}
		}
		o.mu.Unlock()
	}
}

// Drain waits until every message queued has been sent, or the outbox
// stops, and returns the outbox's error. A client that stops reading is
// cut by the stall watchdog, so the wait is bounded by StallTimeout. An
// owner that ends a stream cleanly drains before it closes: Close aborts a
// Send in progress.
func (o *Outbox[T]) Drain() error {
	for {
		o.mu.Lock()
		if o.err != nil || len(o.queue) == 0 {
			err := o.err
			o.mu.Unlock()
			return err
		}
		ch := o.emptied
		o.mu.Unlock()
		select {
		case <-ch:
		case <-o.done:
		}
	}
}

// progress restarts the stall watchdog of the Send in progress.
func (o *Outbox[T]) progress() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sending && o.err == nil {
		o.rearmLocked()
	}
}

// rearmLocked starts a new watchdog; an older one that fires late finds its
// generation stale and does nothing.
func (o *Outbox[T]) rearmLocked() {
	o.disarmLocked()
	gen := o.watch
	o.timer = time.AfterFunc(o.cfg.StallTimeout, func() { o.stalled(gen) })
}

func (o *Outbox[T]) disarmLocked() {
	o.watch++
	if o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
}

func (o *Outbox[T]) stalled(gen uint64) {
	o.mu.Lock()
	if gen != o.watch || !o.sending || o.err != nil {
		o.mu.Unlock()
		return
	}
	o.stopLocked(&DropError{Reason: Stalled, Queued: o.queued, StallTimeout: o.cfg.StallTimeout})
	abort := o.abortLocked()
	o.mu.Unlock()
	abort()
}

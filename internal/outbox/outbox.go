// Package outbox is pleg's one rule for a streaming client that reads
// slower than pleg produces: the lifecycle Watch (gRPC), the CRI
// endpoint's GetContainerEvents (gRPC) and /api/v1/events (SSE) each give
// every client an Outbox.
//
// An Outbox queues the messages for one client and sends them in order
// from a goroutine of its own, which runs only while there is something to
// send and for SenderLinger after (an idle client costs no goroutine of
// its outbox). The rule:
//
//   - At most Max waits behind the message being sent (in units of Size:
//     bytes for SSE, messages for gRPC). Push waits for room, so the
//     producer (a journal watch) stops reading the journal, and the journal
//     holds what the client has not taken yet. A single message larger than
//     Max is accepted when nothing waits, so that a large snapshot can go.
//   - A client is cut off (Stalled) when a Send in progress reports no
//     progress for StallTimeout. Send reports progress as it goes: after
//     each message for gRPC, whose SendMsg takes a whole message, and after
//     each chunk the connection took for SSE, so that a slow client that
//     keeps taking data is never cut off by one large message. Nothing is
//     in progress while the queue is empty: an idle client is never cut.
//
// When a client is cut off, Abort is called to end the Send in progress and
// the owner's stream. The memory an Outbox holds is at most Max plus the
// message being sent, and a client that takes nothing while something
// waits for it is cut off StallTimeout after its last progress.
//
// Time comes from Config.Clock, so that the owners' tests can use a fake
// clock; the watchdog is one timer per outbox, made when a Send starts
// with none pending and re-armed by its own expiry, never per message.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Reason says why an Outbox cut its client off.
type Reason string

// Stalled: a Send reported no progress for StallTimeout.
const Stalled Reason = "stalled"

// DropError is the error of an Outbox that cut its client off.
type DropError struct {
	Reason Reason
	// Queued is how much was queued (the message being sent included)
	// when the client was cut off, in units of Size.
	Queued int
	// StallTimeout is the bound that was hit.
	StallTimeout time.Duration
}

func (e *DropError) Error() string {
	return fmt.Sprintf("client cut off: it took nothing for %v (%d queued)", e.StallTimeout, e.Queued)
}

// DefaultStallTimeout is the stall timeout of pleg's streams by default
// (the lifecycle Watch, the CRI endpoint's GetContainerEvents).
const DefaultStallTimeout = 10 * time.Second

// SenderLinger is how long a sender goroutine waits for the next message
// once the queue is empty before it returns; the next Push starts another.
// A busy client keeps its goroutine, an idle one holds none.
const SenderLinger = time.Second

// ErrClosed is the error of an Outbox its owner closed.
var ErrClosed = errors.New("outbox closed")

// Clock is the time an Outbox uses: k8s.io/utils/clock's RealClock and
// its fake clocks have it.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) clock.Timer
}

// Config configures an Outbox. Send, Abort, Max and StallTimeout are
// required.
type Config[T any] struct {
	// Max bounds what may wait behind the message being sent.
	Max int
	// StallTimeout cuts the client off when a Send reports no progress for
	// this long.
	StallTimeout time.Duration
	// Size returns a message's size; nil counts every message as 1, so
	// that Max is a number of messages.
	Size func(T) int
	// Send delivers one message and calls progress each time part of it
	// was taken by the client (at least once, before returning nil, for a
	// message that went out in one piece). It is called from one goroutine
	// at a time, in the order of Push.
	Send func(msg T, progress func()) error
	// Abort makes a Send in progress return (with an error), and every
	// later one, and ends the owner's stream: for example by putting a
	// write deadline in the past, or by cancelling the context the owner's
	// handler waits on. It may be called from any goroutine, at most once,
	// with no lock of the outbox held.
	Abort func()
	// Exited, if set, is called once the outbox has stopped and no sender
	// goroutine is left (by the last one as it returns, or by Stop): an
	// owner that cannot wait for it (a gRPC handler, whose blocked SendMsg
	// returns only once the handler has) counts it there.
	Exited func()
	// Clock is the outbox's time; nil is the real clock.
	Clock Clock
}

// Outbox is the queue of one client. Create it with New; its owner must
// call Stop or Close.
type Outbox[T any] struct {
	cfg Config[T]

	mu      sync.Mutex
	queue   []T   // queue[0] is being sent, or about to be
	sizes   []int // of queue's messages
	queued  int   // in queue, in units of Size
	err     error // set once: why the outbox stopped
	sending bool  // a Send is in progress
	running bool  // a sender goroutine exists
	ended   bool  // stopped with no sender left: exited is closed
	// progressAt is when the Send in progress started or last reported
	// progress; watchdog is the pending check of it.
	progressAt time.Time
	watchdog   clock.Timer // pending, or nil
	aborted    bool

	wake    chan struct{} // one token, for the sender: the queue or err changed
	linger  *time.Timer   // the sender's wait for more; only the sender uses it
	room    chan struct{} // closed (and replaced) when a message leaves the queue, if roomWanted
	done    chan struct{} // closed when err is set
	exited  chan struct{} // closed when stopped and no sender goroutine is left
	emptied chan struct{} // closed (and replaced) when the queue empties, if emptiedWanted
	// roomWanted and emptiedWanted say a Push or a Drain waits on room or
	// emptied: only then is the channel closed and made anew, so that a
	// message sent to a client nobody waits for allocates nothing.
	roomWanted, emptiedWanted bool
}

// New returns an outbox; its sender goroutine starts with the first Push.
func New[T any](cfg Config[T]) *Outbox[T] {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	o := &Outbox[T]{cfg: cfg, wake: make(chan struct{}, 1), room: make(chan struct{}),
		emptied: make(chan struct{}), done: make(chan struct{}), exited: make(chan struct{})}
	return o
}

func (o *Outbox[T]) size(msg T) int {
	if o.cfg.Size == nil {
		return 1
	}
	return o.cfg.Size(msg)
}

// Push queues msg for the client, waiting for room: until what waits
// behind the message being sent leaves room for msg, or nothing waits. It
// returns ctx's cause if ctx ends first, or why the outbox stopped (a
// *DropError, the error of a failed Send, or ErrClosed). The wait is
// bounded: a client that takes nothing meanwhile is cut off StallTimeout
// after its last progress.
func (o *Outbox[T]) Push(ctx context.Context, msg T) error {
	size := o.size(msg)
	o.mu.Lock()
	for {
		if o.err != nil {
			err := o.err
			o.mu.Unlock()
			return err
		}
		// A message that does not fit is accepted only when nothing
		// waits, so that one larger than the bound (a snapshot) can go.
		if waiting := o.waitingLocked(); waiting == 0 || waiting+size <= o.cfg.Max {
			break
		}
		room := o.room
		o.roomWanted = true
		o.mu.Unlock()
		select {
		case <-room:
		case <-o.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		o.mu.Lock()
	}
	o.queue = append(o.queue, msg)
	o.sizes = append(o.sizes, size)
	o.queued += size
	start := !o.running
	o.running = true
	o.mu.Unlock()
	if start {
		go o.run()
		return nil
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return nil
}

// waitingLocked returns what is queued behind the first message.
func (o *Outbox[T]) waitingLocked() int {
	if len(o.queue) == 0 {
		return 0
	}
	return o.queued - o.sizes[0]
}

// Done is closed when the outbox stops: cut off, failed, stopped or
// closed.
func (o *Outbox[T]) Done() <-chan struct{} { return o.done }

// Err returns nil while the outbox runs, then why it stopped.
func (o *Outbox[T]) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Queued returns what is queued, the message being sent included, in
// units of Size.
func (o *Outbox[T]) Queued() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queued
}

// Stop stops the outbox without waiting for its sender: messages not sent
// yet are dropped and a Send in progress is aborted. A gRPC handler closes
// its GRPC outbox as it returns (GRPC.Close), which stops it.
func (o *Outbox[T]) Stop() { o.stop(false) }

// stop stops the outbox; a Send in progress is aborted at once, or, with
// grace, CloseGrace later if it has not returned by then.
func (o *Outbox[T]) stop(grace bool) {
	o.mu.Lock()
	o.stopLocked(ErrClosed)
	abort := func() {}
	if o.sending {
		if grace {
			o.cfg.Clock.AfterFunc(CloseGrace, o.abortSend)
		} else {
			abort = o.abortLocked()
		}
	}
	exited := o.endLocked()
	o.mu.Unlock()
	abort()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	exited()
}

// abortSend aborts the Send in progress, if one still is.
func (o *Outbox[T]) abortSend() {
	o.mu.Lock()
	abort := func() {}
	if o.sending {
		abort = o.abortLocked()
	}
	o.mu.Unlock()
	abort()
}

// endLocked marks the outbox ended once it has stopped and no sender is
// left, and returns what is to run then, with no lock held: Exited, then
// the close of exited (so that Close returns after Exited). It returns a
// no-op every other time.
func (o *Outbox[T]) endLocked() func() {
	if o.err == nil || o.running || o.ended {
		return func() {}
	}
	o.ended = true
	return func() {
		if o.cfg.Exited != nil {
			o.cfg.Exited()
		}
		close(o.exited)
	}
}

// Close stops the outbox and returns once no sender goroutine is left: an
// owner whose Send writes to what it must not touch after it returns (an
// http.ResponseWriter) closes it. Messages not begun are dropped; a Send
// in progress may finish within CloseGrace, so that a stream that ends
// (the server shutting down) does not end in the middle of a message to a
// client that reads, and is aborted then.
func (o *Outbox[T]) Close() {
	o.stop(true)
	<-o.exited
}

// CloseGrace is how long Close lets a Send in progress finish before it
// aborts it: a client that reads takes a message in far less.
const CloseGrace = 500 * time.Millisecond

// stopLocked records why the outbox stops, unless it already has, and
// returns the outbox's error.
func (o *Outbox[T]) stopLocked(err error) error {
	if o.err == nil {
		o.err = err
		clear(o.queue) // release the messages now, not when the owner lets go
		o.queue, o.sizes, o.queued = nil, nil, 0
		if o.watchdog != nil {
			o.watchdog.Stop()
			o.watchdog = nil
		}
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
	for {
		o.mu.Lock()
		if o.err == nil && len(o.queue) == 0 {
			o.mu.Unlock()
			if !o.waitMore() {
				return
			}
			continue
		}
		if o.err != nil {
			o.running = false
			exited := o.endLocked()
			o.mu.Unlock()
			exited()
			return
		}
		msg := o.queue[0]
		o.sending = true
		o.progressLocked()
		o.mu.Unlock()

		err := o.cfg.Send(msg, o.progress)

		o.mu.Lock()
		o.sending = false
		if err != nil {
			o.stopLocked(err) // keeps a DropError set while Send was aborted
			o.running = false
			exited := o.endLocked()
			o.mu.Unlock()
			exited()
			return
		}
		if o.err == nil {
			var zero T
			o.queue[0] = zero
			o.queue, o.queued = o.queue[1:], o.queued-o.sizes[0]
			o.sizes = o.sizes[1:]
			if o.roomWanted {
				close(o.room)
				o.room, o.roomWanted = make(chan struct{}), false
			}
			if len(o.queue) == 0 && o.emptiedWanted {
				close(o.emptied)
				o.emptied, o.emptiedWanted = make(chan struct{}), false
			}
		}
		o.mu.Unlock()
	}
}

// waitMore waits, on the sender goroutine, for a Push or Stop, at most
// SenderLinger. It returns false when the goroutine is to return: nothing
// came, and the next Push starts another.
func (o *Outbox[T]) waitMore() bool {
	if o.linger == nil {
		o.linger = time.NewTimer(SenderLinger)
	} else {
		o.linger.Reset(SenderLinger)
	}
	select {
	case <-o.wake:
		o.linger.Stop()
		return true
	case <-o.linger.C:
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil || len(o.queue) > 0 {
		return true // came as the timer fired: the loop sees it
	}
	o.running = false
	return false
}

// Drain waits until every message queued has been sent, or the outbox
// stops, or ctx ends, and returns the outbox's error (ctx's cause if it
// ended first). A client that stops reading is cut by the watchdog, so the
// wait is bounded. An owner that ends a stream cleanly drains before it
// stops: Stop aborts a Send in progress.
func (o *Outbox[T]) Drain(ctx context.Context) error {
	for {
		o.mu.Lock()
		if o.err != nil || len(o.queue) == 0 {
			err := o.err
			o.mu.Unlock()
			return err
		}
		ch := o.emptied
		o.emptiedWanted = true
		o.mu.Unlock()
		select {
		case <-ch:
		case <-o.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// progress notes that the client took part of the message being sent.
func (o *Outbox[T]) progress() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sending && o.err == nil {
		o.progressAt = o.cfg.Clock.Now()
	}
}

// progressLocked notes a Send starting, and arms the watchdog if it is
// not pending.
func (o *Outbox[T]) progressLocked() {
	o.progressAt = o.cfg.Clock.Now()
	if o.watchdog == nil {
		o.watchdog = o.cfg.Clock.AfterFunc(o.cfg.StallTimeout, o.expired)
	}
}

// expired runs check on a goroutine of its own: a fake clock calls its
// AfterFunc functions with its lock held, and check reads the clock.
func (o *Outbox[T]) expired() { go o.check() }

// check is the watchdog: it cuts the client off when the Send in progress
// has made no progress for StallTimeout, and otherwise waits again for
// what is left of StallTimeout since the last progress (nothing when no
// Send is in progress: the next Send arms it again).
func (o *Outbox[T]) check() {
	o.mu.Lock()
	o.watchdog = nil
	if !o.sending || o.err != nil {
		o.mu.Unlock()
		return
	}
	idle := o.cfg.Clock.Now().Sub(o.progressAt)
	if idle < o.cfg.StallTimeout {
		o.watchdog = o.cfg.Clock.AfterFunc(o.cfg.StallTimeout-idle, o.expired)
		o.mu.Unlock()
		return
	}
	o.stopLocked(&DropError{Reason: Stalled, Queued: o.queued, StallTimeout: o.cfg.StallTimeout})
	abort := o.abortLocked()
	o.mu.Unlock()
	abort()
}

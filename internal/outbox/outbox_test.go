package outbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// client is a fake connection: Send takes a message whole, unless the
// client is stalled, in which case it blocks until unstalled or aborted.
type client struct {
	mu      sync.Mutex
	got     []string
	stalled chan struct{} // non-nil: Send blocks on it
	aborted chan struct{}
	aborts  int
}

func newClient() *client { return &client{aborted: make(chan struct{})} }

func (c *client) stall() {
	c.mu.Lock()
	c.stalled = make(chan struct{})
	c.mu.Unlock()
}

func (c *client) unstall() {
	c.mu.Lock()
	close(c.stalled)
	c.stalled = nil
	c.mu.Unlock()
}

func (c *client) send(m string, progress func()) error {
	c.mu.Lock()
	st := c.stalled
	c.mu.Unlock()
	if st != nil {
		select {
		case <-st:
		case <-c.aborted:
			return errors.New("write: deadline exceeded")
		}
	}
	select {
	case <-c.aborted:
		return errors.New("write: deadline exceeded")
	default:
	}
	c.mu.Lock()
	c.got = append(c.got, m)
	c.mu.Unlock()
	progress()
	return nil
}

func (c *client) abort() {
	c.mu.Lock()
	c.aborts++
	c.mu.Unlock()
	close(c.aborted) // a second call would panic: Abort is called at most once
}

func (c *client) received() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func newOutbox(c *client, max int, stall time.Duration) *Outbox[string] {
	return New(Config[string]{Max: max, StallTimeout: stall,
		Size: func(s string) int { return len(s) }, Send: c.send, Abort: c.abort})
}

// push is Push with a background context, failing the test on an error.
func push(t *testing.T, o *Outbox[string], msgs ...string) {
	t.Helper()
	for _, m := range msgs {
		if err := o.Push(context.Background(), m); err != nil {
			t.Fatalf("Push(%q): %v", m, err)
		}
	}
}

func TestSendsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		o := newOutbox(c, 10, time.Second)
		defer o.Close()
		push(t, o, "a", "bb", "ccc")
		synctest.Wait()
		if got := c.received(); !slices.Equal(got, []string{"a", "bb", "ccc"}) {
			t.Errorf("sent %q", got)
		}
		if q := o.Queued(); q != 0 {
			t.Errorf("Queued() = %d after everything was sent", q)
		}
	})
}

// The bound counts what waits behind the message being sent: a large
// first message goes out, and a Push that does not fit waits for room
// instead of cutting the client off; nothing is lost.
func TestPushWaitsForRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 10, time.Hour)
		defer o.Close()
		push(t, o, "a snapshot larger than the bound")
		synctest.Wait()              // its Send is blocked
		push(t, o, "12345", "67890") // exactly Max behind it
		pushed := make(chan error, 1)
		go func() { pushed <- o.Push(context.Background(), "x") }()
		time.Sleep(time.Minute)
		synctest.Wait()
		if len(pushed) != 0 {
			t.Fatal("a Push beyond the bound returned while nothing left the queue")
		}
		if q := o.Queued(); q != 42 {
			t.Errorf("Queued() = %d, want 42", q)
		}
		c.unstall()
		if err := <-pushed; err != nil {
			t.Fatalf("the waiting Push: %v", err)
		}
		synctest.Wait()
		want := []string{"a snapshot larger than the bound", "12345", "67890", "x"}
		if got := c.received(); !slices.Equal(got, want) || o.Err() != nil {
			t.Errorf("sent %q, err %v; want %q", got, o.Err(), want)
		}
	})
}

// Without Size, Max is a number of messages.
func TestCountBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := New(Config[string]{Max: 2, StallTimeout: time.Hour, Send: c.send, Abort: c.abort})
		defer o.Close()
		push(t, o, "a long first message", "b", "c")
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := o.Push(ctx, "d"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a third message behind the one being sent: Push = %v, want it to wait until its context ends", err)
		}
		if q := o.Queued(); q != 3 {
			t.Errorf("Queued() = %d, want 3 (a Push that gave up adds nothing)", q)
		}
		c.unstall()
		synctest.Wait()
		if got := c.received(); !slices.Equal(got, []string{"a long first message", "b", "c"}) {
			t.Errorf("sent %q", got)
		}
	})
}

// A Send without progress for StallTimeout cuts the client off, not a
// moment earlier, and ends a Push waiting for room.
func TestStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 5, 10*time.Second)
		defer o.Close()
		start := time.Now()
		push(t, o, "event", "queue")
		pushed := make(chan error, 1)
		go func() { pushed <- o.Push(context.Background(), "waits") }()
		time.Sleep(10*time.Second - time.Nanosecond)
		if err := o.Err(); err != nil {
			t.Fatalf("cut off after %v: %v", time.Since(start), err)
		}
		<-o.Done()
		var de *DropError
		if err := o.Err(); !errors.As(err, &de) || de.Reason != Stalled || de.Queued != 10 {
			t.Fatalf("Err() = %v, want a Stalled DropError with 10 queued", err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("cut off after %v, want 10s", d)
		}
		if err := <-pushed; !errors.As(err, &de) {
			t.Errorf("the Push waiting for room returned %v, want the drop", err)
		}
		synctest.Wait()
		if c.aborts != 1 || o.Queued() != 0 {
			t.Errorf("aborts = %d, queued %d; want 1 and 0 (the messages released)", c.aborts, o.Queued())
		}
		if err := o.Push(context.Background(), "late"); !errors.As(err, &de) {
			t.Errorf("Push after the drop = %v", err)
		}
	})
}

// The stall is counted from the last progress, whenever the watchdog
// looks: progress just before it looks moves the cut to StallTimeout
// after that progress.
func TestStallCountsFromLastProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var progress func()
		took := make(chan struct{})
		aborted := make(chan struct{})
		o := New(Config[string]{Max: 10, StallTimeout: 10 * time.Second,
			Send: func(_ string, p func()) error {
				progress = p
				close(took)
				<-aborted
				return errors.New("aborted")
			},
			Abort: func() { close(aborted) }})
		defer o.Close()
		start := time.Now()
		push(t, o, "m")
		<-took
		time.Sleep(9 * time.Second)
		progress()
		<-o.Done()
		if d := time.Since(start); d != 19*time.Second {
			t.Errorf("cut off %v after the Send started, want 19s (10s after its last progress at 9s)", d)
		}
	})
}

// An idle client is never cut off: nothing waits for it.
func TestIdleNeverCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		o := newOutbox(c, 10, time.Second)
		defer o.Close()
		push(t, o, "a")
		time.Sleep(24 * time.Hour)
		push(t, o, "b")
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		if err := o.Err(); err != nil || !slices.Equal(c.received(), []string{"a", "b"}) {
			t.Errorf("err %v, received %q", err, c.received())
		}
	})
}

// A slow client that keeps taking parts of a long message is not cut off:
// each bit of progress restarts the clock.
func TestProgressKeepsSlowClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		aborted := make(chan struct{})
		var chunks int
		o := New(Config[string]{Max: 10, StallTimeout: time.Second,
			Size: func(s string) int { return len(s) },
			Send: func(m string, progress func()) error {
				for range m {
					select {
					case <-time.After(900 * time.Millisecond): // one byte taken
					case <-aborted:
						return errors.New("aborted")
					}
					chunks++
					progress()
				}
				return nil
			},
			Abort: func() { close(aborted) }})
		defer o.Close()
		push(t, o, "twenty bytes, slowly")
		time.Sleep(20 * 900 * time.Millisecond)
		synctest.Wait()
		if err := o.Err(); err != nil || chunks != 20 || o.Queued() != 0 {
			t.Errorf("after 18s: err %v, %d of 20 bytes taken, %d queued", err, chunks, o.Queued())
		}
	})
}

// armClock is a fake clock that tells when an AfterFunc is made.
type armClock struct {
	*clocktesting.FakeClock
	armed chan time.Duration
}

func (c *armClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.FakeClock.AfterFunc(d, f)
	c.armed <- d
	return t
}

// The watchdog runs on Config.Clock: a fake clock's steps cut the client
// off, and real time does not.
func TestFakeClock(t *testing.T) {
	clk := &armClock{clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)), make(chan time.Duration, 4)}
	c := newClient()
	c.stall()
	o := New(Config[string]{Max: 10, StallTimeout: 10 * time.Second, Send: c.send, Abort: c.abort, Clock: clk})
	defer o.Close()
	push(t, o, "a")
	if d := <-clk.armed; d != 10*time.Second { // the watchdog, armed as the Send starts
		t.Fatalf("watchdog armed for %v, want the stall timeout", d)
	}
	clk.Step(10*time.Second - time.Nanosecond)
	if err := o.Err(); err != nil {
		t.Fatalf("cut off before the fake clock reached the stall timeout: %v", err)
	}
	clk.Step(time.Nanosecond)
	<-o.Done()
	var de *DropError
	if err := o.Err(); !errors.As(err, &de) || de.Reason != Stalled {
		t.Fatalf("Err() = %v, want Stalled", err)
	}
}

func TestStopAbortsSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		var exited int
		o := New(Config[string]{Max: 100, StallTimeout: time.Hour, Send: c.send, Abort: c.abort,
			Exited: func() { exited++ }})
		push(t, o, "stuck")
		synctest.Wait()
		o.Stop() // does not wait for the sender
		if err := o.Err(); !errors.Is(err, ErrClosed) {
			t.Errorf("Err() = %v, want ErrClosed", err)
		}
		if err := o.Push(context.Background(), "late"); !errors.Is(err, ErrClosed) {
			t.Errorf("Push after Stop = %v, want ErrClosed", err)
		}
		synctest.Wait()
		if c.aborts != 1 || exited != 1 {
			t.Errorf("aborts = %d, Exited called %d times; want 1 and 1", c.aborts, exited)
		}
		o.Close() // idempotent, and the sender is gone
	})
}

// Close of an idle outbox does not call Abort: nothing is in progress.
func TestCloseIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		o := newOutbox(c, 100, time.Second)
		push(t, o, "a")
		synctest.Wait()
		o.Close()
		if c.aborts != 0 || !slices.Equal(c.received(), []string{"a"}) {
			t.Errorf("aborts %d, received %q", c.aborts, c.received())
		}
	})
}

func TestSendError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gone := errors.New("connection reset by peer")
		o := New(Config[string]{Max: 100, StallTimeout: time.Second,
			Send:  func(string, func()) error { return gone },
			Abort: func() {}})
		defer o.Close()
		_ = o.Push(context.Background(), "a")
		<-o.Done()
		if err := o.Err(); !errors.Is(err, gone) {
			t.Errorf("Err() = %v, want the Send's error", err)
		}
		if err := o.Push(context.Background(), "b"); !errors.Is(err, gone) {
			t.Errorf("Push after a failed Send = %v", err)
		}
	})
}

// A client that catches up after a stall keeps its queue: nothing is lost
// when it resumes within the timeout.
func TestResumesWithinTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 100, 10*time.Second)
		defer o.Close()
		push(t, o, "a", "b", "c")
		time.Sleep(9 * time.Second)
		c.unstall()
		synctest.Wait()
		time.Sleep(time.Minute)
		if err := o.Err(); err != nil || !slices.Equal(c.received(), []string{"a", "b", "c"}) {
			t.Errorf("err %v, received %q", err, c.received())
		}
	})
}

// Drain waits for what is queued to be sent, so that an owner ending a
// stream cleanly does not abort the last Send; a stalled client is cut
// by the watchdog, which bounds the wait, and the context ends it too.
func TestDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 100, 10*time.Second)
		defer o.Close()
		push(t, o, "a", "b")
		drained := make(chan error, 1)
		go func() { drained <- o.Drain(context.Background()) }()
		time.Sleep(time.Second)
		synctest.Wait()
		if len(drained) != 0 {
			t.Fatal("Drain returned with messages queued")
		}
		c.unstall()
		synctest.Wait()
		if err := <-drained; err != nil || !slices.Equal(c.received(), []string{"a", "b"}) {
			t.Fatalf("Drain = %v, received %q", err, c.received())
		}
		c.stall()
		push(t, o, "c")
		ctx, cancel := context.WithCancelCause(context.Background())
		cause := errors.New("client gone")
		time.AfterFunc(time.Second, func() { cancel(cause) })
		if err := o.Drain(ctx); !errors.Is(err, cause) {
			t.Fatalf("Drain whose context ended = %v, want its cause", err)
		}
		start := time.Now()
		var drop *DropError
		if err := o.Drain(context.Background()); !errors.As(err, &drop) || drop.Reason != Stalled || time.Since(start) != 9*time.Second {
			t.Fatalf("Drain of a stalled client = %v after %v, want the cut at 10s after the Send started", err, time.Since(start))
		}
	})
}

// A message larger than the bound is accepted when nothing waits behind
// the first message, even if that one has not started to be sent (an
// empty first message, such as an HTTP stream's headers, and a large
// resync pushed before the sender took it).
func TestLargeMessageBehindEmptyHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 10, time.Hour)
		defer o.Close()
		push(t, o, "", "a resync larger than the bound")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := o.Push(ctx, "then a second"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a second large message while one waits: Push = %v, want it to wait", err)
		}
	})
}

// The sender goroutine runs while there is something to send and for
// SenderLinger after; an idle client holds none, and the next Push starts
// one again.
func TestSenderOnlyWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		exited := 0
		o := New(Config[string]{Max: 10, StallTimeout: time.Second, Send: c.send, Abort: c.abort,
			Exited: func() { exited++ }})
		running := func() bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			return o.running
		}
		if running() {
			t.Fatal("a sender runs before the first Push")
		}
		push(t, o, "a")
		time.Sleep(SenderLinger - time.Nanosecond)
		synctest.Wait()
		if !running() {
			t.Fatal("the sender returned before SenderLinger passed")
		}
		push(t, o, "b") // the lingering sender takes it
		time.Sleep(SenderLinger)
		synctest.Wait()
		if running() {
			t.Fatal("the sender still runs SenderLinger after the queue emptied")
		}
		push(t, o, "c")
		synctest.Wait()
		if got := c.received(); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("sent %q", got)
		}
		if exited != 0 {
			t.Errorf("Exited called %d times before Stop", exited)
		}
		time.Sleep(SenderLinger)
		synctest.Wait()
		o.Close() // no sender: Close returns at once and Exited is called
		if exited != 1 {
			t.Errorf("Exited called %d times after Close, want 1", exited)
		}
	})
}

// Close lets a Send in progress finish within CloseGrace (a stream that
// ends does not cut a message short for a client that reads), and aborts
// one that has not finished by then; what was not begun is dropped.
func TestCloseLetsSendFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 100, time.Hour)
		push(t, o, "in flight", "not begun")
		synctest.Wait()
		closed := make(chan struct{})
		go func() { o.Close(); close(closed) }()
		time.Sleep(CloseGrace - time.Nanosecond)
		c.unstall()
		<-closed
		if got := c.received(); !slices.Equal(got, []string{"in flight"}) || c.aborts != 0 {
			t.Errorf("received %q, aborts %d; want the message in flight whole, and no abort", got, c.aborts)
		}

		c = newClient()
		c.stall()
		o = newOutbox(c, 100, time.Hour)
		push(t, o, "stuck")
		synctest.Wait()
		start := time.Now()
		o.Close()
		if d := time.Since(start); d != CloseGrace || c.aborts != 1 {
			t.Errorf("Close of a stalled Send returned after %v with %d aborts, want CloseGrace and 1", d, c.aborts)
		}
	})
}

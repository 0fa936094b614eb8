package outbox

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
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

func newOutbox(c *client, maxBytes int, stall time.Duration) *Outbox[string] {
	return New(Config[string]{MaxBytes: maxBytes, StallTimeout: stall,
		Size: func(s string) int { return len(s) }, Send: c.send, Abort: c.abort})
}

func TestSendsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		o := newOutbox(c, 10, time.Second)
		defer o.Close()
		for _, m := range []string{"a", "bb", "ccc"} {
			if err := o.Put(m); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if got := c.received(); !slices.Equal(got, []string{"a", "bb", "ccc"}) {
			t.Errorf("sent %q", got)
		}
		if q := o.Queued(); q != 0 {
			t.Errorf("Queued() = %d after everything was sent", q)
		}
	})
}

// The bytes bound counts what waits behind the message being sent: a
// large first message goes out, and a client that takes nothing is cut
// off once more than MaxBytes wait.
func TestQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 10, time.Hour)
		defer o.Close()
		if err := o.Put("a snapshot larger than the bound"); err != nil {
			t.Fatalf("a first message larger than MaxBytes: %v", err)
		}
		synctest.Wait()                                // its Send is blocked
		for _, m := range []string{"12345", "67890"} { // exactly MaxBytes behind it
			if err := o.Put(m); err != nil {
				t.Fatalf("Put(%q) within the bound: %v", m, err)
			}
		}
		err := o.Put("x")
		var de *DropError
		if !errors.As(err, &de) || de.Reason != QueueFull || de.MaxBytes != 10 || de.Queued != 42 {
			t.Fatalf("Put beyond the bound = %v, want a QueueFull DropError with 42 bytes queued", err)
		}
		select {
		case <-o.Done():
		default:
			t.Error("Done is not closed after the drop")
		}
		synctest.Wait() // the aborted Send returns
		if o.Err() != err {
			t.Errorf("Err() = %v, want the drop", o.Err())
		}
		if q := o.Queued(); q != 0 {
			t.Errorf("Queued() = %d after the drop: the messages are still held", q)
		}
		if err := o.Put("y"); !errors.As(err, &de) {
			t.Errorf("Put after the drop = %v", err)
		}
		if len(c.received()) != 0 || c.aborts != 1 {
			t.Errorf("received %q, aborts %d; want nothing and one abort", c.received(), c.aborts)
		}
	})
}

// A Send without progress for StallTimeout cuts the client off, not a
// moment earlier.
func TestStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 1<<20, 10*time.Second)
		defer o.Close()
		start := time.Now()
		if err := o.Put("event"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10*time.Second - time.Nanosecond)
		if err := o.Err(); err != nil {
			t.Fatalf("cut off after %v: %v", time.Since(start), err)
		}
		<-o.Done()
		var de *DropError
		if err := o.Err(); !errors.As(err, &de) || de.Reason != Stalled || de.Queued != 5 {
			t.Fatalf("Err() = %v, want a Stalled DropError with 5 bytes queued", err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("cut off after %v, want 10s", d)
		}
		synctest.Wait()
		if c.aborts != 1 {
			t.Errorf("aborts = %d, want 1", c.aborts)
		}
	})
}

// A slow client that keeps taking parts of a long message is not cut off:
// each bit of progress restarts the clock.
func TestProgressKeepsSlowClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		aborted := make(chan struct{})
		var chunks int
		o := New(Config[string]{MaxBytes: 10, StallTimeout: time.Second,
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
		if err := o.Put("twenty bytes, slowly"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * 900 * time.Millisecond)
		synctest.Wait()
		if err := o.Err(); err != nil || chunks != 20 || o.Queued() != 0 {
			t.Errorf("after 18s: err %v, %d of 20 bytes taken, %d queued", err, chunks, o.Queued())
		}
	})
}

func TestCloseAbortsSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 100, time.Hour)
		if err := o.Put("stuck"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		o.Close() // returns although the Send was blocked
		if err := o.Err(); !errors.Is(err, ErrClosed) {
			t.Errorf("Err() = %v, want ErrClosed", err)
		}
		if err := o.Put("late"); !errors.Is(err, ErrClosed) {
			t.Errorf("Put after Close = %v, want ErrClosed", err)
		}
		if c.aborts != 1 {
			t.Errorf("aborts = %d, want 1", c.aborts)
		}
		o.Close() // idempotent
	})
}

// Close of an idle outbox does not call Abort: nothing is in progress.
func TestCloseIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		o := newOutbox(c, 100, time.Second)
		if err := o.Put("a"); err != nil {
			t.Fatal(err)
		}
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
		o := New(Config[string]{MaxBytes: 100, StallTimeout: time.Second,
			Size:  func(s string) int { return len(s) },
			Send:  func(string, func()) error { return gone },
			Abort: func() {}})
		defer o.Close()
		_ = o.Put("a")
		<-o.Done()
		if err := o.Err(); !errors.Is(err, gone) {
			t.Errorf("Err() = %v, want the Send's error", err)
		}
		if err := o.Put("b"); !errors.Is(err, gone) {
			t.Errorf("Put after a failed Send = %v", err)
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
		for _, m := range []string{"a", "b", "c"} {
			_ = o.Put(m)
		}
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
// by the watchdog, which bounds the wait.
func TestDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 100, 10*time.Second)
		defer o.Close()
		for _, m := range []string{"a", "b"} {
			if err := o.Put(m); err != nil {
				t.Fatal(err)
			}
		}
		drained := make(chan error, 1)
		go func() { drained <- o.Drain() }()
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
		if err := o.Put("c"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var drop *DropError
		if err := o.Drain(); !errors.As(err, &drop) || drop.Reason != Stalled || time.Since(start) != 10*time.Second {
			t.Fatalf("Drain of a stalled client = %v after %v", err, time.Since(start))
		}
	})
}

// A message larger than the bound is accepted when nothing waits behind
// the first message, even if that one has not started to be sent (an
// empty first message, such as an HTTP stream's headers, and a large
// resync Put before the sender took it).
func TestLargeMessageBehindEmptyHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient()
		c.stall()
		o := newOutbox(c, 10, time.Hour)
		defer o.Close()
		if err := o.Put(""); err != nil {
			t.Fatal(err)
		}
		if err := o.Put("a resync larger than the bound"); err != nil {
			t.Fatalf("a large message behind an empty one: %v", err)
		}
		if err := o.Put("then a second"); err == nil {
			t.Fatal("a second large message was accepted while one waits")
		}
	})
}

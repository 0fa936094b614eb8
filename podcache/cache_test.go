package podcache

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestGetMissing(t *testing.T) {
	c := New()
	s, err := c.Get("x")
	if err != nil || s.UID != "x" || len(s.ContainerStatuses) != 0 {
		t.Fatalf("Get of a missing entry: %+v %v", s, err)
	}
}

func TestSetGetDelete(t *testing.T) {
	c := New()
	boom := errors.New("boom")
	c.Set("a", &cruntime.PodStatus{UID: "a", Name: "n"}, boom, t0)
	s, err := c.Get("a")
	if s.Name != "n" || err != boom {
		t.Fatalf("%+v %v", s, err)
	}
	c.Delete("a")
	if s, err := c.Get("a"); s.Name != "" || err != nil {
		t.Fatalf("after Delete: %+v %v", s, err)
	}
}

func TestGetNewerThanReturnsAtOnce(t *testing.T) {
	c := New()
	c.Set("a", &cruntime.PodStatus{UID: "a", Name: "n"}, nil, t0)
	if s, err := c.GetNewerThan(context.Background(), "a", t0.Add(-time.Nanosecond)); err != nil || s.Name != "n" {
		t.Fatalf("%+v %v", s, err)
	}
	// The global timestamp counts too.
	c.UpdateTime(t0.Add(time.Second))
	if _, err := c.GetNewerThan(context.Background(), "b", t0); err != nil {
		t.Fatal(err)
	}
}

func TestGetNewerThanBlocksUntilSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New()
		c.Set("a", &cruntime.PodStatus{UID: "a", Name: "old"}, nil, t0)
		got := make(chan string, 1)
		go func() {
			s, _ := c.GetNewerThan(context.Background(), "a", t0) // not strictly newer: blocks
			got <- s.Name
		}()
		waitWaiters(t, c, 1)
		c.Set("b", &cruntime.PodStatus{UID: "b"}, nil, t0.Add(time.Second)) // another pod: no wake
		c.Set("a", &cruntime.PodStatus{UID: "a", Name: "older"}, nil, t0.Add(-time.Second))
		// A wake-up is handed over and the waiter dropped within Set: still
		// waiting now means not woken, however slow the machine.
		if n := c.Waiters(); n != 1 {
			t.Fatalf("%d waiters after Sets that must not wake it, want 1", n)
		}
		synctest.Wait() // a wrong wake-up has delivered by now
		select {
		case n := <-got:
			t.Fatalf("woke on an older Set: %q", n)
		default:
		}
		c.Set("a", &cruntime.PodStatus{UID: "a", Name: "new"}, nil, t0)
		if n := <-got; n != "new" {
			t.Fatalf("woke with %q", n)
		}
	})
}

func TestUpdateTimeWakesWithEmptyStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New()
		got := make(chan *cruntime.PodStatus, 1)
		go func() {
			s, _ := c.GetNewerThan(context.Background(), "gone", t0)
			got <- s
		}()
		waitWaiters(t, c, 1)
		c.UpdateTime(t0)
		if s := <-got; s.UID != "gone" {
			t.Fatalf("%+v", s)
		}
	})
}

func TestGetNewerThanContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.GetNewerThan(ctx, "a", t0)
			errc <- err
		}()
		waitWaiters(t, c, 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
		if n := c.Waiters(); n != 0 {
			t.Fatalf("%d waiters left behind", n)
		}
	})
}

func TestMarkObserved(t *testing.T) {
	c := New()
	c.Set("a", &cruntime.PodStatus{UID: "a", Name: "n"}, nil, t0)
	c.MarkObserved("a", t0.Add(time.Second))
	if e, _ := c.Entry("a"); !e.Modified.Equal(t0.Add(time.Second)) || e.Status.Name != "n" {
		t.Fatalf("%+v", e)
	}
	c.MarkObserved("missing", t0)
	if c.Len() != 1 {
		t.Fatal("MarkObserved created an entry")
	}
}

// waitWaiters waits, in a synctest bubble, until every goroutine of the
// bubble is blocked, and checks that n of them wait in GetNewerThan.
func waitWaiters(t *testing.T, c *Cache, n int) {
	t.Helper()
	synctest.Wait()
	if got := c.Waiters(); got != n {
		t.Fatalf("want %d waiters, have %d", n, got)
	}
}

func BenchmarkSetGet(b *testing.B) {
	c := New()
	st := &cruntime.PodStatus{UID: "a"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.Set("a", st, nil, t0.Add(time.Duration(i)))
		c.Get("a")
	}
}

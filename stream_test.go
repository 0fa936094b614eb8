package pleg

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeEvents is a scripted cruntime.EventSource: each WatchEvents call takes
// the next session; a session connects (or fails at once with err), sends
// its events, then ends with end (nil: stays open until ctx ends).
type fakeEvents struct {
	mu       sync.Mutex
	sessions []fakeSession
	calls    int
	live     chan cruntime.Event // events sent to the open session
}

type fakeSession struct {
	err    error // returned at once, without connecting
	events []cruntime.Event
	end    error // returned after the events; nil keeps the stream open
}

func (f *fakeEvents) WatchEvents(ctx context.Context, connected func(), fn func(cruntime.Event)) error {
	f.mu.Lock()
	f.calls++
	var s fakeSession
	if len(f.sessions) > 0 {
		s, f.sessions = f.sessions[0], f.sessions[1:]
	}
	f.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	connected()
	for _, e := range s.events {
		fn(e)
	}
	if s.end != nil {
		return s.end
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-f.live:
			fn(e)
		}
	}
}

func (f *fakeEvents) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// An event turns into a single-pod relist of its pod, long before the next
// global relist, and its latency is measured.
func TestRuntimeEventTriggersPodRelist(t *testing.T) {
	rt := newFakeRuntime()
	src := &fakeEvents{live: make(chan cruntime.Event)}
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) {
		o.EventSource, o.Metrics, o.RelistPeriod = src, m, time.Hour
	})
	rt.setPods(pod("a", "c1=running"))
	ch := g.Watch()
	g.Start()
	if e := <-ch; e.ContainerID != "c1" {
		t.Fatalf("first relist: %+v", e)
	}
	waitFor(t, func() bool { return g.EventStream().State == StreamConnected })

	clk.Step(time.Second)
	rt.setPods(pod("a", "c1=exited"))
	src.live <- cruntime.Event{ContainerID: "c1", Type: cruntime.EventStopped, PodUID: "a", CreatedAt: clk.Now().Add(-2 * time.Millisecond)}
	e := <-ch
	if e.Type != ContainerDied || e.ContainerID != "c1" {
		t.Fatalf("event %+v", e)
	}
	if rt.count("ListPods") != 1 || rt.count("ListPod") != 1 {
		t.Fatalf("calls %v: want one global and one single-pod relist", rt.calls)
	}
	if n := testutil.CollectAndCount(m.EventDeliveryLatency); n != 1 {
		t.Fatalf("latency histogram has %d series", n)
	}
	if got := testutil.ToFloat64(m.EventedConnectionSuccess); got != 1 {
		t.Fatalf("connection success count %v", got)
	}
	if s := g.EventStream(); s.Events != 1 || s.Connects != 1 {
		t.Fatalf("stream status %+v", s)
	}
}

// A runtime without events is said once, the relist goes on, and the
// stream is probed again only rarely.
func TestRuntimeWithoutEvents(t *testing.T) {
	rt := newFakeRuntime()
	unsupported := errors.Join(cruntime.ErrEventsUnsupported, errors.New("unimplemented"))
	src := &fakeEvents{sessions: []fakeSession{{err: unsupported}, {err: unsupported}}}
	g, clk := newTestGenerator(t, rt, func(o *Options) { o.EventSource = src })
	g.Start()
	waitFor(t, func() bool { return g.EventStream().State == StreamUnsupported })
	clk.Step(time.Minute)
	time.Sleep(10 * time.Millisecond)
	if src.count() != 1 {
		t.Fatalf("probed %d times within a minute", src.count())
	}
	clk.Step(streamUnsupportedWait)
	waitFor(t, func() bool { return src.count() == 2 })

	// A stream that connects and closes at once without events is the
	// same thing (CRI-O without pod events).
	src2 := &fakeEvents{sessions: []fakeSession{{end: errors.New("EOF")}}}
	g2, _ := newTestGenerator(t, rt, func(o *Options) { o.EventSource = src2 })
	g2.Start()
	waitFor(t, func() bool { return g2.EventStream().State == StreamUnsupported })
}

// A broken stream reconnects: the first retry at once, then with backoff.
func TestEventStreamReconnects(t *testing.T) {
	rt := newFakeRuntime()
	m := metrics.New(nil)
	boom := errors.New("connection reset")
	src := &fakeEvents{live: make(chan cruntime.Event), sessions: []fakeSession{
		{events: []cruntime.Event{{PodUID: "a", ContainerID: "x"}}, end: boom}, // up, then breaks
		{err: boom}, // the immediate retry fails
		{},          // after the backoff: stays up
	}}
	g, clk := newTestGenerator(t, rt, func(o *Options) { o.EventSource, o.Metrics = src, m })
	g.Start()
	waitFor(t, func() bool { return src.count() == 2 && g.EventStream().State == StreamBackoff })
	if got := testutil.ToFloat64(m.EventedConnectionErrors); got != 2 {
		t.Fatalf("connection errors %v", got)
	}
	clk.Step(2 * streamBackoffBase)
	waitFor(t, func() bool { return g.EventStream().State == StreamConnected && src.count() == 3 })
}

func TestStreamBackoff(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	if d := streamBackoff(0, rng); d != 0 {
		t.Fatalf("first retry waits %v", d)
	}
	prev := time.Duration(0)
	for n := 1; n < 20; n++ {
		d := streamBackoff(n, rng)
		if d > streamBackoffCap || d <= 0 {
			t.Fatalf("backoff(%d) = %v", n, d)
		}
		if n < 5 && d < prev/2 {
			t.Fatalf("backoff not growing: %v after %v", d, prev)
		}
		prev = d
	}
	if d := streamBackoff(30, rng); d < streamBackoffCap*8/10 {
		t.Fatalf("backoff(30) = %v, want near the cap", d)
	}
}

// With the stream down or events dropped, the periodic relist still
// delivers every change with the same events.
func TestEventsDroppedRelistStillDelivers(t *testing.T) {
	steps := [][]*cruntime.Pod{
		{pod("a", "c1=running", "s:s1=running")},
		{pod("a", "c1=exited", "s:s1=running"), pod("b", "c2=running")},
		{pod("b", "c2=exited")},
	}
	run := func(withEvents bool) []string {
		rt := newFakeRuntime()
		src := &fakeEvents{live: make(chan cruntime.Event, 10)}
		g, _ := newTestGenerator(t, rt, func(o *Options) { o.EventSource = src })
		ch := g.Watch()
		var out []string
		for _, pods := range steps {
			rt.setPods(pods...)
			if withEvents {
				// Only some events arrive; the others were dropped.
				g.RequestRelist(pods[0].UID)
				g.step(context.Background(), time.Now().Add(time.Hour))
			}
			g.relist(context.Background())
			out = append(out, formatEvents(drain(ch))...)
		}
		return out
	}
	without, with := run(false), run(true)
	if len(without) == 0 || !sameMultiset(without, with) {
		t.Fatalf("events differ\nwithout %v\nwith    %v", without, with)
	}
}

func sameMultiset(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[string]int{}
	for _, x := range a {
		count[x]++
	}
	for _, x := range b {
		count[x]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}

package pleg

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testclock "k8s.io/utils/clock/testing"
)

// advanceUntil fires the fake clock's due timers until cond holds: the
// relist goroutine may create its next timer just after a Step, and a
// timer already due fires at the next Step, even of zero.
func advanceUntil(t *testing.T, clk *testclock.FakeClock, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		clk.Step(0)
		time.Sleep(time.Millisecond)
	}
}

// relistedOnePod returns a generator, driven by hand, that has relisted
// pod a (one running container c1) once, and its drained Watch channel.
func relistedOnePod(t *testing.T, mod func(*Options)) (*fakeRuntime, *Generator, *testclock.FakeClock, <-chan *Event) {
	t.Helper()
	rt := newFakeRuntime()
	rt.setPods(pod("a", "c1=running"))
	g, clk := newTestGenerator(t, rt, mod)
	ch := g.Watch()
	g.step(context.Background(), time.Time{})
	drain(ch)
	return rt, g, clk, ch
}

// The case, on the relist goroutine: a pod whose status calls and
// whose filtered list calls hang, and whose runtime events keep coming.
// Global relists keep their period, health holds, the pod gets one call at
// a time, the hang is named, counted and cached, and once the runtime
// answers again the pod's transition is delivered.
func TestHungPodWithEventsDoesNotHoldRelists(t *testing.T) {
	rt := newFakeRuntime()
	rt.setPods(pod("ok", "c1=running"), pod("hung", "c2=running"))
	src := &fakeEvents{live: make(chan cruntime.Event, 100)}
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) {
		o.EventSource = src
		o.Metrics = m
		o.PodInspectionTimeout = 500 * time.Millisecond
	})
	ch := g.Watch()
	g.Start()
	advanceUntil(t, clk, "the first relist", func() bool { return len(g.RecentRelists()) == 1 })
	drain(ch)

	release := make(chan struct{})
	rt.mu.Lock()
	rt.hang["hung"] = release
	rt.hangList["hung"] = release
	rt.mu.Unlock()
	rt.setPods(pod("ok", "c1=running"), pod("hung", "c2=exited"))

	event := func() {
		src.live <- cruntime.Event{PodUID: "hung", ContainerID: "c2", Type: cruntime.EventStopped, CreatedAt: clk.Now()}
	}
	event()
	advanceUntil(t, clk, "the single-pod relist's list call", func() bool { return rt.count("ListPod") == 1 })
	// Before the next global relist is due, the list call exceeds the
	// pod inspection timeout: named, counted, cached, abandoned.
	clk.Step(600 * time.Millisecond)
	advanceUntil(t, clk, "the list call's timeout", func() bool {
		return testutil.ToFloat64(m.InspectionTimeouts.WithLabelValues("list_containers")) == 1
	})

	// Thirty periods with more events for the pod: a global relist each,
	// and no second call for the pod.
	start := len(g.RecentRelists())
	for i := 1; i <= 30; i++ {
		clk.Step(time.Second)
		event()
		want := start + i
		advanceUntil(t, clk, fmt.Sprintf("global relist %d", i), func() bool { return len(g.RecentRelists()) >= want })
		if ok, err := g.Healthy(); !ok {
			t.Fatalf("unhealthy after %d periods: %v", i, err)
		}
	}
	rs := g.RecentRelists()[start:]
	for _, r := range rs {
		if r.Duration > 500*time.Millisecond {
			t.Fatalf("a relist took %v, more than the pod inspection timeout", r.Duration)
		}
	}
	lists := len(g.RecentRelists())
	if n := rt.count("ListPod") + rt.count("PodStatus"); n > 3 {
		// The first relist's status call, the single-pod list call; the
		// global relists see that call out and make none.
		t.Fatalf("%d calls for the hung pod: a second call while one was out", n)
	}
	if got := testutil.ToFloat64(m.InspectionTimeouts.WithLabelValues("list_containers")); got != 1 {
		t.Fatalf("list_containers timeouts %v, want 1", got)
	}
	_, err := g.Cache().Get("hung")
	var te *InspectionTimeoutError
	if !errors.As(err, &te) || te.Call() != "ListContainers" || te.Pod != "ns/name-hung" {
		t.Fatalf("cached error for the hung pod: %v", err)
	}
	if _, err := g.Cache().Get("ok"); err != nil {
		t.Fatalf("the other pod's entry: %v", err)
	}
	if got := drain(ch); len(got) != 0 {
		t.Fatalf("events before the runtime answered: %v", formatEvents(got))
	}

	// The runtime answers again: the transition is delivered once.
	rt.mu.Lock()
	delete(rt.hang, "hung")
	delete(rt.hangList, "hung")
	rt.mu.Unlock()
	close(release)
	advanceUntil(t, clk, "the died event", func() bool { return len(ch) > 0 })
	clk.Step(time.Second) // and one more global relist: no duplicate
	advanceUntil(t, clk, "the next relist", func() bool { return len(g.RecentRelists()) > lists })
	if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"hung ContainerDied c2 exit=0"}) {
		t.Fatalf("events after the release: %v", got)
	}
	if _, err := g.Cache().Get("hung"); err != nil {
		t.Fatalf("cached error after the release: %v", err)
	}
}

// A storm of hints while every single-pod relist's call hangs: the global
// relist still comes every period, at most MaxParallelInspections calls are
// out, and the requests a global relist covered are dropped without a call.
func TestHintStormDoesNotStarveRelists(t *testing.T) {
	rt := newFakeRuntime()
	var pods []*cruntime.Pod
	for i := range 500 {
		pods = append(pods, pod(fmt.Sprintf("p%03d", i), fmt.Sprintf("c%d=running", i)))
	}
	rt.setPods(pods...)
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) {
		o.Metrics = m
		o.MaxParallelInspections = 4
	})
	g.Start()
	advanceUntil(t, clk, "the first relist", func() bool { return len(g.RecentRelists()) == 1 })
	release := make(chan struct{})
	rt.mu.Lock()
	for _, p := range pods {
		rt.hangList[p.UID] = release
	}
	rt.mu.Unlock()

	for round := 1; round <= 5; round++ {
		for range 4 {
			for _, p := range pods {
				g.RequestRelist(p.UID)
			}
		}
		clk.Step(time.Second)
		want := 1 + round
		advanceUntil(t, clk, fmt.Sprintf("global relist %d", round), func() bool { return len(g.RecentRelists()) >= want })
	}
	if n := rt.count("ListPod"); n > 4 {
		t.Fatalf("%d single-pod list calls out, want at most 4 (the bound)", n)
	}
	if ok, err := g.Healthy(); !ok {
		t.Fatal(err)
	}
	close(release)
	// Every request left was covered by a later global relist: dropped.
	clk.Step(time.Second)
	advanceUntil(t, clk, "the covered requests dropped", func() bool {
		return g.requests.len() == 0 && testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(metrics.SkipCovered)) > 0
	})
}

// containerd 2.x replays the events it kept while nobody subscribed: an
// event older than the last global relist makes no runtime call.
func TestStaleRuntimeEventsMakeNoCall(t *testing.T) {
	rt := newFakeRuntime()
	rt.setPods(pod("a", "c1=running"))
	src := &fakeEvents{live: make(chan cruntime.Event, 10)}
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) { o.EventSource = src; o.Metrics = m })
	g.Start()
	advanceUntil(t, clk, "the first relist", func() bool { return len(g.RecentRelists()) == 1 })
	relisted := clk.Now()
	stale := testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(metrics.SkipStaleEvent))
	for i := range 5 {
		src.live <- cruntime.Event{PodUID: "a", ContainerID: "c1", Type: cruntime.EventStarted,
			CreatedAt: relisted.Add(-5*time.Minute + time.Duration(i)*time.Second)}
	}
	advanceUntil(t, clk, "the replay counted", func() bool {
		return testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(metrics.SkipStaleEvent)) == stale+5
	})
	if n := rt.count("ListPod"); n != 0 {
		t.Fatalf("replayed events made %d list calls", n)
	}
	// A fresh event does make one.
	src.live <- cruntime.Event{PodUID: "a", ContainerID: "c1", Type: cruntime.EventStopped, CreatedAt: relisted}
	advanceUntil(t, clk, "the fresh event's relist", func() bool { return rt.count("ListPod") == 1 })
}

// A global relist that finds a pod with a single-pod relist's call out
// makes no second call while that one is out: it waits for it (within the
// pod inspection timeout), then inspects the pod itself, so a global relist
// still covers every change before its start. The transition is delivered
// once, and the single-pod relist's late result is dropped.
func TestGlobalRelistWaitsForPodCallOut(t *testing.T) {
	rt, g, clk, ch := relistedOnePod(t, nil)
	ctx := context.Background()

	release := make(chan struct{})
	rt.mu.Lock()
	rt.hang["a"] = release
	rt.mu.Unlock()
	rt.setPods(pod("a", "c1=exited"))
	clk.Step(100 * time.Millisecond)
	g.RequestRelist("a")
	g.dispatchPodRelists()
	g.podCallDone(<-g.podResults) // the list call; starts the status call, which hangs
	waitFor(t, func() bool { return rt.count("PodStatus") == 2 })

	clk.Step(time.Second)
	relisted := make(chan error, 1)
	go func() { relisted <- g.relist(ctx) }()
	time.Sleep(20 * time.Millisecond) // time for a wrong second call to show
	if n := rt.count("PodStatus"); n != 2 {
		t.Fatalf("the global relist made a second status call while one was out (%d)", n)
	}
	select {
	case err := <-relisted:
		t.Fatalf("the global relist ended without the pod's status: %v", err)
	default:
	}
	rt.mu.Lock()
	delete(rt.hang, "a")
	rt.mu.Unlock()
	close(release)
	if err := <-relisted; err != nil {
		t.Fatal(err)
	}
	if n := rt.count("PodStatus"); n != 3 {
		t.Fatalf("status calls %d, want 3 (the global relist's own after the single-pod one)", n)
	}
	if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerDied c1 exit=0"}) {
		t.Fatalf("events %v", got)
	}
	if err := g.settlePodRelists(ctx); err != nil {
		t.Fatal(err)
	}
	g.step(ctx, clk.Now())
	if got := drain(ch); len(got) != 0 {
		t.Fatalf("duplicate events %v", formatEvents(got))
	}
}

// A cruntime.Runtime that answers nil where the contract promises a value
// gets a clear error, never a panic, and loses nothing.
func TestMalformedRuntimeAnswers(t *testing.T) {
	t.Run("nil pod in a listing", func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		rt.nilPods = true
		g, _ := newTestGenerator(t, rt, nil)
		ch := g.Watch()
		if err := g.relist(context.Background()); !errors.Is(err, ErrMalformed) {
			t.Fatalf("relist error %v", err)
		}
		if got := drain(ch); len(got) != 0 {
			t.Fatalf("events from a malformed listing: %v", formatEvents(got))
		}
		rt.nilPods = false
		g.relist(context.Background())
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1"}) {
			t.Fatalf("events once the listing is whole: %v", got)
		}
	})
	for name, status := range map[string]*cruntime.PodStatus{
		"nil status":           nil,
		"nil container status": {UID: "a", ContainerStatuses: []*cruntime.ContainerStatus{nil}},
		"nil sandbox status":   {UID: "a", SandboxStatuses: []*cruntime.SandboxStatus{nil}},
	} {
		t.Run(name, func(t *testing.T) {
			rt := &nilStatusRuntime{fakeRuntime: newFakeRuntime(), status: status}
			rt.setPods(pod("a", "c1=running", "s:s1=running"))
			g, _ := newTestGenerator(t, rt, nil)
			ch := g.Watch()
			g.relist(context.Background())
			if _, err := g.Cache().Get("a"); !errors.Is(err, ErrMalformed) {
				t.Fatalf("cached error %v", err)
			}
			if got := drain(ch); len(got) != 0 {
				t.Fatalf("events %v", formatEvents(got))
			}
			rt.status = nil
			rt.fixed = true
			g.relist(context.Background()) // reinspected: nothing lost
			if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1", "a ContainerStarted s1"}) {
				t.Fatalf("events after the fix %v", got)
			}
		})
	}
}

type nilStatusRuntime struct {
	*fakeRuntime
	status *cruntime.PodStatus
	fixed  bool
}

func (r *nilStatusRuntime) PodStatus(ctx context.Context, p *cruntime.Pod) (*cruntime.PodStatus, error) {
	if r.fixed {
		return r.fakeRuntime.PodStatus(ctx, p)
	}
	return r.status, nil
}

// An outside reinspection request is served once: not lost when the
// single-pod relist that saw it is overtaken by a global relist, and not
// served twice when a single-pod relist already served it.
func TestReinspectRequestServedOnce(t *testing.T) {
	t.Run("not lost to a stale single-pod result", func(t *testing.T) {
		rt, g, clk, ch := relistedOnePod(t, nil)
		ctx := context.Background()
		// A single-pod list call goes out; a global relist starts while it
		// is out (a is unchanged: the relist does not wait for it); then
		// the request comes and the stale list result returns.
		release := make(chan struct{})
		rt.mu.Lock()
		rt.hangList["a"] = release
		rt.mu.Unlock()
		clk.Step(time.Second)
		g.RequestRelist("a")
		g.dispatchPodRelists()
		waitFor(t, func() bool { return rt.count("ListPod") == 1 })
		clk.Step(time.Second)
		g.relist(ctx)
		g.RequestReinspect("a")
		close(release)
		g.podCallDone(<-g.podResults)
		if got := drain(ch); len(got) != 0 {
			t.Fatalf("events from a stale result: %v", formatEvents(got))
		}
		clk.Step(time.Second)
		g.step(ctx, clk.Now())
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a PodSync"}) {
			t.Fatalf("the reinspection request was lost: events %v", got)
		}
	})
	t.Run("not served twice", func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		g, clk := newTestGenerator(t, rt, nil)
		ch := g.Watch()
		ctx := context.Background()
		rt.mu.Lock()
		rt.fail["a"] = errStatus
		rt.mu.Unlock()
		g.step(ctx, time.Time{}) // a's inspection fails: flagged
		rt.mu.Lock()
		delete(rt.fail, "a")
		rt.mu.Unlock()
		g.RequestReinspect("a")
		clk.Step(100 * time.Millisecond)
		g.RequestRelist("a")
		g.step(ctx, clk.Now().Add(time.Hour)) // the single-pod relist serves both
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1"}) {
			t.Fatalf("events of the single-pod relist %v", got)
		}
		clk.Step(time.Second)
		g.step(ctx, clk.Now())
		if got := drain(ch); len(got) != 0 {
			t.Fatalf("the served request was served again: %v", formatEvents(got))
		}
	})
}

// A single-pod call whose timer fired just as it returned is handled as
// returned: it does not untrack a call that is still out for the pod, so
// the pod never gets a second call.
func TestTimedOutButReturnedCallKeepsOneCallPerPod(t *testing.T) {
	rt := newFakeRuntime()
	rt.setPods(pod("a", "c1=running"))
	g, clk := newTestGenerator(t, rt, func(o *Options) { o.PodInspectionTimeout = time.Second })
	ctx := context.Background()
	g.step(ctx, time.Time{})

	release := make(chan struct{})
	rt.mu.Lock()
	rt.hangList["a"] = release
	rt.mu.Unlock()
	clk.Step(100 * time.Millisecond)
	g.RequestRelist("a")
	g.dispatchPodRelists()
	waitFor(t, func() bool { return rt.count("ListPod") == 1 })
	clk.Step(time.Second) // the watcher's timer fires...
	var in *inspection
	select {
	case in = <-g.podResults:
	case <-time.After(20 * time.Second):
		t.Fatal("the watcher did not report the timeout")
	}
	if !in.timedOut {
		t.Fatal("not timed out")
	}
	close(release) // ...and the call returns just after
	<-in.done
	// Meanwhile a global relist made its own call for a, which hangs and
	// is abandoned.
	hang := make(chan struct{})
	defer close(hang)
	rt.mu.Lock()
	rt.hang["a"] = hang
	rt.mu.Unlock()
	rt.setPods(pod("a", "c1=exited"))
	clk.Step(time.Second)
	relisted := make(chan struct{})
	go func() { g.relist(ctx); close(relisted) }()
	waitFor(t, func() bool { return rt.count("PodStatus") == 2 })
	clk.Step(time.Second) // its timer was set before its call went out
	select {
	case <-relisted:
	case <-time.After(20 * time.Second):
		t.Fatal("the global relist did not give up on the hung status call")
	}
	g.podCallDone(in) // the stale, timed-out-but-returned list call
	// (Were it abandoned now, its tracker would let go of the pod at once.)
	waitFor(t, func() bool { return g.inflight.get("a") != in })
	g.RequestRelist("a")
	g.dispatchPodRelists()
	if g.podCalls != 0 {
		t.Fatalf("a second call for the pod while its status call is out (%d single-pod calls started)", g.podCalls)
	}
	if n := g.InspectionsOutstanding(); n != 1 {
		t.Fatalf("outstanding inspections %d, want the hung status call", n)
	}
	if len(g.again) != 0 {
		t.Fatalf("again %v", g.again)
	}
}

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
	"k8s.io/apimachinery/pkg/types"
)

// Parallel inspection changes nothing observable but speed: the same events
// per pod in the same order, the same reinspection, the same cache.
func TestParallelInspectionMatchesSerial(t *testing.T) {
	listings := [][]*cruntime.Pod{}
	for step := range 6 {
		var pods []*cruntime.Pod
		for i := range 20 {
			if (i+step)%7 == 0 {
				continue // pods come and go
			}
			st := []string{"running", "exited", "unknown", "created"}[(i*step+i)%4]
			pods = append(pods, pod(fmt.Sprintf("p%02d", i), fmt.Sprintf("c%d-%d=%s", i, step/2, st), fmt.Sprintf("s:s%d=running", i)))
		}
		listings = append(listings, pods)
	}
	run := func(parallel int) (events map[types.UID][]string, cache []string) {
		rt := newFakeRuntime()
		g, clk := newTestGenerator(t, rt, func(o *Options) {
			o.MaxParallelInspections = parallel
			o.ChannelCapacity = 100000
		})
		ch := g.Watch()
		events = map[types.UID][]string{}
		for step, pods := range listings {
			rt.setPods(pods...)
			clear(rt.fail)
			rt.fail[types.UID(fmt.Sprintf("p%02d", step*3%20))] = errStatus
			clk.Step(time.Second)
			g.relist(context.Background())
			for _, e := range drain(ch) {
				events[e.PodUID] = append(events[e.PodUID], fmt.Sprintf("%d %s", step, formatEvents([]Event{e})[0]))
			}
		}
		for _, e := range g.Cache().List() {
			cache = append(cache, formatEntry(e.Status, e.Err))
		}
		return events, cache
	}
	serialEvents, serialCache := run(1)
	parEvents, parCache := run(8)
	if len(serialEvents) == 0 {
		t.Fatal("no events: the test proves nothing")
	}
	if !reflect.DeepEqual(serialEvents, parEvents) {
		t.Fatalf("events differ\nserial   %v\nparallel %v", serialEvents, parEvents)
	}
	if !reflect.DeepEqual(serialCache, parCache) {
		t.Fatalf("cache differs\nserial   %v\nparallel %v", serialCache, parCache)
	}
}

// A pod whose status call hangs no longer holds the relist: past the pod
// inspection timeout it is a failed inspection, reinspected later, while
// the other pods' events are delivered and health holds.
func TestHungPodDoesNotStallRelist(t *testing.T) {
	rt := newFakeRuntime()
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) {
		o.Metrics = m
		o.PodInspectionTimeout = 5 * time.Second
	})
	ch := g.Watch()
	release := make(chan struct{})
	rt.hang["hung"] = release
	rt.setPods(pod("ok", "c1=running"), pod("hung", "c2=running"))

	done := make(chan struct{})
	go func() { g.relist(context.Background()); close(done) }()
	// Wait until the relist waits on the hung pod's timer, then fire it.
	waitFor(t, func() bool { return clk.HasWaiters() })
	clk.Step(5 * time.Second)
	<-done

	if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"ok ContainerStarted c1"}) {
		t.Fatalf("events %v", got)
	}
	_, err := g.Cache().Get("hung")
	var te *InspectionTimeoutError
	if !errors.As(err, &te) || te.Operation != "container_status" || te.ID != "hung-container" {
		t.Fatalf("cached error %v", err)
	}
	if got := testutil.ToFloat64(m.InspectionTimeouts.WithLabelValues("container_status")); got != 1 {
		t.Fatalf("timeouts metric %v", got)
	}
	if ok, err := g.Healthy(); !ok {
		t.Fatal(err)
	}

	// The next relist makes no second call while the first is out.
	clk.Step(time.Second)
	g.relist(context.Background())
	if n := rt.count("PodStatus"); n != 2 {
		t.Fatalf("PodStatus calls %d, want 2 (no pile-up)", n)
	}
	if _, err := g.Cache().Get("hung"); !errors.As(err, &te) || !te.StillRunning {
		t.Fatalf("cached error %v", err)
	}
	// When the call finally returns, the pod is relisted on its own and
	// its transition is delivered.
	close(release)
	waitFor(t, func() bool { return g.requests.len() == 1 })
	g.step(context.Background(), clk.Now().Add(time.Hour))
	if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"hung ContainerStarted c2"}) {
		t.Fatalf("events after release %v", got)
	}
	if g.inflight.Len() != 0 {
		t.Fatal("abandoned inspection still tracked")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// Start runs the loop: the first relist at once, then one period after the
// end of each; Stop ends every goroutine and closes delivery.
func TestStartStop(t *testing.T) {
	rt := newFakeRuntime()
	rt.setPods(pod("a", "c1=running"))
	g, clk := newTestGenerator(t, rt, nil)
	ch := g.Watch()
	g.Start()
	e := <-ch
	if e.Type != ContainerStarted || e.ContainerID != "c1" || e.PodName != "name-a" {
		t.Fatalf("event %+v", e)
	}
	waitFor(t, func() bool { return clk.HasWaiters() })
	rt.setPods(pod("a", "c1=exited"))
	clk.Step(time.Second)
	e = <-ch
	if e.Type != ContainerDied {
		t.Fatalf("event %+v", e)
	}
	g.Stop()
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed after Stop")
	}
	g.Stop() // idempotent
}

package pleg

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
)

// The loop's tests run in a synctest bubble: the generator uses the real
// clock, which the bubble fakes; synctest.Wait returns once every goroutine
// of the bubble (the loop, the pool's calls, the stream) is blocked, so a
// check after it is exact, positive or negative.

// newLoopGenerator returns a generator on the (bubble's) real clock, unless
// mod sets Options.Clock (newTestGenerator); Stop runs at the test's end.
func newLoopGenerator(t *testing.T, rt cruntime.Runtime, mod func(*Options)) *Generator {
	t.Helper()
	opts := Options{Runtime: rt}
	if mod != nil {
		mod(&opts)
	}
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return g
}

// Start runs the loop: the first relist at once, then one period after the
// end of each; Stop ends every goroutine and closes delivery.
func TestStartStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		g := newLoopGenerator(t, rt, nil)
		ch := g.Watch()
		g.Start()
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1"}) {
			t.Fatalf("first relist: %v", got)
		}
		rt.setPods(pod("a", "c1=exited"))
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if rt.count("ListPods") != 1 {
			t.Fatalf("relisted before the period: %d", rt.count("ListPods"))
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerDied c1 exit=0"}) {
			t.Fatalf("second relist: %v", got)
		}
		g.Stop()
		if _, ok := <-ch; ok {
			t.Fatal("channel not closed after Stop")
		}
		g.Stop() // idempotent
	})
}

// Case 11: on-demand single-pod relists (period 2s). A request served
// before the timer fires wakes only its pod's waiter; a request that waits
// (here for the hint budget) when the timer fires is overtaken by the
// global relist, which wakes its pod's waiter, and is then skipped without
// a runtime call.
func TestRelistPodOnDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("1", "c1=running"), pod("2", "c2=running"))
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.RelistPeriod, o.Metrics = 2*time.Second, m
			o.PodRelistRate, o.PodRelistBurst, o.EarlyRelistGap = 0.001, 1, -1
		})
		g.Start()
		synctest.Wait()
		t1 := time.Now()
		woke := map[types.UID]chan error{"1": make(chan error, 1), "2": make(chan error, 1)}
		for uid, ch := range woke {
			go func() {
				_, err := g.Cache().GetNewerThan(context.Background(), uid, t1)
				ch <- err
			}()
		}
		synctest.Wait()
		if n := g.Cache().Waiters(); n != 2 {
			t.Fatalf("%d waiters blocked, want 2", n)
		}

		time.Sleep(time.Second)
		g.RequestRelist("1")
		synctest.Wait()
		if err := recv(woke["1"]); err != nil {
			t.Fatalf("pod 1's waiter: %v", err)
		}
		if len(woke["2"]) != 0 {
			t.Fatal("pod 2's waiter woke early")
		}
		if rt.count("ListPod") != 1 || rt.count("ListPods") != 1 {
			t.Fatalf("calls %v", rt.calls)
		}

		g.RequestRelist("2") // no token left: it waits
		synctest.Wait()
		if rt.count("ListPod") != 1 {
			t.Fatalf("the request did not wait: calls %v", rt.calls)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if err := recv(woke["2"]); err != nil {
			t.Fatalf("pod 2's waiter: %v", err)
		}
		if rt.count("ListPods") != 2 || rt.count("ListPod") != 1 {
			t.Fatalf("the covered request made a runtime call: %v", rt.calls)
		}
		if got := testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(SkipCovered)); got != 1 {
			t.Fatalf("covered requests %v, want 1", got)
		}
	})
}

func recv(ch chan error) error {
	select {
	case err := <-ch:
		return err
	default:
		return errors.New("not woken")
	}
}

// A pod whose status call hangs does not hold the relist: past the pod
// inspection timeout it is a failed inspection (named, counted, cached),
// the other pods' events are delivered, health holds, the pod gets no
// second call while the first is out, and once it returns the pod is
// relisted on its own and its transition delivered.
func TestHungPodDoesNotStallRelist(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) { o.Metrics = m; o.PodInspectionTimeout = 5 * time.Second })
		ch := g.Watch()
		release := make(chan struct{})
		rt.hang["hung"] = release
		rt.setPods(pod("ok", "c1=running"), pod("hung", "c2=running"))
		g.Start()
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"ok ContainerStarted c1"}) {
			t.Fatalf("events %v", got)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if rs := g.RecentRelists(); len(rs) != 1 || rs[0].TimedOut != 1 || rs[0].Duration != 5*time.Second {
			t.Fatalf("relists %+v, want one that ended at the timeout", rs)
		}
		_, err := g.Cache().Get("hung")
		var te *InspectionTimeoutError
		if !errors.As(err, &te) || te.Operation != "container_status" || te.ID != "hung-container" {
			t.Fatalf("cached error %v", err)
		}
		if got := testutil.ToFloat64(m.InspectionTimeouts.WithLabelValues("container_status")); got != 1 {
			t.Fatalf("timeouts metric %v", got)
		}
		if n := g.InspectionsOutstanding(); n != 1 {
			t.Fatalf("outstanding %d", n)
		}
		// Relists keep their period and make no second call.
		for range 5 {
			time.Sleep(time.Second)
			synctest.Wait()
			if ok, err := g.Healthy(); !ok {
				t.Fatal(err)
			}
		}
		if n := rt.count("Status"); n != 2 {
			t.Fatalf("status calls %d, want 2 (no pile-up)", n)
		}
		if _, err := g.Cache().Get("hung"); !errors.As(err, &te) || !te.StillRunning {
			t.Fatalf("cached error %v", err)
		}
		close(release)
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"hung ContainerStarted c2"}) {
			t.Fatalf("events after release %v", got)
		}
		if n := g.InspectionsOutstanding(); n != 0 {
			t.Fatalf("outstanding %d after the release", n)
		}
	})
}

// A storm of hints while every single-pod relist's call hangs: the global
// relist still comes every period, at most MaxParallelInspections calls
// are out, and the budget holds the single-pod relists to its rate.
func TestHintStormDoesNotStarveRelists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		var pods []*cruntime.Pod
		for i := range 500 {
			pods = append(pods, pod(fmt.Sprintf("p%03d", i), fmt.Sprintf("c%d=running", i)))
		}
		rt.setPods(pods...)
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) { o.Metrics = m; o.MaxParallelInspections = 4 })
		g.Start()
		synctest.Wait()
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
				synctest.Wait()
			}
			time.Sleep(time.Second)
			synctest.Wait()
			if n := len(g.RecentRelists()); n < 1+round {
				t.Fatalf("%d global relists after %d periods", n, round)
			}
		}
		if n := rt.count("ListPod"); n > 4 {
			t.Fatalf("%d single-pod list calls out, want at most 4 (the slots)", n)
		}
		if ok, err := g.Healthy(); !ok {
			t.Fatal(err)
		}
		close(release)
		synctest.Wait()
		if testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(SkipCovered)) == 0 {
			t.Fatal("no hint was covered by a global relist")
		}
	})
}

// Parallel inspection changes nothing observable but speed: the same
// events per pod in the same order, the same reinspection, the same cache.
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
			g.Relist(context.Background())
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

// A cruntime.Runtime that answers nil where the contract promises a value,
// or the wrong number of statuses, gets a clear error, never a panic, and
// loses nothing.
func TestMalformedRuntimeAnswers(t *testing.T) {
	t.Run("nil pod in a listing", func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		rt.nilPods = true
		g, _ := newTestGenerator(t, rt, nil)
		ch := g.Watch()
		if err := g.Relist(context.Background()); !errors.Is(err, ErrMalformed) {
			t.Fatalf("relist error %v", err)
		}
		if got := drain(ch); len(got) != 0 {
			t.Fatalf("events from a malformed listing: %v", formatEvents(got))
		}
		rt.nilPods = false
		g.Relist(context.Background())
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1"}) {
			t.Fatalf("events once the listing is whole: %v", got)
		}
	})
	t.Run("short status answer", func(t *testing.T) {
		rt := &shortRuntime{fakeRuntime: newFakeRuntime(), short: true}
		rt.setPods(pod("a", "c1=running", "s:s1=running"))
		g, _ := newTestGenerator(t, rt, nil)
		ch := g.Watch()
		g.Relist(context.Background())
		if _, err := g.Cache().Get("a"); !errors.Is(err, ErrMalformed) {
			t.Fatalf("cached error %v", err)
		}
		if got := drain(ch); len(got) != 0 {
			t.Fatalf("events %v", formatEvents(got))
		}
		rt.short = false
		g.Relist(context.Background()) // reinspected: nothing lost
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerStarted c1", "a ContainerStarted s1"}) {
			t.Fatalf("events after the fix %v", got)
		}
	})
}

// shortRuntime answers one container status too few when short.
type shortRuntime struct {
	*fakeRuntime
	short bool
}

func (r *shortRuntime) ItemStatuses(ctx context.Context, p *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	s, c, err := r.fakeRuntime.ItemStatuses(ctx, p, sbs, cts)
	if r.short && len(c) > 0 {
		c = c[1:]
	}
	return s, c, err
}

// Containers' identities are fetched only while wanted, once per running
// container, and reach the journal (not the kubelet-compatible channel).
func TestIdentitiesOnlyWhileWanted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running", "c2=exited"))
		g := newLoopGenerator(t, rt, nil)
		ch := g.Watch()
		g.Start()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if n := rt.count("Identities"); n != 0 {
			t.Fatalf("%d identity calls while nobody wants them", n)
		}
		f, err := journal.NewFilter(journal.FilterSpec{Identity: true})
		if err != nil {
			t.Fatal(err)
		}
		w, err := g.Journal().Watch("", f) // a watcher that asks for identities
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		p, _ := g.Journal().Pod("a")
		if id := p.Containers[0].Identity; id == nil || id.CgroupPath != "/pods/a/c1" || p.Containers[1].Identity != nil {
			t.Fatalf("identities %+v %+v", p.Containers[0].Identity, p.Containers[1].Identity)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if n := rt.count("Identities"); n != 1 {
			t.Fatalf("%d identity calls, want 1 (once per container)", n)
		}
		drain(ch)
		rt.setPods(pod("a", "c1=running", "c2=exited", "c3=running"))
		w.Close() // the last such watcher goes
		time.Sleep(time.Second)
		synctest.Wait()
		if n := rt.count("Identities"); n != 1 {
			t.Fatalf("an identity call after nobody wants them (%d)", n)
		}
		for _, e := range drain(ch) {
			if e.Type == "PodUpdated" {
				t.Fatal("an identity update on the kubelet-compatible channel")
			}
		}
	})
}

// Close ends a subscription whose Next is blocked on another goroutine:
// Next returns ErrClosed at once, on an idle node (no event to wake it).
func TestSubscriptionCloseWhileNextWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newLoopGenerator(t, newFakeRuntime(), nil)
		sub := g.Subscribe()
		ctx := context.Background()
		if u, err := sub.Next(ctx); err != nil || !u.Resync {
			t.Fatalf("first update: %+v %v", u, err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := sub.Next(ctx)
			errc <- err
		}()
		synctest.Wait() // Next waits for an event
		sub.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close: %v, want ErrClosed", err)
		}
	})
}

// Stop ends every subscription left open: one never read (it holds a
// journal watcher and a snapshot of every pod) and one whose Next waits on
// another goroutine. Both Next return ErrStopped (an ErrClosed), their
// journal watchers are closed and let go, and a subscription made after
// Stop is ended already.
func TestStopEndsSubscriptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"), pod("b", "c2=running"))
		g := newLoopGenerator(t, rt, nil)
		g.Start()
		synctest.Wait()
		idle := g.Subscribe() // never read, never closed
		reading := g.Subscribe()
		ctx := context.Background()
		if u, err := reading.Next(ctx); err != nil || !u.Resync || len(u.Pods) != 2 {
			t.Fatalf("first update: %+v %v", u, err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := reading.Next(ctx)
			errc <- err
		}()
		synctest.Wait() // Next waits for an event
		watchers := []*journal.Watcher{idle.w, reading.w}
		g.Stop()
		if err := <-errc; !errors.Is(err, ErrStopped) || !errors.Is(err, ErrClosed) {
			t.Fatalf("a waiting Next after Stop: %v, want ErrStopped", err)
		}
		for i, sub := range []*Subscription{idle, reading} {
			if _, err := sub.Next(ctx); !errors.Is(err, ErrStopped) {
				t.Errorf("subscription %d: Next after Stop: %v, want ErrStopped", i, err)
			}
			if sub.w != nil || sub.pending != nil {
				t.Errorf("subscription %d still holds its watcher or events", i)
			}
			// A closed watcher answers ErrClosed at once: the journal let
			// it go, with the snapshot it held.
			if m, err := watchers[i].Next(ctx); !errors.Is(err, journal.ErrClosed) {
				t.Errorf("subscription %d's journal watcher is open after Stop: %v %v", i, m.Type, err)
			}
		}
		idle.Close() // closing an ended subscription does nothing
		late := g.Subscribe()
		defer late.Close()
		if _, err := late.Next(ctx); !errors.Is(err, ErrStopped) || late.w != nil {
			t.Fatalf("a subscription made after Stop: %v, watcher %v; want ErrStopped and none", err, late.w)
		}
	})
}

// Stop does not wait for a Relist's runtime calls: it ends them. Here the
// listing hangs until its context ends (a runtime that never answers
// before the request timeout): Stop returns at once and the Relist
// reports the stop.
func TestStopDuringRelist(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &hangingListRuntime{fakeRuntime: newFakeRuntime()}
		g := newLoopGenerator(t, rt, nil)
		relisted := make(chan error, 1)
		go func() { relisted <- g.Relist(context.Background()) }()
		synctest.Wait() // the relist waits in ListPods
		start := time.Now()
		stopped := make(chan struct{})
		go func() {
			g.Stop()
			close(stopped)
		}()
		synctest.Wait()
		select {
		case <-stopped:
		default:
			t.Fatal("Stop waits for the Relist's runtime call")
		}
		if el := time.Since(start); el != 0 {
			t.Fatalf("Stop took %v of the bubble's time", el)
		}
		if err := <-relisted; !errors.Is(err, errStoppedInRelist) {
			t.Fatalf("Relist: %v, want errStoppedInRelist", err)
		}
	})
}

// hangingListRuntime's ListPods blocks until its context ends.
type hangingListRuntime struct{ *fakeRuntime }

func (h *hangingListRuntime) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A call that returns by its deadline, before the loop looks, is a
// result, not a timeout: the loop takes the results that came before the
// tick. Here a pod's status call returns exactly at its deadline, and the
// loop looks after it returned: on the old code the tick came first, and
// the call was abandoned as timed out with no runtime call named (an
// empty operation_type).
func TestCallReturningAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		hang := make(chan struct{})
		rt.hang["a"] = hang
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) { o.Metrics = m })
		ctx := context.Background()
		g.step(relistNow{}) // the listing
		synctest.Wait()
		for _, in := range g.next(ctx, nil) { // the listing's result: a's status call
			g.step(in)
		}
		synctest.Wait()
		if rt.count("Status") != 1 {
			t.Fatalf("calls %v, want a's status call out", rt.calls)
		}
		time.Sleep(g.opts.PodInspectionTimeout) // its deadline
		close(hang)                             // it returns
		synctest.Wait()
		for _, in := range g.next(ctx, nil) {
			g.step(in)
		}
		if _, err := g.Cache().Get("a"); err != nil {
			t.Fatalf("a's status: %v, want the call's result", err)
		}
		for _, op := range []string{"", opUnknown, "container_status"} {
			if n := testutil.ToFloat64(m.InspectionTimeouts.WithLabelValues(op)); n != 0 {
				t.Fatalf("%v timeouts with operation_type %q", n, op)
			}
		}
	})
}

// The hand-off to the loop and the core's queue of pods are two bounds,
// each with its own counter: hints the loop has not taken yet, over the
// hand-off's bound, are not counted as the queue of pods dropping them.
func TestInboxDropsCountedApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(nil)
		g := newLoopGenerator(t, newFakeRuntime(), func(o *Options) { o.Metrics, o.PodRelistQueue = m, 2 })
		// Not started: no loop takes the inbox.
		for i, want := range []bool{true, true, false} {
			if got := g.RequestRelist("a"); got != want {
				t.Fatalf("hint %d put %v, want %v", i, got, want)
			}
		}
		if n := testutil.ToFloat64(m.PodRelistQueueDropped); n != 0 {
			t.Errorf("pleg_pod_relist_requests_dropped_total %v: the queue of pods never saw the hints", n)
		}
		if n := testutil.ToFloat64(m.HintsInboxDropped); n != 1 {
			t.Errorf("pleg_hints_inbox_dropped_total %v, want 1", n)
		}
	})
}

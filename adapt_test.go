package pleg

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/metrics"
)

// TestAdaptiveCacheNeverFresherThanTaken: while the period is stretched, a
// reader of the cache is served as of the loop's last take once everything
// taken is processed, and never as of a later time.
func TestAdaptiveCacheNeverFresherThanTaken(t *testing.T) {
	h := newHarness(t)
	h.c.cfg.maxPeriod, h.c.cfg.manual = 8*time.Second, false
	h.step(streamChanged{status: journal.RuntimeStatus{State: journal.RuntimeEventStreamConnected}})
	h.now = h.now.Add(time.Minute) // a clean minute: trusted up to 15s
	h.setListing(h.listing([]string{"a c1=running"}), true)
	for range 6 {
		h.relist(nil, nil, false)
	}
	if d := h.c.relist.due.Sub(h.now); d != 8*time.Second {
		t.Fatalf("period after six quiet relists = %v, want 8s", d)
	}
	h.now = h.now.Add(300 * time.Millisecond)
	takenAt := h.now
	h.step(taken{at: takenAt, waiters: 1})
	h.now = h.now.Add(200 * time.Millisecond)
	h.tick(h.now)

	done, cancel := context.WithCancel(context.Background())
	cancel() // not fresh: GetNewerThan answers ctx.Err at once
	if _, err := h.cache.GetNewerThan(done, "a", takenAt.Add(-time.Millisecond)); err != nil {
		t.Errorf("a reader before the take waits: %v", err)
	}
	if _, err := h.cache.GetNewerThan(done, "a", takenAt); err == nil {
		t.Errorf("a reader as of the take is served, though nothing says the cache is fresher")
	}
	if got := h.cache.Timestamp(); !got.Equal(takenAt) {
		t.Errorf("cache timestamp = %v, want the take %v", got, takenAt)
	}
}

// TestAdaptiveOffKeepsPeriod: without MaxRelistPeriod (or in a generator
// driven by hand) the period never moves, stream or not.
func TestAdaptiveOffKeepsPeriod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    time.Duration
		manual bool
	}{{"off", 0, false}, {"max equals period", time.Second, false}, {"by hand", 8 * time.Second, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.c.cfg.maxPeriod, h.c.cfg.manual = tc.max, tc.manual
			h.step(streamChanged{status: journal.RuntimeStatus{State: journal.RuntimeEventStreamConnected}})
			h.setListing(h.listing([]string{"a c1=running"}), true)
			for range 8 {
				h.relist(nil, nil, false)
				if d := h.c.relist.due.Sub(h.now); d != time.Second {
					t.Fatalf("period = %v, want 1s", d)
				}
			}
			h.now = h.now.Add(500 * time.Millisecond)
			if s := h.step(taken{at: h.now, waiters: 1}); len(s.lines) > 0 {
				t.Errorf("off, a take moved the cache: %v", s.lines)
			}
		})
	}
}

// TestMaxRelistPeriodRange: New refuses a maximum below the period, above a
// minute, or not below half the health threshold.
func TestMaxRelistPeriodRange(t *testing.T) {
	rt := newFakeRuntime()
	for _, tc := range []struct {
		max, threshold time.Duration
		ok             bool
	}{
		{0, 0, true}, {10 * time.Second, 0, true}, {time.Second, 0, true},
		{500 * time.Millisecond, 0, false}, {2 * time.Minute, 0, false}, {30 * time.Second, time.Minute, false},
	} {
		_, err := New(Options{Runtime: rt, MaxRelistPeriod: tc.max, RelistThreshold: tc.threshold})
		if (err == nil) != tc.ok {
			t.Errorf("MaxRelistPeriod %v, threshold %v: err = %v, want ok %v", tc.max, tc.threshold, err, tc.ok)
		}
	}
}

// TestAdaptiveRelistLoop drives a started generator with its event
// stream: on a quiet node the global relists stretch to the maximum; a
// change no event announces (the runtime dropped it) is still delivered,
// within the maximum period, counted as unannounced, and brings the
// period back to the base; a change an event announces is delivered at
// once by a single-pod relist and counted as nothing.
func TestAdaptiveRelistLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period, maxPeriod = time.Second, 8 * time.Second
		rt := newFakeRuntime()
		src := &fakeEvents{live: make(chan cruntime.Event)}
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.EventSource, o.Metrics, o.RelistPeriod, o.MaxRelistPeriod = src, m, period, maxPeriod
		})
		rt.setPods(pod("a", "c1=running"), pod("b", "c2=running"))
		ch := g.Watch()
		g.Start()
		synctest.Wait()
		drain(ch)

		// Quiet: 3 base relists after the connect, then 2s, 4s, 8s, 8s...
		time.Sleep(60 * time.Second)
		synctest.Wait()
		before := rt.count("ListPods")
		time.Sleep(40 * time.Second)
		synctest.Wait()
		if n := rt.count("ListPods") - before; n < 4 || n > 6 {
			t.Fatalf("%d global relists in 40s of a quiet node, want about 5 (every 8s)", n)
		}

		// A change no event announces: delivered within the maximum period.
		rt.setPods(pod("a", "c1=exited"), pod("b", "c2=running"))
		changed := time.Now()
		var got []string
		for time.Since(changed) <= maxPeriod && len(got) == 0 {
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			got = formatEvents(drain(ch))
		}
		if !reflect.DeepEqual(got, []string{"a ContainerDied c1 exit=0"}) || time.Since(changed) > maxPeriod {
			t.Fatalf("unannounced change: %v after %v", got, time.Since(changed))
		}
		if n := testutil.ToFloat64(m.UnannouncedChanges.WithLabelValues("died")); n != 1 {
			t.Fatalf("unannounced died = %v, want 1", n)
		}
		// Back to the base period.
		before = rt.count("ListPods")
		time.Sleep(3*period + period/2)
		synctest.Wait()
		if n := rt.count("ListPods") - before; n != 3 {
			t.Fatalf("%d global relists in the 3.5s after an unannounced change, want 3 (the base period)", n)
		}

		// An announced change: a single-pod relist delivers it at once.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		drain(ch)
		rt.setPods(pod("a", "c1=exited"), pod("b", "c2=exited"))
		src.live <- cruntime.Event{ContainerID: "c2", Type: cruntime.EventStopped, PodUID: "b", CreatedAt: time.Now()}
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"b ContainerDied c2 exit=0"}) {
			t.Fatalf("announced change: %v", got)
		}
		time.Sleep(2 * maxPeriod)
		synctest.Wait()
		if n := testutil.CollectAndCount(m.UnannouncedChanges); n != 1 {
			t.Fatalf("%d unannounced kinds counted, want only the died one", n)
		}
		if n := testutil.ToFloat64(m.UnannouncedChanges.WithLabelValues("died")); n != 1 {
			t.Fatalf("unannounced died = %v after an announced change, want still 1", n)
		}
	})
}

// TestAdaptiveReaderServedBetweenRelists: with the period stretched, a
// reader of the cache that waits for news of a pod nothing happened to is
// served within a base period (the wait wakes the loop), not at the next
// global relist; and no reader waiting, the cache's timestamp stays where
// the last global relist put it.
func TestAdaptiveReaderServedBetweenRelists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period, maxPeriod = time.Second, 16 * time.Second
		rt := newFakeRuntime()
		src := &fakeEvents{live: make(chan cruntime.Event)}
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.EventSource, o.RelistPeriod, o.MaxRelistPeriod = src, period, maxPeriod
		})
		rt.setPods(pod("a", "c1=running"))
		g.Start()
		time.Sleep(2 * time.Minute) // stretched to 16s by now (trusted after 64s)
		synctest.Wait()
		if p := g.StretchedRelistPeriod(); p != maxPeriod {
			t.Fatalf("StretchedRelistPeriod = %v after two quiet minutes, want %v", p, maxPeriod)
		}
		lists := rt.count("ListPods")
		stamp := g.Cache().Timestamp()
		time.Sleep(maxPeriod / 2)
		synctest.Wait()
		if rt.count("ListPods") == lists {
			// Between global relists: nobody waits, the timestamp stays.
			if got := g.Cache().Timestamp(); !got.Equal(stamp) {
				t.Errorf("nobody waiting, the cache's timestamp moved from %v to %v", stamp, got)
			}
		}
		asked := time.Now()
		lists = rt.count("ListPods")
		var servedAt time.Time
		done := make(chan error, 1)
		go func() {
			_, err := g.Cache().GetNewerThan(t.Context(), "a", asked)
			servedAt = time.Now()
			done <- err
		}()
		time.Sleep(2 * period)
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("a reader of a pod nothing happened to still waits %v after it asked (period %v)", 2*period, period)
		}
		if d := servedAt.Sub(asked); d > period {
			t.Errorf("served %v after it asked, want within a base period (%v)", d, period)
		}
		if n := rt.count("ListPods") - lists; n != 0 {
			t.Errorf("%d global relists to serve it, want none (the timestamp moves with the events)", n)
		}
	})
}

// TestStretchedRelistPeriodOnlyWhenAdaptive: a long fixed period is not a
// stretch: the readiness check beside it keeps its own interval.
func TestStretchedRelistPeriodOnlyWhenAdaptive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		src := &fakeEvents{live: make(chan cruntime.Event)}
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.EventSource, o.RelistPeriod = src, 10*time.Second
		})
		rt.setPods(pod("a", "c1=running"))
		g.Start()
		time.Sleep(time.Minute)
		synctest.Wait()
		if p := g.RelistPeriodNow(); p != 10*time.Second {
			t.Errorf("RelistPeriodNow = %v, want the fixed 10s", p)
		}
		if p := g.StretchedRelistPeriod(); p != 0 {
			t.Errorf("StretchedRelistPeriod = %v with the adaptive relist off, want 0", p)
		}
	})
}

// stoppableStatus answers Status ready until stopped; then it hangs, as a
// SIGSTOPped runtime does, until the call's context ends.
type stoppableStatus struct{ stopped atomic.Bool }

func (s *stoppableStatus) Status(ctx context.Context) ([]cruntime.Condition, error) {
	if s.stopped.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: true}, {Type: cruntime.NetworkReady, Status: true}}, nil
}

// TestAdaptiveDoubtedRuntimeListedSoon: a runtime that stops answering
// sends no event and closes no stream. With the relist stretched to 30s,
// the readiness check's Status stalls within MaxStatusInterval, doubts
// the runtime (Stalled, which NewReadiness takes from the generator:
// DoubtRuntime), and the next global listing comes then, not 30s after
// the last: the listing is what the forecast watches.
func TestAdaptiveDoubtedRuntimeListedSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period, maxPeriod = time.Second, 30 * time.Second
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		src := &fakeEvents{live: make(chan cruntime.Event)}
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.EventSource, o.RelistPeriod, o.MaxRelistPeriod = src, period, maxPeriod
		})
		st := &stoppableStatus{}
		r := NewReadiness(g, ReadinessOptions{Runtime: st}) // Period and Stalled: the generator's
		g.Start()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx) }()
		defer func() { cancel(); <-done }()

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		if p := g.StretchedRelistPeriod(); p != maxPeriod {
			t.Fatalf("after 3m of a quiet node the period is %v, want %v", p, maxPeriod)
		}
		// The runtime stops right after a global listing: the next is 30s
		// away.
		listings := func() int { synctest.Wait(); return rt.count("ListPods") }
		for n := listings(); listings() == n; {
			time.Sleep(10 * time.Millisecond)
		}
		st.stopped.Store(true)
		stopped := time.Now()
		for n := listings(); listings() == n; {
			time.Sleep(10 * time.Millisecond)
		}
		// The next check due (at most MaxStatusInterval, on the readiness
		// ticker's phase: half a tick more), its stall, a base period.
		late := MaxStatusInterval + 5*time.Second/2 + DefaultStallAfter + period
		if d := time.Since(stopped); d < DefaultStallAfter || d > late {
			t.Fatalf("the runtime stopped %v before the next listing, want within [%v, %v]", d, DefaultStallAfter, late)
		}
	})
}

package pleg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
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
	after  time.Duration // how long the session stays open before end
	end    error         // returned after the events; nil keeps the stream open
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
		time.Sleep(s.after)
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
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		src := &fakeEvents{live: make(chan cruntime.Event)}
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) {
			o.EventSource, o.Metrics, o.RelistPeriod, o.RelistThreshold = src, m, time.Hour, 3*time.Hour
		})
		rt.setPods(pod("a", "c1=running"))
		ch := g.Watch()
		g.Start()
		synctest.Wait()
		drain(ch)
		if s := g.EventStream().State; s != StreamConnected {
			t.Fatalf("stream %s", s)
		}
		time.Sleep(time.Second)
		rt.setPods(pod("a", "c1=exited"))
		created := time.Now()
		time.Sleep(2 * time.Millisecond)
		src.live <- cruntime.Event{ContainerID: "c1", Type: cruntime.EventStopped, PodUID: "a", CreatedAt: created}
		synctest.Wait()
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"a ContainerDied c1 exit=0"}) {
			t.Fatalf("events %v", got)
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
	})
}

// A runtime without events is said once, the relist goes on, and the
// stream is probed again only rarely: Unimplemented, or a stream the
// runtime closes cleanly right after it opened (CRI-O without pod events).
// A transient error at start, however quick, is retried with backoff.
func TestRuntimeWithoutEvents(t *testing.T) {
	unsupported := errors.Join(cruntime.ErrEventsUnsupported, errors.New("unimplemented"))
	eof := fmt.Errorf("stream closed by the runtime: %w", io.EOF)
	for _, c := range []struct {
		name     string
		sessions []fakeSession
		want     string
	}{
		{"unimplemented", []fakeSession{{err: unsupported}, {err: unsupported}}, StreamUnsupported},
		{"closed at once", []fakeSession{{end: eof}, {end: eof}}, StreamUnsupported},
		{"unavailable at once", []fakeSession{{end: errors.New("rpc error: code = Unavailable")}, {end: eof}}, StreamBackoff},
		{"closed after a while", []fakeSession{{end: eof, after: 2 * streamClosesAtOnce}, {}}, StreamBackoff},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := &fakeEvents{sessions: c.sessions, live: make(chan cruntime.Event)}
				g := newLoopGenerator(t, newFakeRuntime(), func(o *Options) { o.EventSource = src })
				g.Start()
				time.Sleep(c.sessions[0].after)
				synctest.Wait()
				if s := g.EventStream().State; s != c.want && !(c.want == StreamBackoff && src.count() == 2) {
					t.Fatalf("state %s after %d attempts, want %s", s, src.count(), c.want)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				if c.want == StreamUnsupported && src.count() != 1 {
					t.Fatalf("probed %d times within a minute", src.count())
				}
				if c.want == StreamBackoff && src.count() != 2 {
					t.Fatalf("retried %d times, want 2 attempts", src.count())
				}
				if c.want == StreamUnsupported {
					time.Sleep(streamUnsupportedWait)
					synctest.Wait()
					if src.count() != 2 {
						t.Fatalf("probed %d times after %v", src.count(), streamUnsupportedWait)
					}
				}
			})
		})
	}
}

// A broken stream reconnects: the first retry at once, then with backoff.
func TestEventStreamReconnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(nil)
		boom := errors.New("connection reset")
		src := &fakeEvents{live: make(chan cruntime.Event), sessions: []fakeSession{
			{events: []cruntime.Event{{PodUID: "a", ContainerID: "x"}}, end: boom}, // up, then breaks
			{err: boom}, // the immediate retry fails
			{},          // after the backoff: stays up
		}}
		g := newLoopGenerator(t, newFakeRuntime(), func(o *Options) { o.EventSource, o.Metrics = src, m })
		g.Start()
		synctest.Wait()
		if src.count() != 2 || g.EventStream().State != StreamBackoff {
			t.Fatalf("%d attempts, state %s", src.count(), g.EventStream().State)
		}
		if got := testutil.ToFloat64(m.EventedConnectionErrors); got != 2 {
			t.Fatalf("connection errors %v", got)
		}
		time.Sleep(2 * streamBackoffBase)
		synctest.Wait()
		if g.EventStream().State != StreamConnected || src.count() != 3 {
			t.Fatalf("%d attempts, state %s", src.count(), g.EventStream().State)
		}
	})
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

// With events dropped, the periodic relist still delivers every change
// with the same events.
func TestEventsDroppedRelistStillDelivers(t *testing.T) {
	steps := [][]*cruntime.Pod{
		{pod("a", "c1=running", "s:s1=running")},
		{pod("a", "c1=exited", "s:s1=running"), pod("b", "c2=running")},
		{pod("b", "c2=exited")},
	}
	run := func(withEvents bool) []string {
		var out []string
		synctest.Test(t, func(t *testing.T) {
			rt := newFakeRuntime()
			src := &fakeEvents{live: make(chan cruntime.Event, 10)}
			g := newLoopGenerator(t, rt, func(o *Options) { o.EventSource = src })
			ch := g.Watch()
			g.Start()
			for _, pods := range steps {
				rt.setPods(pods...)
				if withEvents {
					// Only the first pod's event arrives; the others
					// were dropped.
					src.live <- cruntime.Event{PodUID: pods[0].UID, CreatedAt: time.Now()}
				}
				time.Sleep(time.Second)
				synctest.Wait()
				out = append(out, formatEvents(drain(ch))...)
			}
		})
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

// A Next waits for another Next only as long as its own context lets it:
// it does not wait on a lock the other holds across its wait for an
// event.
func TestSubscriptionNextWaitsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newLoopGenerator(t, newFakeRuntime(), nil)
		sub := g.Subscribe()
		defer sub.Close()
		if u, err := sub.Next(context.Background()); err != nil || !u.Resync {
			t.Fatalf("first update %+v, %v; want the resync", u, err)
		}
		waiting, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _, _ = sub.Next(waiting) }() // waits for an event
		synctest.Wait()
		ctx, stop := context.WithTimeout(context.Background(), time.Second)
		defer stop()
		start := time.Now()
		if _, err := sub.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second Next: %v, want its context's deadline", err)
		}
		if el := time.Since(start); el != time.Second {
			t.Fatalf("second Next returned after %v, want its 1s deadline", el)
		}
	})
}

// A pod's state lists its sandboxes and containers newest first (by
// creation), as docs/stream.md says, whatever order the runtime lists
// them in.
func TestJournalPodNewestFirst(t *testing.T) {
	listing := pod("a", "s:s1=exited", "s:s2=running", "c1=exited", "c2=running", "c3=exited")
	for i, c := range listing.Sandboxes {
		c.CreatedAt = int64(10 + i) // s2 newest
	}
	for i, c := range []int64{100, 300, 200} {
		listing.Containers[i].CreatedAt = c // c2, c3, c1
	}
	p := journalPod("a", nil, listing, nil, nil, time.Unix(1000, 0))
	var sbs, cts []string
	for _, s := range p.Sandboxes {
		sbs = append(sbs, s.ID)
	}
	for _, c := range p.Containers {
		cts = append(cts, c.ID)
	}
	if !reflect.DeepEqual(sbs, []string{"s2", "s1"}) || !reflect.DeepEqual(cts, []string{"c2", "c3", "c1"}) {
		t.Fatalf("sandboxes %v, containers %v; want newest first: [s2 s1], [c2 c3 c1]", sbs, cts)
	}
	if listing.Containers[0].ID != "c1" {
		t.Fatal("the listing was reordered in place")
	}
}

// A pod's state holds the statuses pleg inspected, not copies of them:
// the journal and the status cache keep one status per container. A
// container without a status reads as empty, and an exited one's exit
// code is its status's.
func TestJournalPodSharesStatuses(t *testing.T) {
	listing := pod("a", "s:s1=running", "c1=exited", "c2=running", "c3=running")
	st := &cruntime.PodStatus{UID: "a", ContainerStatuses: []*cruntime.ContainerStatus{
		{ID: "c1", State: cruntime.StateExited, ExitCode: 3, Reason: "Error", Labels: cruntime.LabelsOf("io.kubernetes.container.name", "c1")},
		{ID: "c2", State: cruntime.StateRunning, StartedAt: time.Unix(50, 0)},
	}}
	p := journalPod("a", nil, listing, st, nil, time.Unix(1000, 0))
	byID := map[string]*journal.Container{}
	for _, c := range p.Containers {
		byID[c.ID] = c
	}
	if !byID["c1"].Shares(st.ContainerStatuses[0]) || !byID["c2"].Shares(st.ContainerStatuses[1]) {
		t.Error("the pod's state copied the statuses it was given")
	}
	if c := byID["c1"]; c.Reason() != "Error" || c.Labels().Get("io.kubernetes.container.name") != "c1" {
		t.Errorf("c1 reads %+v", c)
	}
	if code, ok := byID["c1"].ExitCode(); !ok || code != 3 {
		t.Errorf("c1 reads exit code %d (%v), want 3", code, ok)
	}
	if c := byID["c2"]; !c.StartedAt().Equal(time.Unix(50, 0)) {
		t.Errorf("c2 reads started %v", c.StartedAt())
	}
	if code, ok := byID["c2"].ExitCode(); ok {
		t.Errorf("c2, running, reads exit code %d", code)
	}
	// A container without a status reads as empty, in the journal too.
	j := journal.New(journal.Options{Epoch: "e"})
	j.Append(journal.Entry{Kind: journal.KindPod, Pod: p, Source: journal.SourceRelist})
	got, _ := j.Pod("a")
	for _, c := range got.Containers {
		if _, exited := c.ExitCode(); c.ID == "c3" && (!c.Shares(nil) || exited || c.Reason() != "" || !c.StartedAt().IsZero() || c.Labels().Len() != 0) {
			t.Errorf("c3 in the journal reads %+v", c)
		}
	}
}

// Each runtime event is counted by type (pleg_runtime_events_total, its
// counter resolved once per known type; any other value, a type CRI may
// add later or a negative one, counts as UNKNOWN_EVENT) and in the stream's status; its V(4) line and its hint's
// V(6) line are written when the logger is that verbose, and only then.
func TestRuntimeEventsCountedAndLogged(t *testing.T) {
	for _, verbosity := range []int{0, 6} {
		t.Run(fmt.Sprintf("v%d", verbosity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var lines []string
				log := funcr.New(func(_, args string) {
					mu.Lock()
					lines = append(lines, args)
					mu.Unlock()
				}, funcr.Options{Verbosity: verbosity})
				rt := newFakeRuntime()
				rt.setPods(pod("a", "c1=running"))
				src := &fakeEvents{live: make(chan cruntime.Event)}
				m := metrics.New(nil)
				g := newLoopGenerator(t, rt, func(o *Options) {
					o.EventSource, o.Metrics, o.Logger, o.RelistPeriod, o.RelistThreshold = src, m, log, time.Hour, 3*time.Hour
				})
				g.Start()
				synctest.Wait()
				time.Sleep(time.Second) // the events come after the first listing: not covered by it
				started := cruntime.Event{ContainerID: "c1", Type: cruntime.EventStarted, PodUID: "a", PodName: "pa", PodNamespace: "ns"}
				for _, e := range []cruntime.Event{
					started, started,
					{ContainerID: "c9", Type: cruntime.EventStopped}, // no pod: left to the relist
					{ContainerID: "c1", Type: cruntime.EventType(9), PodUID: "a", PodName: "pa", PodNamespace: "ns"},
					{ContainerID: "c1", Type: cruntime.EventType(-1), PodUID: "a", PodName: "pa", PodNamespace: "ns"},
				} {
					src.live <- e
					synctest.Wait()
				}
				for typ, want := range map[string]float64{
					cruntime.EventStarted.String(): 2,
					cruntime.EventStopped.String(): 1,
					cruntime.EventType(9).String(): 2, // and -1
					cruntime.EventCreated.String(): 0,
				} {
					if got := testutil.ToFloat64(m.RuntimeEvents.WithLabelValues(typ)); got != want {
						t.Errorf("pleg_runtime_events_total{type=%q} = %v, want %v", typ, got, want)
					}
				}
				if got := testutil.ToFloat64(m.PodRelistSkipped.WithLabelValues(SkipUnchanged)); got != 2 {
					t.Errorf("hints skipped as unchanged: %v, want 2", got)
				}
				if s := g.EventStream(); s.Events != 5 || s.LastEvent.IsZero() {
					t.Errorf("stream status %+v, want 5 events and the last one's time", s)
				}
				mu.Lock()
				defer mu.Unlock()
				count := func(parts ...string) int {
					n := 0
				line:
					for _, l := range lines {
						for _, p := range parts {
							if !strings.Contains(l, p) {
								continue line
							}
						}
						n++
					}
					return n
				}
				want := map[bool][3]int{false: {0, 0, 0}, true: {4, 1, 2}}[verbosity >= 6]
				got := [3]int{
					count(`"msg"="Runtime event"`, `"pod"="ns/pa"`, `"containerID"="c1"`),
					count(`"msg"="Runtime event without a pod; leaving it to the relist"`, `"containerID"="c9"`),
					count(`"msg"="Hint made no runtime call"`, `"reason"="`+SkipUnchanged+`"`),
				}
				if got != want {
					t.Errorf("log lines (runtime event, without a pod, hint skipped) %v, want %v; lines:\n%s", got, want, strings.Join(lines, "\n"))
				}
			})
		})
	}
}

// The event stream's goroutine writes nothing to the journal: it hands
// its connections and losses to the loop, which appends them stamped with
// its own clock. The loop is the journal's one writer, so entry times
// follow sequence numbers.
func TestStreamStatusAppendedByTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeEvents{live: make(chan cruntime.Event), sessions: []fakeSession{
			{end: errors.New("connection reset")}, // up, then lost
			{},                                    // the immediate retry: stays up
		}}
		rt := newFakeRuntime()
		rt.setPods(pod("a", "c1=running"))
		g := newLoopGenerator(t, rt, nil) // driven by hand: Relist steps the loop
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.watchEvents(ctx, src)
		}()
		defer func() { cancel(); <-done }()
		synctest.Wait()
		if src.count() != 2 {
			t.Fatalf("%d connection attempts, want 2", src.count())
		}
		if h := g.Journal().Head(); h.Seq != 0 {
			t.Fatalf("the stream's goroutine appended %d entries to the journal; the loop is its one writer", h.Seq)
		}
		time.Sleep(time.Second)
		stepped := time.Now()
		if err := g.Relist(context.Background()); err != nil {
			t.Fatal(err)
		}
		w, err := g.Journal().Watch(journal.Cursor{Epoch: g.Journal().Epoch()}.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		var got []string
		var last time.Time
		for range g.Journal().Head().Seq {
			m, err := w.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if m.Time.Before(last) {
				t.Errorf("entry %d at %v, before the entry ahead of it at %v", m.Cursor.Seq, m.Time, last)
			}
			last = m.Time
			if m.Type != journal.Runtime || m.Runtime.State == journal.RuntimeReachable {
				continue
			}
			got = append(got, fmt.Sprintf("%d %s", m.Runtime.State, m.Runtime.Message))
			if !m.Time.Equal(stepped) {
				t.Errorf("stream status %v stamped %v, want the loop's step at %v", m.Runtime, m.Time, stepped)
			}
		}
		want := []string{
			fmt.Sprintf("%d ", journal.RuntimeEventStreamConnected),
			fmt.Sprintf("%d connection reset", journal.RuntimeEventStreamLost),
			fmt.Sprintf("%d ", journal.RuntimeEventStreamConnected),
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("stream statuses %q, want %q", got, want)
		}
	})
}

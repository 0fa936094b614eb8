package pleg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/stats"
	"github.com/podlifecycle/pleg/metrics"
)

// node is a generator against a simulated CRI runtime over real gRPC.
type node struct {
	sim *sim.Runtime
	rt  *cri.Client
	gen *pleg.Generator
	sub *pleg.Subscription
	// state is what the subscriber knows: container or sandbox ID to
	// "running" or "exited", built only from what it was delivered.
	state map[string]string
}

func startNode(t *testing.T, cfg sim.Config, opts pleg.Options) *node {
	t.Helper()
	s := sim.New(cfg)
	if err := s.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	rt, err := cri.Dial(s.Endpoint(), cri.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	opts.Runtime = rt
	g, err := pleg.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{sim: s, rt: rt, gen: g, sub: g.Subscribe(), state: map[string]string{}}
	g.Start()
	t.Cleanup(g.Stop)
	return n
}

// drain applies every update delivered so far.
func (n *node) drain(t *testing.T) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		u, err := n.sub.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if u.Resync {
			clear(n.state)
			for _, p := range u.Pods {
				for _, c := range p.Containers {
					if c.State != "unknown" {
						n.state[c.ID] = c.State
					}
				}
			}
			continue
		}
		switch e := u.Event; e.Type {
		case pleg.ContainerStarted:
			n.state[e.ContainerID] = "running"
		case pleg.ContainerDied:
			n.state[e.ContainerID] = "exited"
		case pleg.ContainerRemoved:
			delete(n.state, e.ContainerID)
		}
	}
}

// settle waits for a global relist that starts after now, then drains.
func (n *node) settle(t *testing.T) {
	t.Helper()
	after := time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs := n.gen.RecentRelists()
		if len(rs) > 0 && rs[len(rs)-1].Start.After(after) && rs[len(rs)-1].Err == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no successful relist after the changes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.drain(t)
}

// truth is the runtime's state of every running or exited item (created
// and unknown items have no delivered event, by the kubelet's rules).
func (n *node) truth() map[string]string {
	out := map[string]string{}
	for _, p := range n.sim.Pods() {
		for _, s := range p.Sandboxes {
			switch s.State {
			case runtimeapi.PodSandboxState_SANDBOX_READY:
				out[s.ID] = "running"
			case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
				out[s.ID] = "exited"
			}
		}
		for _, c := range p.Containers {
			switch c.State {
			case runtimeapi.ContainerState_CONTAINER_RUNNING:
				out[c.ID] = "running"
			case runtimeapi.ContainerState_CONTAINER_EXITED:
				out[c.ID] = "exited"
			}
		}
	}
	return out
}

// check compares what the subscriber was told with the runtime's truth.
func (n *node) check(t *testing.T) {
	t.Helper()
	truth := n.truth()
	var diffs []string
	for id, want := range truth {
		if got := n.state[id]; got != want {
			diffs = append(diffs, fmt.Sprintf("%.12s: told %q, runtime %q", id, got, want))
		}
	}
	for id, got := range n.state {
		if _, ok := truth[id]; !ok {
			// Items now created or unknown in the runtime keep their last
			// delivered state; anything else must be gone.
			if _, exists := n.sim.Container(id); !exists && !n.isSandbox(id) {
				diffs = append(diffs, fmt.Sprintf("%.12s: told %q, gone from the runtime", id, got))
			}
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%d differences between the events and the runtime:\n%v", len(diffs), diffs)
	}
	if len(truth) == 0 {
		t.Fatal("the runtime is empty: the check proves nothing")
	}
}

func (n *node) isSandbox(id string) bool {
	for _, p := range n.sim.Pods() {
		for _, s := range p.Sandboxes {
			if s.ID == id {
				return true
			}
		}
	}
	return false
}

var churn = sim.Config{Seed: 42, Pods: 20, ContainersPerPod: 3, ChurnPerStep: 6}

// With or without runtime events, with every event dropped, a churning
// node's subscribers end up told exactly the runtime's state: nothing
// lost, nothing invented.
func TestSimulatedNodeConverges(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    pleg.EventsMode
		dropRate  float64
		disableEv bool
	}{
		{"events on", pleg.EventsOn, 0, false},
		{"events off", pleg.EventsOff, 0, false},
		{"events dropped", pleg.EventsAuto, 1, false},
		{"runtime without events", pleg.EventsAuto, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := churn
			cfg.EventDropRate = tc.dropRate
			cfg.DisableEvents = tc.disableEv
			n := startNode(t, cfg, pleg.Options{RelistPeriod: 50 * time.Millisecond, Events: tc.events})
			for range 15 {
				n.sim.Step()
				time.Sleep(10 * time.Millisecond)
			}
			n.settle(t)
			n.check(t)
			if tc.disableEv {
				if s := n.gen.EventStream(); s.State != pleg.StreamUnsupported {
					t.Fatalf("stream state %q, want unsupported", s.State)
				}
			}
		})
	}
}

// Runtime events alone deliver changes: with a relist period of an hour,
// every change after the first relist arrives through the event stream
// (with no hint budget, which would bring global relists forward).
func TestEventsDeliverBetweenRelists(t *testing.T) {
	n := startNode(t, churn, pleg.Options{RelistPeriod: time.Hour, RelistThreshold: 3 * time.Hour, Events: pleg.EventsOn,
		PodRelistRate: -1, EarlyRelistGap: -1}) // no budget: events alone
	waitUntil(t, func() bool {
		return n.gen.EventStream().State == pleg.StreamConnected && len(n.gen.RecentRelists()) == 1
	})
	n.drain(t)
	for range 10 {
		n.sim.Step()
	}
	waitUntil(t, func() bool {
		n.drain(t)
		return equal(n.state, n.truth())
	})
	if len(n.gen.RecentRelists()) != 1 {
		t.Fatal("a global relist ran: the test proves nothing about events")
	}
}

// The event stream survives the stream breaking and the runtime
// restarting, and the node still converges.
func TestEventStreamSurvivesRestarts(t *testing.T) {
	n := startNode(t, churn, pleg.Options{RelistPeriod: 100 * time.Millisecond, Events: pleg.EventsOn})
	waitUntil(t, func() bool { return n.gen.EventStream().State == pleg.StreamConnected })
	// "Connected" is the client's view: the runtime may register the
	// subscriber a moment later and miss the changes made before. Keep
	// changing things until an event comes through.
	last := time.Now()
	n.sim.Step()
	waitUntil(t, func() bool {
		if time.Since(last) > 200*time.Millisecond {
			last = time.Now()
			n.sim.Step()
		}
		return n.gen.EventStream().Events > 0
	}, "no event through the stream")

	n.sim.SetEvents(false) // the stream breaks
	n.sim.Step()
	waitUntil(t, func() bool { return n.gen.EventStream().State != pleg.StreamConnected }, "the stream did not break")
	n.sim.SetEvents(true)
	waitUntil(t, func() bool { s := n.gen.EventStream(); return s.State == pleg.StreamConnected && s.Connects >= 2 }, "reconnect after the stream broke: ", n.gen.EventStream())

	n.sim.GoAway() // the runtime restarts
	n.sim.Step()
	if err := n.sim.ComeBack(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { s := n.gen.EventStream(); return s.State == pleg.StreamConnected && s.Connects >= 3 }, "reconnect after the restart: ", n.gen.EventStream())
	n.sim.Step()
	n.settle(t)
	n.check(t)
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func waitUntil(t *testing.T, cond func() bool, what ...any) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached", fmt.Sprint(what...))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkEventLatency measures the time from a container state change in
// the (simulated) runtime to the lifecycle event's delivery, with the
// runtime's event stream used as hints and without it (the relist alone,
// at the kubelet's 1 s period), and reports p50 and p99 of each:
//
//	go test -run XXX -bench EventLatency -benchtime 40x .
func BenchmarkEventLatency(b *testing.B) {
	for _, mode := range []pleg.EventsMode{pleg.EventsOn, pleg.EventsOff} {
		b.Run("events="+string(mode), func(b *testing.B) {
			n := startBenchNode(b, mode)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 1))
			var lat []time.Duration
			for i := 0; b.Loop(); i++ {
				p, err := n.sim.AddPod(sim.PodSpec{Name: fmt.Sprintf("bench-%d", i), Containers: []string{"app"}})
				if err != nil {
					b.Fatal(err)
				}
				c, _ := p.Container("app")
				waitEvent(b, ctx, n.sub, c.ID, pleg.ContainerStarted)
				// Change at a random point of the relist period, as real
				// changes come, not right after the relist that saw the start.
				time.Sleep(time.Duration(rng.Int64N(int64(pleg.DefaultRelistPeriod))))
				start := time.Now()
				if err := n.sim.ExitContainer(c.ID, 1); err != nil {
					b.Fatal(err)
				}
				waitEvent(b, ctx, n.sub, c.ID, pleg.ContainerDied)
				lat = append(lat, time.Since(start))
				_ = n.sim.RemovePod(p.UID)
			}
			q := func(p float64) float64 { return float64(stats.Percentile(lat, p).Microseconds()) / 1000 }
			b.ReportMetric(q(.5), "p50-ms")
			b.ReportMetric(q(.99), "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func startBenchNode(b *testing.B, mode pleg.EventsMode) *node {
	s := sim.New(sim.Config{Seed: 1, Pods: 30, ContainersPerPod: 3})
	if err := s.Serve(filepath.Join(b.TempDir(), "cri.sock")); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	rt, err := cri.Dial(s.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Close() })
	g, err := pleg.New(pleg.Options{Runtime: rt, Events: mode}) // the kubelet's 1 s period
	if err != nil {
		b.Fatal(err)
	}
	n := &node{sim: s, rt: rt, gen: g, sub: g.Subscribe()}
	g.Start()
	b.Cleanup(g.Stop)
	return n
}

func waitEvent(b *testing.B, ctx context.Context, sub *pleg.Subscription, id string, typ pleg.EventType) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			b.Fatalf("waiting for %s of %.12s: %v", typ, id, err)
		}
		if !u.Resync && u.Event.ContainerID == id && u.Event.Type == typ {
			return
		}
	}
}

// TestAdaptiveRelistWithLostAndReorderedEvents: with the adaptive relist
// on, a runtime that drops 70 % of its events and sends 30 % of the rest out of
// order still has every change delivered: the global relist, stretched to
// its maximum on a quiet node, finds what no event announced, counts it and
// falls back to the base period, and the node converges.
func TestAdaptiveRelistWithLostAndReorderedEvents(t *testing.T) {
	const period, maxPeriod = 50 * time.Millisecond, 400 * time.Millisecond
	cfg := churn
	cfg.EventDropRate, cfg.EventReorderRate = 0.7, 0.3
	m := metrics.New(nil)
	n := startNode(t, cfg, pleg.Options{RelistPeriod: period, MaxRelistPeriod: maxPeriod, Events: pleg.EventsOn, Metrics: m})
	stretched := func() bool {
		rs := n.gen.RecentRelists()
		return len(rs) > 0 && rs[len(rs)-1].NextPeriod == maxPeriod
	}
	waitUntil(t, stretched, "the period never stretched to ", maxPeriod)
	before := len(n.gen.RecentRelists())
	for range 15 {
		n.sim.Step()
		time.Sleep(10 * time.Millisecond)
	}
	n.settle(t)
	n.check(t)
	if st := n.sim.EventStats(); st.DroppedRandom == 0 || st.Reordered == 0 {
		t.Fatalf("the runtime dropped %d events and reordered %d: the test proves nothing", st.DroppedRandom, st.Reordered)
	}
	var unannounced float64
	for _, k := range []string{pleg.UnannouncedStarted, pleg.UnannouncedDied, pleg.UnannouncedRemoved, pleg.UnannouncedCreated, pleg.UnannouncedOther} {
		unannounced += testutil.ToFloat64(m.UnannouncedChanges.WithLabelValues(k))
	}
	if unannounced == 0 {
		t.Errorf("no unannounced change counted, with %d events dropped", n.sim.EventStats().DroppedRandom)
	}
	rs := n.gen.RecentRelists()
	fellBack := false
	for _, r := range rs[min(before, len(rs)):] {
		if r.NextPeriod > maxPeriod {
			t.Errorf("a relist set the next %v after it, over the maximum %v", r.NextPeriod, maxPeriod)
		}
		fellBack = fellBack || r.NextPeriod == period
	}
	if !fellBack {
		t.Errorf("the period never fell back to %v after the changes", period)
	}
}

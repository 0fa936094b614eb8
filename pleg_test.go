package pleg

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testclock "k8s.io/utils/clock/testing"
)

func newTestGenerator(t *testing.T, rt cruntime.Runtime, mod func(*Options)) (*Generator, *testclock.FakeClock) {
	t.Helper()
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	g := newLoopGenerator(t, rt, func(o *Options) {
		o.Clock = clk
		if mod != nil {
			mod(o)
		}
	})
	return g, clk
}

// Case 6: health with a fake clock.
func TestHealthy(t *testing.T) {
	rt := newFakeRuntime()
	g, clk := newTestGenerator(t, rt, nil)
	ok, err := g.Healthy()
	if ok || err == nil || err.Error() != "pleg has yet to be successful" {
		t.Fatalf("before any relist: %v %v", ok, err)
	}
	clk.Step(10 * time.Minute)
	if ok, _ := g.Healthy(); ok {
		t.Fatal("healthy 10 minutes later without a relist")
	}
	g.Relist(context.Background())
	clk.Step(time.Minute)
	if ok, err := g.Healthy(); !ok {
		t.Fatalf("1 min after a relist: %v", err)
	}
	clk.Step(2 * time.Minute) // exactly at the threshold: still healthy (strict)
	if ok, err := g.Healthy(); !ok {
		t.Fatalf("at exactly the threshold: %v", err)
	}
	clk.Step(time.Minute)
	ok, err = g.Healthy()
	if ok {
		t.Fatal("healthy 4 minutes after the last relist")
	}
	if want := "pleg was last seen active 4m0s ago; threshold is 3m0s"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	// A failed listing does not advance the health timestamp.
	rt.listErr = errors.New("runtime down")
	g.Relist(context.Background())
	if ok, _ := g.Healthy(); ok {
		t.Fatal("a failed relist made the generator healthy")
	}
}

// Case 8: a dead pod keeps its last IPs (the runtime reports them on the
// pod's sandbox).
func TestPodIPCarryOver(t *testing.T) {
	for _, ips := range [][]string{{"192.168.1.5"}, {"192.168.1.5/24", "2000::"}} {
		rt := newFakeRuntime()
		g, clk := newTestGenerator(t, rt, nil)
		ch := g.Watch()
		rt.setPods(pod("p", "c0=running", "s:s0=running"))
		rt.ips["p"] = ips
		g.Relist(context.Background())
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"p ContainerStarted c0", "p ContainerStarted s0"}) {
			t.Fatalf("relist 1: %v", got)
		}
		if s, _ := g.Cache().Get("p"); !reflect.DeepEqual(s.IPs, ips) {
			t.Fatalf("cache IPs %v, want %v", s.IPs, ips)
		}
		clk.Step(time.Second)
		rt.setPods(pod("p", "c0=exited", "s:s0=exited"))
		rt.statuses["p"] = &cruntime.PodStatus{UID: "p",
			SandboxStatuses:   []*cruntime.SandboxStatus{{ID: "s0", State: cruntime.StateExited}},
			ContainerStatuses: []*cruntime.ContainerStatus{{ID: "c0", State: cruntime.StateExited, ExitCode: 1}}}
		g.Relist(context.Background())
		if got := formatEvents(drain(ch)); !reflect.DeepEqual(got, []string{"p ContainerDied c0 exit=1", "p ContainerDied s0"}) {
			t.Fatalf("relist 2: %v", got)
		}
		if s, _ := g.Cache().Get("p"); !reflect.DeepEqual(s.IPs, ips) {
			t.Fatalf("dead pod's IPs %v, want %v", s.IPs, ips)
		}
		// A ready sandbox without IPs keeps none.
		rt.setPods(pod("p", "c0=exited", "s:s0=running"))
		rt.statuses["p"] = &cruntime.PodStatus{UID: "p", SandboxStatuses: []*cruntime.SandboxStatus{{ID: "s0", State: cruntime.StateRunning}}}
		g.Relist(context.Background())
		if s, _ := g.Cache().Get("p"); len(s.IPs) != 0 {
			t.Fatalf("pod with a ready sandbox kept IPs %v", s.IPs)
		}
	}
}

// Case 9: the running gauges.
func TestGauges(t *testing.T) {
	rt := newFakeRuntime()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	g, _ := newTestGenerator(t, rt, func(o *Options) { o.Metrics = m })
	rt.setPods(
		pod("1234", "c1=running", "c2=unknown", "c3=created", "s:s1=running", "s:s2=running", "s:s3=unknown"),
		pod("4567", "c4=exited", "s:s4=running", "s:s5=exited"),
	)
	g.Relist(context.Background())
	expected := `
# HELP kubelet_running_containers Number of containers currently running
# TYPE kubelet_running_containers gauge
kubelet_running_containers{container_state="created"} 1
kubelet_running_containers{container_state="exited"} 1
kubelet_running_containers{container_state="running"} 1
kubelet_running_containers{container_state="unknown"} 1
# HELP kubelet_running_pods Number of pods that have a running pod sandbox
# TYPE kubelet_running_pods gauge
kubelet_running_pods 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), "kubelet_running_containers", "kubelet_running_pods"); err != nil {
		t.Fatal(err)
	}
}

// Case 9 exactly as the kubelet states it: two unknown containers.
func TestGaugesKubeletCase(t *testing.T) {
	rt := newFakeRuntime()
	m := metrics.New(nil)
	g, _ := newTestGenerator(t, rt, func(o *Options) { o.Metrics = m })
	rt.setPods(
		pod("1234", "c1=running", "c2=unknown", "c3=unknown", "s:s1=running", "s:s2=running", "s:s3=unknown"),
		pod("4567", "c4=exited", "s:s4=running", "s:s5=exited"),
	)
	g.Relist(context.Background())
	for state, want := range map[string]float64{"exited": 1, "running": 1, "unknown": 2} {
		if got := testutil.ToFloat64(m.RunningContainers.WithLabelValues(state)); got != want {
			t.Errorf("running_containers{%s} = %v, want %v", state, got, want)
		}
	}
	if got := testutil.ToFloat64(m.RunningPods); got != 2 {
		t.Errorf("running_pods = %v, want 2", got)
	}
}

// Case 10: a full channel discards, counts and loses.
func TestChannelDiscards(t *testing.T) {
	rt := newFakeRuntime()
	m := metrics.New(nil)
	g, _ := newTestGenerator(t, rt, func(o *Options) { o.Metrics = m; o.ChannelCapacity = 4 })
	ch := g.Watch()
	rt.setPods(pod("a", "c1=running", "c2=running", "c3=running"), pod("b", "c4=running", "c5=running"))
	g.Relist(context.Background())
	if got := len(drain(ch)); got != 4 {
		t.Fatalf("delivered %d events, want 4", got)
	}
	if got := testutil.ToFloat64(m.DiscardEvents); got != 1 {
		t.Fatalf("kubelet_pleg_discard_events = %v, want 1", got)
	}
}

// A subscription loses nothing where the channel drops: a subscriber that
// keeps up gets all five events.
func TestSubscriptionGetsEverything(t *testing.T) {
	rt := newFakeRuntime()
	g, _ := newTestGenerator(t, rt, func(o *Options) { o.ChannelCapacity = 4 })
	_ = g.Watch()
	sub := g.Subscribe()
	defer sub.Close()
	ctx := context.Background()
	u, err := sub.Next(ctx)
	if err != nil || !u.Resync || len(u.Pods) != 0 {
		t.Fatalf("first update: %+v %v", u, err)
	}
	rt.setPods(pod("a", "c1=running", "c2=running", "c3=running"), pod("b", "c4=running", "c5=running"))
	g.Relist(ctx)
	var got []Event
	for range 5 {
		u, err := sub.Next(ctx)
		if err != nil || u.Resync {
			t.Fatalf("update: %+v %v", u, err)
		}
		got = append(got, u.Event)
	}
	want := []string{"a ContainerStarted c1", "a ContainerStarted c2", "a ContainerStarted c3", "b ContainerStarted c4", "b ContainerStarted c5"}
	if f := formatEvents(got); !reflect.DeepEqual(f, want) {
		t.Fatalf("got %v, want %v", f, want)
	}
}

// A subscriber that falls behind is resynced with the state of every pod
// instead of silently losing events, and never blocks the relist.
func TestSubscriptionResync(t *testing.T) {
	rt := newFakeRuntime()
	m := metrics.New(nil)
	g, clk := newTestGenerator(t, rt, func(o *Options) { o.Journal.Size = 3; o.Metrics = m })
	sub := g.Subscribe()
	defer sub.Close()
	ctx := context.Background()
	if u, _ := sub.Next(ctx); !u.Resync {
		t.Fatal("first update is not a resync")
	}
	rt.setPods(pod("a", "c1=running", "c2=running"), pod("b", "c3=running", "s:s1=running"))
	g.Relist(ctx) // 4 events > buffer 3
	clk.Step(time.Second)
	rt.setPods(pod("a", "c1=running", "c2=exited"), pod("b", "c3=running", "s:s1=running"))
	g.Relist(ctx)
	u, err := sub.Next(ctx)
	if err != nil || !u.Resync {
		t.Fatalf("want a resync, got %+v %v", u, err)
	}
	if got := testutil.ToFloat64(m.SubscriberResyncs); got != 1 {
		t.Fatalf("resyncs = %v", got)
	}
	want := []PodState{
		{UID: "a", Name: "name-a", Namespace: "ns", Containers: []ContainerState{{ID: "c1", Name: "ctr-c1", State: "running"}, {ID: "c2", Name: "ctr-c2", State: "exited"}}},
		{UID: "b", Name: "name-b", Namespace: "ns", Containers: []ContainerState{{ID: "s1", Name: "ctr-s1", Sandbox: true, State: "running"}, {ID: "c3", Name: "ctr-c3", State: "running"}}},
	}
	if !reflect.DeepEqual(u.Pods, want) {
		t.Fatalf("resync pods\n got %+v\nwant %+v", u.Pods, want)
	}
	// After the resync, events flow again.
	clk.Step(time.Second)
	rt.setPods(pod("b", "c3=running", "s:s1=running"))
	g.Relist(ctx)
	var got []Event
	for range 3 {
		u, err := sub.Next(ctx)
		if err != nil || u.Resync {
			t.Fatalf("%+v %v", u, err)
		}
		got = append(got, u.Event)
	}
	if f := formatEvents(got); !reflect.DeepEqual(f, []string{"a ContainerDied c1", "a ContainerRemoved c1", "a ContainerRemoved c2"}) {
		t.Fatalf("events after resync: %v", f)
	}
	sub.Close()
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

func TestRecentRelists(t *testing.T) {
	rt := newFakeRuntime()
	g, clk := newTestGenerator(t, rt, nil)
	rt.setPods(pod("a", "c1=running", "s:s1=running"), pod("b", "c2=running"))
	rt.fail["b"] = errStatus
	g.Relist(context.Background())
	clk.Step(time.Second)
	rt.listErr = errors.New("down")
	g.Relist(context.Background())
	stats := g.RecentRelists()
	if len(stats) != 2 {
		t.Fatalf("%d stats", len(stats))
	}
	s := stats[0]
	if s.Pods != 2 || s.Containers != 3 || s.Inspected != 2 || s.Failed != 1 || s.Events != 2 || s.Err != "" {
		t.Fatalf("first relist %+v", s)
	}
	if stats[1].Err != "down" {
		t.Fatalf("second relist %+v", stats[1])
	}
	for range statsKept + 5 {
		g.Relist(context.Background())
	}
	if n := len(g.RecentRelists()); n != statsKept {
		t.Fatalf("kept %d", n)
	}
}

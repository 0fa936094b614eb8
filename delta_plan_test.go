package pleg

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/cruntime"
)

func TestPlanDelta(t *testing.T) {
	prev := &cruntime.PodStatus{
		SandboxStatuses: []*cruntime.SandboxStatus{{ID: "s1", State: cruntime.StateRunning}},
		ContainerStatuses: []*cruntime.ContainerStatus{
			{ID: "a", State: cruntime.StateRunning},
			{ID: "b", State: cruntime.StateRunning},
			{ID: "u", State: cruntime.StateUnknown},
		},
	}
	// a unchanged, b exited, c new, u unknown; the sandbox unchanged.
	p := pod("p", "s:s1=running", "a=running", "b=exited", "c=running", "u=unknown")
	d := planDelta(p, prev)
	if d.sandboxes[0] != prev.SandboxStatuses[0] || len(d.fetchSbs) != 0 {
		t.Errorf("unchanged sandbox not reused: %+v", d)
	}
	if d.containers[0] != prev.ContainerStatuses[0] {
		t.Errorf("unchanged container a not reused")
	}
	var fetch []string
	for _, c := range d.fetchCts {
		fetch = append(fetch, c.ID)
	}
	// b changed state, c is new, u's state is unknown: fetched.
	if want := []string{"b", "c", "u"}; !reflect.DeepEqual(fetch, want) {
		t.Errorf("fetch %v, want %v", fetch, want)
	}
	// A new sandbox (recreated) is fetched; the old one, now exited, too.
	d = planDelta(pod("p", "s:s1=exited", "s:s2=running"), prev)
	if len(d.fetchSbs) != 2 {
		t.Errorf("fetch %d sandboxes, want 2", len(d.fetchSbs))
	}
}

// itemRuntime answers ItemStatuses with what it is told to.
type itemRuntime struct {
	*fakeRuntime
	sbs  []*cruntime.SandboxStatus
	cts  []*cruntime.ContainerStatus
	err  error
	asks [][]string
}

func (r *itemRuntime) ItemStatuses(_ context.Context, _ *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	var ids []string
	for _, c := range append(append([]*cruntime.Container(nil), sbs...), cts...) {
		ids = append(ids, c.ID)
	}
	r.asks = append(r.asks, ids)
	return r.sbs, r.cts, r.err
}

func TestFetchStatusDelta(t *testing.T) {
	rt := &itemRuntime{fakeRuntime: newFakeRuntime()}
	g, _ := newTestGenerator(t, rt, nil)
	prev := &cruntime.PodStatus{
		SandboxStatuses:   []*cruntime.SandboxStatus{{ID: "s1", State: cruntime.StateRunning, IPs: []string{"10.0.0.1"}}},
		ContainerStatuses: []*cruntime.ContainerStatus{{ID: "a", State: cruntime.StateRunning}},
	}
	p := pod("p", "s:s1=running", "a=running", "b=exited")

	// The changed container is fetched alone; the rest is reused, and the
	// pod's IPs come from the reused sandbox.
	rt.cts = []*cruntime.ContainerStatus{{ID: "b", State: cruntime.StateExited, ExitCode: 3}}
	s, err := g.fetchStatus(context.Background(), p, prev)
	if err != nil {
		t.Fatal(err)
	}
	if len(rt.asks) != 1 || !reflect.DeepEqual(rt.asks[0], []string{"b"}) {
		t.Errorf("asked for %v, want [[b]]", rt.asks)
	}
	if len(s.ContainerStatuses) != 2 || len(s.SandboxStatuses) != 1 || !reflect.DeepEqual(s.IPs, []string{"10.0.0.1"}) {
		t.Errorf("status %+v", s)
	}
	if rt.count("PodStatus") != 0 {
		t.Errorf("a full PodStatus call was made")
	}

	// Nothing changed but an item removed: no call at all.
	rt.asks = nil
	if _, err := g.fetchStatus(context.Background(), pod("p", "s:s1=running"), prev); err != nil || len(rt.asks) != 0 {
		t.Errorf("asked %v (err %v), want no call", rt.asks, err)
	}

	// A runtime that answers the wrong number of items is malformed.
	rt.cts = nil
	if _, err := g.fetchStatus(context.Background(), p, prev); !errors.Is(err, ErrMalformed) {
		t.Errorf("short answer: err %v, want ErrMalformed", err)
	}

	// A runtime error is the inspection's error.
	boom := errors.New("boom")
	rt.err = boom
	if _, err := g.fetchStatus(context.Background(), p, prev); !errors.Is(err, boom) {
		t.Errorf("err %v, want boom", err)
	}

	// Without a previous status, the full fetch.
	rt.err = nil
	if _, err := g.fetchStatus(context.Background(), p, nil); err != nil || rt.count("PodStatus") != 1 {
		t.Errorf("no prev: %d PodStatus calls (err %v), want 1", rt.count("PodStatus"), err)
	}
}

// TestCorePrev: a pod's work carries its last status for a delta
// inspection, except when a full one is due.
func TestCorePrev(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	step := func(c *core, requested []types.UID, items ...string) work {
		t.Helper()
		now = now.Add(time.Second)
		todo := c.listed(now, []*cruntime.Pod{pod("p", items...)}, requested)
		if len(todo) != 1 {
			t.Fatalf("todo %v", todo)
		}
		return todo[0]
	}
	ok := func(w work) *cruntime.PodStatus {
		s := &cruntime.PodStatus{UID: w.uid}
		for _, c := range w.pod.Containers {
			s.ContainerStatuses = append(s.ContainerStatuses, &cruntime.ContainerStatus{ID: c.ID, State: c.State})
		}
		return s
	}
	c := newCore(false)
	w := step(c, nil, "a=running")
	if w.prev != nil {
		t.Fatal("a new pod has a previous status")
	}
	s1 := ok(w)
	c.inspected(w, s1, nil, now)
	w = step(c, nil, "a=exited")
	if w.prev != s1 {
		t.Fatal("a changed pod's work lacks its last status")
	}
	c.inspected(w, nil, errors.New("boom"), now)
	w = step(c, nil, "a=exited")
	if w.prev != nil {
		t.Fatal("after a failed inspection, the retry is not a full one")
	}
	s2 := ok(w)
	c.inspected(w, s2, nil, now)
	if w = step(c, []types.UID{"p"}, "a=exited"); w.prev != nil {
		t.Fatal("a requested reinspection is not a full one")
	}
	c.inspected(w, ok(w), nil, now)
	if w, _, _ = c.podListed("p", pod("p", "a=running"), c.gen, true); w.prev != nil {
		t.Fatal("a requested single-pod reinspection is not a full one")
	}

	full := newCore(true)
	w = step(full, nil, "a=running")
	full.inspected(w, ok(w), nil, now)
	if w = step(full, nil, "a=exited"); w.prev != nil {
		t.Fatal("FullInspection: work carries a previous status")
	}
}

package sim

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// short is how long a test lets a call that should hang run before
// checking that it did: a lower bound only, however busy the machine. It
// must also let the call reach the server, which counts it (the tests
// check those counts): 50 ms was not enough on a loaded machine under the
// race detector.
const short = 250 * time.Millisecond

func uidLabel(uid string) map[string]string { return map[string]string{cruntime.LabelPodUID: uid} }

func TestHungLists(t *testing.T) {
	r, c := newSim(t, Config{Seed: 5, Pods: 3, ContainersPerPod: 2, HangPods: 1, HangLists: true})
	ctx := ctxT(t)
	pods := r.Pods()
	hung, fine := pods[0], pods[1]
	if got := r.HungLists(); !slices.Equal(got, []string{hung.UID}) {
		t.Fatalf("HungLists() = %v, want [%s]", got, hung.UID)
	}

	// Unfiltered lists, lists filtered to another pod and lists filtered
	// by state only answer, with everything they select.
	sbs, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(sbs.Items) != 3 {
		t.Fatalf("unfiltered ListPodSandbox: %d items, %v", len(sbs.GetItems()), err)
	}
	cs, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(cs.Containers) != 6 {
		t.Fatalf("unfiltered ListContainers: %d items, %v", len(cs.GetContainers()), err)
	}
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	if cs, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{State: running}}); err != nil || len(cs.Containers) != 6 {
		t.Fatalf("ListContainers by state: %d items, %v", len(cs.GetContainers()), err)
	}
	sbf, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: uidLabel(fine.UID)}})
	if err != nil || len(sbf.Items) != 1 || sbf.Items[0].Id != fine.SandboxID() {
		t.Fatalf("ListPodSandbox of another pod: %v, %v", sbf, err)
	}
	cf, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: fine.SandboxID()}})
	if err != nil || len(cf.Containers) != 2 {
		t.Fatalf("ListContainers of another pod's sandbox: %v, %v", cf, err)
	}
	// The status calls of the pod hang too (HangPods), as before.
	if _, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: fine.Containers[0].ID}); err != nil {
		t.Fatal(err)
	}

	// Every way of filtering to the hung pod hangs.
	filtered := map[string]func(context.Context) error{
		"ListPodSandbox by UID label": func(ctx context.Context) error {
			_, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: uidLabel(hung.UID)}})
			return err
		},
		"ListPodSandbox by sandbox ID": func(ctx context.Context) error {
			_, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: hung.SandboxID()}})
			return err
		},
		"ListContainers by UID label": func(ctx context.Context) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: uidLabel(hung.UID)}})
			return err
		},
		"ListContainers by sandbox ID": func(ctx context.Context) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: hung.SandboxID()}})
			return err
		},
		"ListContainers by container ID": func(ctx context.Context) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: hung.Containers[1].ID}})
			return err
		},
	}
	for name, call := range filtered {
		sctx, cancel := context.WithTimeout(ctx, short)
		deadline, _ := sctx.Deadline()
		err := call(sctx)
		returned := time.Now()
		cancel()
		if err == nil {
			t.Fatalf("%s answered", name)
		}
		wantCode(t, err, codes.DeadlineExceeded)
		// It hung until its deadline (the context's own, not a clock read
		// after it, which load can delay).
		if returned.Before(deadline) {
			t.Errorf("%s returned %v before its deadline", name, deadline.Sub(returned))
		}
	}
	if got, want := r.PodCalls(hung.UID), map[string]int64{"ListPodSandbox": 2, "ListContainers": 3}; !maps.Equal(got, want) {
		t.Errorf("PodCalls(hung) = %v, want %v", got, want)
	}
	if got, want := r.PodCalls(fine.UID), map[string]int64{"ListPodSandbox": 1, "ListContainers": 1, "ContainerStatus": 1}; !maps.Equal(got, want) {
		t.Errorf("PodCalls(fine) = %v, want %v", got, want)
	}

	// Un-hanging the lists releases a waiting call, which answers with
	// the pod's items; the status calls still hang.
	type answer struct {
		n   int
		err error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: uidLabel(hung.UID)}})
		done <- answer{len(resp.GetContainers()), err}
	}()
	waitFor(t, "the hung list call", func() bool { return r.PodCalls(hung.UID)["ListContainers"] == 4 })
	r.SetHungLists(hung.UID, false)
	select {
	case a := <-done:
		if a.err != nil || a.n != 2 {
			t.Fatalf("released list: %d containers, %v; want 2", a.n, a.err)
		}
	case <-time.After(patience):
		t.Fatal("SetHungLists(false) did not release the call")
	}
	if len(r.HungLists()) != 0 || !slices.Equal(r.Hung(), []string{hung.UID}) {
		t.Errorf("HungLists %v, Hung %v", r.HungLists(), r.Hung())
	}
	sctx, cancel := context.WithTimeout(ctx, short)
	_, err = c.PodSandboxStatus(sctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: hung.SandboxID()})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)

	// SetHungLists is independent of SetHung: the lists of a pod whose
	// status calls answer can hang.
	r.SetHungLists(fine.UID, true)
	if _, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: fine.SandboxID()}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel = context.WithTimeout(ctx, short)
	_, err = c.ListPodSandbox(sctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: fine.SandboxID()}})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)

	// Stop ends a hung list call.
	go func() {
		resp, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: uidLabel(fine.UID)}})
		done <- answer{len(resp.GetItems()), err}
	}()
	waitFor(t, "the hung list call", func() bool { return r.PodCalls(fine.UID)["ListPodSandbox"] == 3 })
	go r.Stop()
	select {
	case a := <-done:
		wantCode(t, a.err, codes.Unavailable, codes.Canceled)
	case <-time.After(patience):
		t.Fatal("Stop did not end the hung list call")
	}
}

func TestFilteredListsSelectTheirPod(t *testing.T) {
	// Filtered lists look at the selected pod only; they must select
	// what a full scan would.
	r, c := newSim(t, Config{Seed: 9, Pods: 4, ContainersPerPod: 3})
	ctx := ctxT(t)
	p := r.Pods()[2]
	old, _ := p.Container("main")
	if _, err := r.RestartContainer(p.UID, "main"); err != nil {
		t.Fatal(err)
	}
	p, _ = r.Pod(p.UID)
	cs, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: uidLabel(p.UID)}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ct := range cs.Containers {
		ids = append(ids, ct.Id)
	}
	if !slices.Equal(ids, p.ContainerIDs()) {
		t.Errorf("by UID: %v, want %v", ids, p.ContainerIDs())
	}
	exited := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}
	cs, err = c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.SandboxID(), State: exited}})
	if err != nil || len(cs.Containers) != 1 || cs.Containers[0].Id != old.ID {
		t.Errorf("exited by sandbox: %v, %v; want %s", cs, err, old.ID)
	}
	for _, f := range []*runtimeapi.ContainerFilter{
		{LabelSelector: uidLabel("no-such-pod")},
		{PodSandboxId: "no-such-sandbox"},
		{Id: "no-such-container"},
		{LabelSelector: uidLabel(p.UID), PodSandboxId: r.Pods()[0].SandboxID()},
	} {
		cs, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
		if err != nil || len(cs.Containers) != 0 {
			t.Errorf("filter %v: %d containers, %v; want none", f, len(cs.GetContainers()), err)
		}
	}
	sbs, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: p.SandboxID(), LabelSelector: map[string]string{cruntime.LabelPodName: p.Name}}})
	if err != nil || len(sbs.Items) != 1 {
		t.Errorf("sandbox by ID and name: %v, %v", sbs, err)
	}
}

func TestEmitEvents(t *testing.T) {
	r, c := newSim(t, Config{Seed: 11, Pods: 2, ContainersPerPod: 2})
	ctx := ctxT(t)
	pods := r.Pods()
	target := pods[1]
	before, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s := subscribe(t, r, c, 1)
	from := time.Now()
	r.EmitEvents(target.UID, 5*time.Millisecond)
	if got := r.Emitting(); !slices.Equal(got, []string{target.UID}) {
		t.Fatalf("Emitting() = %v", got)
	}
	evs := recvN(t, s, 8)
	to := time.Now()
	r.EmitEvents(target.UID, 0)
	if got := r.Emitting(); len(got) != 0 {
		t.Errorf("Emitting() after stop = %v", got)
	}
	const (
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	)
	ids := target.ContainerIDs()
	want := []evKey{{ids[0], stopped}, {ids[0], started}, {ids[1], stopped}, {ids[1], started}}
	sameKeys(t, "flapping", keys(evs), append(want, want...))
	for _, ev := range evs {
		if uid := ev.PodSandboxStatus.GetMetadata().GetUid(); uid != target.UID {
			t.Errorf("event for pod %s, want %s", uid, target.UID)
		}
		if at := time.Unix(0, ev.CreatedAt); at.Before(from) || at.After(to) {
			t.Errorf("CreatedAt %v not between %v and %v", at, from, to)
		}
		if len(ev.ContainersStatuses) != 2 {
			t.Errorf("event carries %d container statuses, want 2", len(ev.ContainersStatuses))
		}
	}
	// The model did not change.
	after, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Containers) != len(before.Containers) {
		t.Fatalf("%d containers, were %d", len(after.Containers), len(before.Containers))
	}
	for i := range after.Containers {
		if a, b := after.Containers[i], before.Containers[i]; a.Id != b.Id || a.State != b.State {
			t.Errorf("container %d: %s %v, was %s %v", i, a.Id, a.State, b.Id, b.State)
		}
	}
	// Stopped: EmitEvents(uid, 0) waits for the generator, so nothing
	// more is emitted.
	n := r.EventStats().Emitted
	time.Sleep(4 * 5 * time.Millisecond)
	if m := r.EventStats().Emitted; m != n {
		t.Errorf("%d events emitted after stopping", m-n)
	}
	// A pod that does not exist gets none; the generator still ends with
	// the runtime.
	r.EmitEvents("no-such-pod", time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if m := r.EventStats().Emitted; m != n {
		t.Errorf("%d events emitted for a pod that does not exist", m-n)
	}
}

func TestHungPodEventsConfig(t *testing.T) {
	r, c := newSim(t, Config{Seed: 2, Pods: 3, HangPods: 1, HangLists: true, HungPodEvents: 2 * time.Millisecond})
	hung := r.Hung()
	if len(hung) != 1 || !slices.Equal(r.Emitting(), hung) || !slices.Equal(r.HungLists(), hung) {
		t.Fatalf("Hung %v, HungLists %v, Emitting %v", hung, r.HungLists(), r.Emitting())
	}
	s := subscribe(t, r, c, 1)
	for _, ev := range recvN(t, s, 4) {
		if uid := ev.PodSandboxStatus.GetMetadata().GetUid(); uid != hung[0] {
			t.Errorf("event for pod %s, want the hung pod %s", uid, hung[0])
		}
	}
}

func TestEventStorm(t *testing.T) {
	r, c := newSim(t, Config{Seed: 4, Pods: 5, ContainersPerPod: 1, EventBuffer: 10000})
	s := subscribe(t, r, c, 1)
	r.SetEventStorm(2000)
	evs := recvN(t, s, 50)
	r.SetEventStorm(0)
	perPod := map[string]int{}
	for _, ev := range evs {
		perPod[ev.PodSandboxStatus.GetMetadata().GetUid()]++
	}
	// Round robin: 50 events over 5 pods, 10 each.
	for _, p := range r.Pods() {
		if perPod[p.UID] != 10 {
			t.Errorf("pod %s: %d events, want 10 (%v)", p.UID, perPod[p.UID], perPod)
		}
	}
	n := r.EventStats().Emitted
	time.Sleep(4 * stormTick)
	if m := r.EventStats().Emitted; m != n {
		t.Errorf("%d events emitted after the storm stopped", m-n)
	}
}

// The storm says what it is told to about each running container:
// STOPPED and STARTED in turn, STARTED only, or STOPPED only.
func TestStormEvents(t *testing.T) {
	const (
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	)
	for _, c := range []struct {
		kind StormEvents
		want map[runtimeapi.ContainerEventType]int
	}{
		{StormFlap, map[runtimeapi.ContainerEventType]int{stopped: 10, started: 10}},
		{StormStarted, map[runtimeapi.ContainerEventType]int{started: 20}},
		{StormStopped, map[runtimeapi.ContainerEventType]int{stopped: 20}},
	} {
		r, cl := newSim(t, Config{Seed: 4, Pods: 2, ContainersPerPod: 2, EventBuffer: 10000})
		s := subscribe(t, r, cl, 1)
		r.SetStormEvents(c.kind)
		r.SetEventStorm(2000)
		evs := recvN(t, s, 20)
		r.SetEventStorm(0)
		got := map[runtimeapi.ContainerEventType]int{}
		ids := map[string]bool{}
		for _, ev := range evs {
			got[ev.ContainerEventType]++
			ids[ev.ContainerId] = true
		}
		if !maps.Equal(got, c.want) || len(ids) != 4 {
			t.Errorf("storm %d: events %v about %d containers, want %v about all 4", c.kind, got, len(ids), c.want)
		}
		for _, p := range r.Pods() {
			for _, ct := range p.Containers {
				if ct.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
					t.Errorf("storm %d: container %s is %v: the storm changed the model", c.kind, ct.ID, ct.State)
				}
			}
		}
	}
}

func TestKeepEvents(t *testing.T) {
	clk := fakeClock()
	r, c := newSim(t, Config{Clock: clk, KeepEvents: 5 * time.Minute})
	// Nobody subscribes: the events are kept.
	old := mustAdd(t, r, PodSpec{Containers: []string{"a"}})
	clk.Step(4 * time.Minute)
	recent := mustAdd(t, r, PodSpec{Containers: []string{"a"}})
	clk.Step(2 * time.Minute) // the first pod's events are now 6 minutes old
	if err := r.ExitContainer(old.Containers[0].ID, 1); err != nil {
		t.Fatal(err)
	}
	s := subscribe(t, r, c, 1)
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	)
	sb, ct := recent.SandboxID(), recent.Containers[0].ID
	evs := recvN(t, s, 5)
	sameKeys(t, "kept", keys(evs), []evKey{{sb, created}, {sb, started}, {ct, created}, {ct, started}, {old.Containers[0].ID, stopped}})
	for i, ev := range evs {
		want := epoch.Add(4 * time.Minute)
		if i == 4 {
			want = epoch.Add(6 * time.Minute)
		}
		if ev.CreatedAt != want.UnixNano() {
			t.Errorf("event %d: CreatedAt %v, want %v", i, time.Unix(0, ev.CreatedAt).UTC(), want)
		}
	}
	// Then the live events; a second subscriber gets nothing kept.
	s2 := subscribe(t, r, c, 2)
	if err := r.ExitContainer(ct, 1); err != nil {
		t.Fatal(err)
	}
	sameKeys(t, "live", keys(recvN(t, s, 1)), []evKey{{ct, stopped}})
	sameKeys(t, "second subscriber", keys(recvN(t, s2, 1)), []evKey{{ct, stopped}})

}

func TestReplay(t *testing.T) {
	clk := fakeClock()
	r, c := newSim(t, Config{Clock: clk, ReplayEvents: 5, ReplayAge: 3 * time.Minute})
	p1 := mustAdd(t, r, PodSpec{Containers: []string{"a"}})
	p2 := mustAdd(t, r, PodSpec{Containers: []string{"a"}, CreatedOnly: true})
	if err := r.ExitContainer(p1.Containers[0].ID, 1); err != nil {
		t.Fatal(err)
	}
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	)
	// The model's items in turn, each with the event of its state, from
	// the first again when there are fewer than 5.
	want := []evKey{
		{p1.SandboxID(), started}, {p1.Containers[0].ID, stopped},
		{p2.SandboxID(), started}, {p2.Containers[0].ID, created},
		{p1.SandboxID(), started},
	}
	for i := range 2 { // every new subscriber gets the replay
		s := subscribe(t, r, c, i+1)
		evs := recvN(t, s, 5)
		sameKeys(t, "replay", keys(evs), want)
		for _, ev := range evs {
			if ev.CreatedAt != epoch.Add(-3*time.Minute).UnixNano() {
				t.Errorf("replayed CreatedAt %v, want 3 minutes before %v", time.Unix(0, ev.CreatedAt).UTC(), epoch)
			}
		}
		// Then the live events.
		newID, err := r.RestartContainer(p2.UID, "a")
		if err != nil {
			t.Fatal(err)
		}
		// The model has 5 items now.
		want = []evKey{
			{p1.SandboxID(), started}, {p1.Containers[0].ID, stopped},
			{p2.SandboxID(), started}, {p2.Containers[0].ID, stopped}, {newID, started},
		}
		live := recvN(t, s, 1)[0]
		if live.CreatedAt != epoch.UnixNano() || live.ContainerEventType != stopped {
			t.Errorf("live event %v", live)
		}
	}
	r.SetReplay(0, 0)
	s := subscribe(t, r, c, 3)
	if err := r.StopPod(p1.UID); err != nil {
		t.Fatal(err)
	}
	if ev := recvN(t, s, 1)[0]; ev.CreatedAt != epoch.UnixNano() {
		t.Errorf("replayed after SetReplay(0): %v", ev)
	}
}

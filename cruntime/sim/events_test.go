package sim

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type evStream = grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse]

func subscribe(t *testing.T, r *Runtime, c runtimeapi.RuntimeServiceClient, want int) evStream {
	t.Helper()
	s, err := c.GetContainerEvents(ctxT(t), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscription", func() bool { return r.Subscribers() == want })
	return s
}

func recvN(t *testing.T, s evStream, n int) []*runtimeapi.ContainerEventResponse {
	t.Helper()
	var out []*runtimeapi.ContainerEventResponse
	for range n {
		ev, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, ev)
	}
	return out
}

type evKey struct {
	id  string
	typ runtimeapi.ContainerEventType
}

func keys(evs []*runtimeapi.ContainerEventResponse) []evKey {
	var out []evKey
	for _, ev := range evs {
		out = append(out, evKey{ev.ContainerId, ev.ContainerEventType})
	}
	return out
}

func sameKeys(t *testing.T, what string, got, want []evKey) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: events %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: events %v, want %v", what, got, want)
		}
	}
}

func TestEvents(t *testing.T) {
	clk := fakeClock()
	r, c := newSim(t, Config{Clock: clk})
	s1 := subscribe(t, r, c, 1)
	s2 := subscribe(t, r, c, 2)

	p := mustAdd(t, r, PodSpec{Name: "web", Namespace: "prod", Containers: []string{"app"}})
	sb, app := p.SandboxID(), p.Containers[0].ID
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
		deleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	)
	want := []evKey{{sb, created}, {sb, started}, {app, created}, {app, started}}
	evs := recvN(t, s1, 4)
	sameKeys(t, "add pod", keys(evs), want)
	sameKeys(t, "add pod, second subscriber", keys(recvN(t, s2, 4)), want)
	for _, ev := range evs {
		if ev.CreatedAt != epoch.UnixNano() {
			t.Errorf("CreatedAt = %d, want %d (ns)", ev.CreatedAt, epoch.UnixNano())
		}
		ps := ev.PodSandboxStatus
		if ps.GetId() != sb || ps.GetMetadata().GetUid() != p.UID || ps.GetMetadata().GetName() != "web" || ps.GetMetadata().GetNamespace() != "prod" {
			t.Errorf("event %v: sandbox status %v", ev.ContainerEventType, ps)
		}
	}
	if n := len(evs[3].ContainersStatuses); n != 1 || evs[3].ContainersStatuses[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("started event statuses = %v", evs[3].ContainersStatuses)
	}

	clk.Step(time.Second)
	if err := r.ExitContainer(app, 2); err != nil {
		t.Fatal(err)
	}
	ev := recvN(t, s1, 1)[0]
	if ev.ContainerId != app || ev.ContainerEventType != stopped || ev.CreatedAt != epoch.Add(time.Second).UnixNano() {
		t.Errorf("stop event = %v", ev)
	}
	if st := ev.ContainersStatuses; len(st) != 1 || st[0].ExitCode != 2 || st[0].Reason != "Error" || st[0].FinishedAt != epoch.Add(time.Second).UnixNano() {
		t.Errorf("stop event statuses = %v", st)
	}

	newID, err := r.RestartContainer(p.UID, "app")
	if err != nil {
		t.Fatal(err)
	}
	evs = recvN(t, s1, 2)
	sameKeys(t, "restart", keys(evs), []evKey{{newID, created}, {newID, started}})
	if n := len(evs[1].ContainersStatuses); n != 2 {
		t.Errorf("restart event has %d container statuses, want 2", n)
	}

	if err := r.RemovePod(p.UID); err != nil {
		t.Fatal(err)
	}
	evs = recvN(t, s1, 5)
	sameKeys(t, "remove pod", keys(evs), []evKey{{app, deleted}, {newID, stopped}, {newID, deleted}, {sb, stopped}, {sb, deleted}})
	if last := evs[4]; last.PodSandboxStatus.GetMetadata().GetUid() != p.UID || len(last.ContainersStatuses) != 0 {
		t.Errorf("sandbox deleted event = %v", last)
	}
	sameKeys(t, "all, second subscriber", keys(recvN(t, s2, 8))[:1], []evKey{{app, stopped}})
	if st := r.EventStats(); st.Emitted != 12 || st.Queued != 24 || st.DroppedFull != 0 || st.DroppedRandom != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestEventsDisabled(t *testing.T) {
	r, c := newSim(t, Config{DisableEvents: true})
	s, err := c.GetContainerEvents(ctxT(t), &runtimeapi.GetEventsRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, err, codes.Unimplemented)

	// Switched on, then off again while streaming: the stream ends.
	r.SetEvents(true)
	s = subscribe(t, r, c, 1)
	r.SetEvents(false)
	_, err = s.Recv()
	wantCode(t, err, codes.Unimplemented)
	if r.Subscribers() != 0 {
		t.Error("subscriber left")
	}
}

func TestEventDropRate(t *testing.T) {
	r, c := newSim(t, Config{EventDropRate: 1})
	s := subscribe(t, r, c, 1)
	mustAdd(t, r, PodSpec{Containers: []string{"a", "b"}})
	st := r.EventStats()
	if st.Emitted != 6 || st.DroppedRandom != 6 || st.Queued != 0 {
		t.Errorf("stats = %+v", st)
	}
	// Nothing arrives; turning drops off lets the next events through.
	r.SetEventDropRate(0)
	p := mustAdd(t, r, PodSpec{Containers: []string{"a"}})
	ev, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev.ContainerId != p.SandboxID() || ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT {
		t.Errorf("first event received = %v, want the second pod's sandbox creation", ev)
	}
}

// blockingStream is a server stream whose Send blocks until released.
type blockingStream struct {
	grpc.ServerStream
	ctx     context.Context
	release chan struct{}
	sent    chan struct{}
}

func (s *blockingStream) Context() context.Context { return s.ctx }

func (s *blockingStream) Send(*runtimeapi.ContainerEventResponse) error {
	select {
	case s.sent <- struct{}{}:
	default:
	}
	<-s.release
	return nil
}

func TestSlowSubscriberDoesNotBlock(t *testing.T) {
	r := New(Config{EventBuffer: 2})
	t.Cleanup(r.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	stream := &blockingStream{ctx: ctx, release: make(chan struct{}), sent: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- r.Service().GetContainerEvents(&runtimeapi.GetEventsRequest{}, stream) }()
	waitFor(t, "subscription", func() bool { return r.Subscribers() == 1 })

	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for range 5 {
			if _, err := r.AddPod(PodSpec{Containers: []string{"a", "b"}}); err != nil {
				t.Error(err)
			}
		}
	}()
	select {
	case <-finished:
	case <-time.After(patience):
		t.Fatal("the model blocked on a slow subscriber")
	}
	st := r.EventStats()
	if st.Emitted != 30 || st.DroppedFull < 30-3 || st.Queued+st.DroppedFull != 30 {
		t.Errorf("stats = %+v", st)
	}
	close(stream.release)
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("stream ended with %v", err)
	}
}

// TestEventReorderRate: an event held back is sent right after the next,
// so that with a rate of 1 a subscriber gets each pair swapped.
func TestEventReorderRate(t *testing.T) {
	r, c := newSim(t, Config{EventReorderRate: 1})
	s := subscribe(t, r, c, 1)
	p := mustAdd(t, r, PodSpec{Containers: []string{"a"}})
	sb, ctr := p.SandboxID(), p.ContainerIDs()[0]
	want := []string{
		"CONTAINER_STARTED_EVENT " + sb, "CONTAINER_CREATED_EVENT " + sb,
		"CONTAINER_STARTED_EVENT " + ctr, "CONTAINER_CREATED_EVENT " + ctr,
	}
	var got []string
	for range want {
		ev, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.ContainerEventType.String()+" "+ev.ContainerId)
	}
	if !slices.Equal(got, want) {
		t.Errorf("received\n%v\nwant\n%v", got, want)
	}
	if st := r.EventStats(); st.Emitted != 4 || st.Queued != 4 || st.Reordered != 2 {
		t.Errorf("stats = %+v, want 4 emitted and queued, 2 reordered", st)
	}
}

package cri

import (
	"context"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

type eventStream = grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]

func TestWatchEvents(t *testing.T) {
	const sec = int64(time.Second)
	sent := []*runtimeapi.ContainerEventResponse{
		{
			ContainerId:        "c1",
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT,
			CreatedAt:          10*sec + 7,
			PodSandboxStatus: &runtimeapi.PodSandboxStatus{
				Id:       "sb",
				Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-a", Name: "pod-a", Namespace: "ns-a"},
			},
			// The sandbox metadata wins over the container labels.
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c1", Labels: label("uid-x", "x", "x", "")}},
		},
		{
			ContainerId:        "c2",
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
			CreatedAt:          11 * sec,
			PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "sb"}, // no metadata
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c2", Labels: label("uid-b", "pod-b", "ns-b", "app")}},
		},
		{
			ContainerId:        "c3",
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
			CreatedAt:          12 * sec,
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c3"}}, // nil labels
		},
		{ContainerId: "c4", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT},
		{ContainerId: "c5", ContainerEventType: 99},
	}
	want := []cruntime.Event{
		{ContainerID: "c1", Type: cruntime.EventCreated, CreatedAt: time.Unix(10, 7), PodUID: "uid-a", PodName: "pod-a", PodNamespace: "ns-a"},
		{ContainerID: "c2", Type: cruntime.EventStarted, CreatedAt: time.Unix(11, 0), PodUID: "uid-b", PodName: "pod-b", PodNamespace: "ns-b"},
		{ContainerID: "c3", Type: cruntime.EventStopped, CreatedAt: time.Unix(12, 0)},
		{ContainerID: "c4", Type: cruntime.EventDeleted},
		{ContainerID: "c5", Type: cruntime.EventType(99)},
	}

	// After the events, the stream waits for late, then sends one more
	// event (once the unary timeout has long passed) and stays open.
	late := make(chan struct{})
	lateEvent := &runtimeapi.ContainerEventResponse{ContainerId: "late", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT}
	deadlines := make(chan bool, 1) // whether the stream's context has a deadline
	f := &fakeCRI{events: func(_ *runtimeapi.GetEventsRequest, s eventStream) error {
		_, ok := s.Context().Deadline()
		select {
		case deadlines <- ok:
		default:
		}
		for _, ev := range sent {
			if err := s.Send(ev); err != nil {
				return err
			}
		}
		select {
		case <-late:
			if err := s.Send(lateEvent); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
		<-s.Context().Done() // then stay open
		return nil
	}}
	const unaryTimeout = 50 * time.Millisecond
	m := metrics.New(nil)
	c := f.start(t, WithMetrics(m), WithTimeout(unaryTimeout))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &recordingTracer{}
	got := make(chan cruntime.Event, len(sent))
	errc := make(chan error, 1)
	go func() {
		errc <- c.WatchEvents(cruntime.WithCallTracer(ctx, tr), nil, func(ev cruntime.Event) { got <- ev })
	}()

	var events []cruntime.Event
	next := func() cruntime.Event {
		t.Helper()
		select {
		case ev := <-got:
			return ev
		case err := <-errc:
			t.Fatalf("WatchEvents returned early: %v (events %v)", err, events)
		case <-time.After(30 * time.Second):
			t.Fatalf("timed out waiting for events; got %v", events)
		}
		return cruntime.Event{}
	}
	for range want {
		events = append(events, next())
	}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events:\n got %+v\nwant %+v", events, want)
	}

	// The stream outlives the unary timeout: it carries no deadline, and an
	// event sent well after the timeout still arrives. (A slow machine only
	// sends it later.)
	if <-deadlines {
		t.Error("the event stream has a deadline")
	}
	time.Sleep(3 * unaryTimeout)
	close(late)
	if ev := next(); ev.ContainerID != "late" || ev.Type != cruntime.EventCreated {
		t.Errorf("late event = %+v, want the creation of container late", ev)
	}

	cancel()
	select {
	case err := <-errc:
		if err != context.Canceled {
			t.Errorf("WatchEvents after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WatchEvents did not return after cancel")
	}
	if n := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(metrics.OpGetContainerEvents)); n != 1 {
		t.Errorf("get_container_events operations = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpGetContainerEvents)); n != 0 {
		t.Errorf("get_container_events errors = %v, want 0", n)
	}
	if s := tr.summary(); !reflect.DeepEqual(s, []string{"get_container_events "}) {
		t.Errorf("traced calls = %q", s)
	}
}

func TestWatchEventsUnsupported(t *testing.T) {
	m := metrics.New(nil)
	c := (&fakeCRI{}).start(t, WithMetrics(m))
	err := c.WatchEvents(context.Background(), nil, func(cruntime.Event) { t.Error("event from an unsupported stream") })
	if !errors.Is(err, cruntime.ErrEventsUnsupported) {
		t.Errorf("WatchEvents = %v, want ErrEventsUnsupported", err)
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("status.Code = %v, want Unimplemented", status.Code(err))
	}
	if n := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(metrics.OpGetContainerEvents)); n != 1 {
		t.Errorf("get_container_events operations = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpGetContainerEvents)); n != 1 {
		t.Errorf("get_container_events errors = %v, want 1", n)
	}
}

func TestWatchEventsStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   error
		check func(error) bool
	}{
		{"closed", nil, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"failed", status.Error(codes.Internal, "event store broken"), func(err error) bool {
			return status.Code(err) == codes.Internal && contains(err.Error(), "GetContainerEvents: rpc error")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCRI{events: func(_ *runtimeapi.GetEventsRequest, s eventStream) error {
				if err := s.Send(&runtimeapi.ContainerEventResponse{ContainerId: "c1"}); err != nil {
					return err
				}
				return tc.end
			}}
			m := metrics.New(nil)
			c := f.start(t, WithMetrics(m))
			var n int
			err := c.WatchEvents(context.Background(), nil, func(cruntime.Event) { n++ })
			if n != 1 || err == nil || !tc.check(err) || errors.Is(err, cruntime.ErrEventsUnsupported) {
				t.Errorf("WatchEvents: %d events, err %v", n, err)
			}
			if n := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpGetContainerEvents)); n != 1 {
				t.Errorf("get_container_events errors = %v, want 1", n)
			}
		})
	}
}

func TestWatchEventsNoRuntime(t *testing.T) {
	c, err := Dial("unix://" + socketDir(t) + "/missing.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.WatchEvents(context.Background(), nil, func(cruntime.Event) {})
	if err == nil || status.Code(err) != codes.Unavailable || errors.Is(err, cruntime.ErrEventsUnsupported) {
		t.Errorf("WatchEvents without a runtime = %v; want Unavailable", err)
	}
}

func TestWatchEventsCancelledBeforeStart(t *testing.T) {
	c := (&fakeCRI{}).start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.WatchEvents(ctx, nil, func(cruntime.Event) {}); err != context.Canceled {
		t.Errorf("WatchEvents with a cancelled context = %v, want context.Canceled", err)
	}
}

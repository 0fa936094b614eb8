package criserve

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// recvEvent reads the next event, failing the test on an error.
func recvEvent(t *testing.T, s runtimeapi.RuntimeService_GetContainerEventsClient) *runtimeapi.ContainerEventResponse {
	t.Helper()
	ev, err := s.Recv()
	if err != nil {
		t.Fatalf("GetContainerEvents: %v", err)
	}
	return ev
}

// TestContainerEventsThroughRestart: a container's start, stop and
// removal arrive in the runtime's shape, in order, and the stream stays
// open while the runtime goes away and comes back.
func TestContainerEventsThroughRestart(t *testing.T) {
	r := newRig(t, sim.Config{Seed: 11, Pods: 2, ContainersPerPod: 1}, Config{})
	r.synced(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := r.pleg.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pod := r.sim.Pods()[0]
	id := pod.ContainerIDs()[0]
	watching(t, r.srv, 1)
	if err := r.sim.ExitContainer(id, 2); err != nil {
		t.Fatal(err)
	}
	ev := recvEvent(t, s)
	if ev.GetContainerId() != id || ev.GetContainerEventType() != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		t.Fatalf("first event %v, want %s stopped", ev, id)
	}
	if ev.GetPodSandboxStatus().GetId() != pod.SandboxID() || ev.GetPodSandboxStatus().GetMetadata().GetUid() != pod.UID {
		t.Errorf("the event's sandbox status %v, want the pod's sandbox %s", ev.GetPodSandboxStatus(), pod.SandboxID())
	}
	if len(ev.GetContainersStatuses()) != 1 || ev.GetContainersStatuses()[0].GetExitCode() != 2 ||
		ev.GetContainersStatuses()[0].GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("the event's container statuses %v, want the exited container (exit code 2)", ev.GetContainersStatuses())
	}

	r.sim.GoAway()
	// While the runtime is away pleg fails to relist; the stream stays.
	waitFor(t, "pleg to notice the runtime is away", func() (bool, string) {
		_, _, lastErr := r.ready.RuntimeConditions()
		return lastErr != nil, "its Status calls still succeed"
	})
	if err := r.sim.ComeBack(); err != nil {
		t.Fatal(err)
	}
	if err := r.sim.RemoveContainer(id); err != nil {
		t.Fatal(err)
	}
	newID, err := r.sim.RestartContainer(r.sim.Pods()[1].UID, r.sim.Pods()[1].Containers[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]runtimeapi.ContainerEventType{}
	for len(got[id]) < 1 || len(got[newID]) < 1 {
		ev := recvEvent(t, s)
		got[ev.GetContainerId()] = append(got[ev.GetContainerId()], ev.GetContainerEventType())
	}
	if got[id][0] != runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		t.Errorf("events of the removed container %v, want deleted", got[id])
	}
	if got[newID][0] != runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT {
		t.Errorf("events of the restarted container %v, want started", got[newID])
	}
}

// journalPod is a running pod with one container and a label of size
// pad (to fill transport buffers quickly).
func journalPod(uid string, pad int) *journal.Pod {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	labels := cruntime.LabelsOf(cruntime.LabelPodUID, uid, "pad", strings.Repeat("x", pad))
	return &journal.Pod{UID: types.UID(uid), Name: "p-" + uid, Namespace: "default", ObservedAt: t0,
		Sandboxes: []*journal.Sandbox{{ID: uid + "-sb", Name: "p-" + uid, State: cruntime.StateRunning, CreatedAt: t0, Labels: labels}},
		Containers: []*journal.Container{new(journal.Container{ID: uid + "-c", Name: "c", State: cruntime.StateRunning}.WithStatus(
			&cruntime.ContainerStatus{CreatedAt: t0, StartedAt: t0, Labels: labels}))}}
}

func started(j *journal.Journal, p *journal.Pod) {
	j.Append(journal.Entry{Kind: journal.KindPod, Pod: p, Source: journal.SourceRelist,
		Transitions: []journal.Transition{{Type: "ContainerStarted", ContainerID: p.Containers[0].ID, ContainerName: "c"}}})
}

// TestContainerEventsReaderGetsAll: a client that reads gets every event,
// in order, however far the journal runs ahead of its queue.
func TestContainerEventsReaderGetsAll(t *testing.T) {
	srv, j, c := bareServer(t, Config{QueueSize: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	watching(t, srv, 1)
	const n = 3000
	go func() {
		for i := 0; i < n; i++ {
			started(j, journalPod(fmt.Sprintf("pod-%05d", i), 512))
		}
	}()
	next := 0
	for next < n {
		ev := recvEvent(t, s)
		if want := fmt.Sprintf("pod-%05d-c", next); ev.GetContainerId() != want {
			t.Fatalf("event %d is %s, want %s", next, ev.GetContainerId(), want)
		}
		next++
	}
}

// TestContainerEventsCutNonReader: a client that reads nothing while
// events wait is cut after the stall timeout, with ResourceExhausted, and
// the others go on.
func TestContainerEventsCutNonReader(t *testing.T) {
	clk := testkit.NewTimerClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), 1024)
	srv, j, c := bareServer(t, Config{QueueSize: 1, StallTimeout: 10 * time.Second, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled, err := c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	watching(t, srv, 1)
	// Append until the stream is cut, letting each stall timer made on
	// clk (the outbox's watchdog, armed as a send starts) expire: the
	// client reads nothing meanwhile, so the cut can only be for that.
	big := 64 << 10
	for i := 0; srv.watching.Load() != 0; i++ {
		select {
		case <-clk.Timers:
			clk.Step(10 * time.Second)
		case <-time.After(10 * time.Millisecond):
			started(j, journalPod(fmt.Sprintf("pod-%05d", i), big))
		}
		if i > 10000 {
			t.Fatal("the stream was never cut")
		}
	}
	// The client now reads: what was sent, then the cut.
	for {
		_, err := stalled.Recv()
		if err == nil {
			continue
		}
		if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "read no event") {
			t.Fatalf("the stalled stream ended with %v, want ResourceExhausted for not reading", err)
		}
		break
	}
}

// fixedScope puts every caller in one pod (nil: in none).
type fixedScope struct{ uid types.UID }

func (f fixedScope) PodOf(_ int32, j *journal.Journal) (*journal.Pod, bool) {
	if f.uid == "" {
		return nil, false
	}
	return j.Pod(f.uid)
}

// TestPodScoped: a pod-scoped endpoint shows its caller only its pod,
// and nothing when it is in none; node-wide calls are refused.
func TestPodScoped(t *testing.T) {
	srv, j, c := bareServer(t, Config{Scope: fixedScope{uid: "mine"}})
	_, j2, none := bareServer(t, Config{Scope: fixedScope{}})
	for _, jj := range []*journal.Journal{j, j2} {
		started(jj, journalPod("mine", 0))
		started(jj, journalPod("other", 0))
	}
	ctx := context.Background()
	cs, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.GetContainers()) != 1 || cs.GetContainers()[0].GetId() != "mine-c" {
		t.Errorf("pod-scoped ListContainers: %v, want only mine-c", cs.GetContainers())
	}
	sbs, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs.GetItems()) != 1 || sbs.GetItems()[0].GetId() != "mine-sb" {
		t.Errorf("pod-scoped ListPodSandbox: %v, want only mine-sb", sbs.GetItems())
	}
	if _, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "other-c"}); status.Code(err) != codes.NotFound {
		t.Errorf("another pod's ContainerStatus: %v, want NotFound", err)
	}
	if _, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "mine-c"}); err != nil {
		t.Errorf("its own ContainerStatus: %v", err)
	}
	if _, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "other-sb"}); status.Code(err) != codes.NotFound {
		t.Errorf("another pod's PodSandboxStatus: %v, want NotFound", err)
	}
	// Nothing at all in no pod.
	cs, err = none.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(cs.GetContainers()) != 0 {
		t.Errorf("ListContainers in no pod: %v, %v; want nothing", cs.GetContainers(), err)
	}
	// Events: only its pod's.
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.GetContainerEvents(ectx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	watching(t, srv, 1)
	go func() {
		for ectx.Err() == nil {
			started(j, journalPod("other", 0))
			started(j, journalPod("mine", 0))
			select {
			case <-ectx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	for i := 0; i < 5; i++ {
		if ev := recvEvent(t, s); ev.GetContainerId() != "mine-c" {
			t.Fatalf("pod-scoped event of %s, want only mine-c", ev.GetContainerId())
		}
	}
}

// watching waits until n GetContainerEvents streams of srv watch its
// journal.
func watching(t *testing.T, srv *Server, n int32) {
	t.Helper()
	waitFor(t, "the event streams to watch the journal", func() (bool, string) {
		got := srv.watching.Load()
		return got == n, fmt.Sprintf("%d watching, want %d", got, n)
	})
}

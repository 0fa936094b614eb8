package criserve

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// The fields pleg's answers leave out or fill differently (docs/cri.md,
// "What differs"), cleared in both answers before they are compared.
func normContainer(c *runtimeapi.Container) *runtimeapi.Container {
	c = proto.Clone(c).(*runtimeapi.Container)
	c.ImageRef, c.ImageId = "", "" // the listing's image ID: pleg keeps the status's image reference
	clearUserImage(c.Image)
	return c
}

// clearUserImage clears the image as the user gave it, which pleg does
// not keep (containerd does not list it either).
func clearUserImage(i *runtimeapi.ImageSpec) {
	if i != nil {
		i.UserSpecifiedImage = ""
	}
}

func normSandbox(sb *runtimeapi.PodSandbox) *runtimeapi.PodSandbox {
	sb = proto.Clone(sb).(*runtimeapi.PodSandbox)
	sb.RuntimeHandler = ""
	return sb
}

func normContainerStatus(s *runtimeapi.ContainerStatus) *runtimeapi.ContainerStatus {
	s = proto.Clone(s).(*runtimeapi.ContainerStatus)
	s.ImageId, s.LogPath, s.Mounts, s.Resources, s.User = "", "", nil, nil, nil
	clearUserImage(s.Image)
	return s
}

func normSandboxStatus(s *runtimeapi.PodSandboxStatusResponse) *runtimeapi.PodSandboxStatusResponse {
	s = proto.Clone(s).(*runtimeapi.PodSandboxStatusResponse)
	s.Timestamp = 0
	s.Status.RuntimeHandler = ""
	if o := s.Status.GetLinux().GetNamespaces().GetOptions(); o != nil {
		o.Pid, o.Ipc = 0, 0
	}
	for i, c := range s.ContainersStatuses {
		s.ContainersStatuses[i] = normContainerStatus(c)
	}
	sortByID(s.ContainersStatuses, (*runtimeapi.ContainerStatus).GetId)
	return s
}

func equalLists[T proto.Message](t *testing.T, what string, want, got []T, norm func(T) T, id func(T) string) {
	t.Helper()
	want, got = append([]T(nil), want...), append([]T(nil), got...)
	sortByID(want, id)
	sortByID(got, id)
	if len(want) != len(got) {
		t.Errorf("%s: the runtime lists %d items, pleg %d", what, len(want), len(got))
		return
	}
	for i := range want {
		if w, g := norm(want[i]), norm(got[i]); !proto.Equal(w, g) {
			t.Errorf("%s: item %d differs:\nruntime: %s\npleg:    %s", what, i, prototext.Format(w), prototext.Format(g))
		}
	}
}

// busySim is a node with crash loops, completed jobs and recreated
// sandboxes: every state, several sandboxes per pod.
func busySim() sim.Config {
	return sim.Config{Seed: 7, Pods: 8, ContainersPerPod: 2, KeepExitedAttempts: 2}
}

// TestStateMatchesRuntime compares every state-served answer, with every
// filter, with the simulator's own, and checks that none reached the
// runtime.
func TestStateMatchesRuntime(t *testing.T) {
	r := newRig(t, busySim(), Config{})
	// Situations: an exited container, a created one, a recreated
	// sandbox (two sandboxes in one pod), a host-network pod.
	pods := r.sim.Pods()
	if len(pods) < 4 {
		t.Fatalf("want at least 4 pods, have %d", len(pods))
	}
	if err := r.sim.ExitContainer(pods[0].ContainerIDs()[0], 3); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sim.RecreateSandbox(pods[1].UID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sim.RestartContainer(pods[1].UID, pods[1].Containers[0].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sim.AddPod(sim.PodSpec{Name: "created", Containers: []string{"a"}, CreatedOnly: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sim.AddPod(sim.PodSpec{Name: "hostnet", Containers: []string{"a"}, HostNetwork: true}); err != nil {
		t.Fatal(err)
	}
	r.synced(t)
	// From here on the state is frozen: pleg no longer relists.
	r.stopGen()
	r.sim.ResetCalls()
	ctx := context.Background()

	wantC, err := r.direct.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantS, err := r.direct.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	all := wantC.GetContainers()
	sbs := wantS.GetItems()
	var multi string // a sandbox of a pod with two
	for _, sb := range sbs {
		if sb.GetMetadata().GetUid() == pods[1].UID && sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			multi = sb.GetId()
		}
	}
	if multi == "" {
		t.Fatal("the recreated pod has no old sandbox")
	}
	cfilters := []*runtimeapi.ContainerFilter{
		nil,
		{Id: all[0].GetId()},
		{Id: all[1].GetId()[:12]}, // a prefix, as crictl passes it
		{PodSandboxId: multi},
		{PodSandboxId: sbs[0].GetId()},
		{LabelSelector: map[string]string{cruntime.LabelPodUID: pods[2].UID}},
		{LabelSelector: map[string]string{cruntime.LabelPodUID: pods[2].UID, cruntime.LabelContainerName: pods[2].Containers[0].Name}},
		{LabelSelector: map[string]string{"no-such": "label"}},
		{Id: "no-such-id"},
	}
	for _, st := range []runtimeapi.ContainerState{runtimeapi.ContainerState_CONTAINER_CREATED, runtimeapi.ContainerState_CONTAINER_RUNNING,
		runtimeapi.ContainerState_CONTAINER_EXITED, runtimeapi.ContainerState_CONTAINER_UNKNOWN} {
		cfilters = append(cfilters, &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: st}})
	}
	for _, f := range cfilters {
		wf := f
		if f.GetId() == all[1].GetId()[:12] {
			// The simulator matches IDs exactly; runtimes take a unique
			// prefix, as pleg does.
			wf = &runtimeapi.ContainerFilter{Id: all[1].GetId()}
		}
		want, err := r.direct.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: wf})
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.pleg.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		equalLists(t, "ListContainers "+f.String(), want.GetContainers(), got.GetContainers(), normContainer, (*runtimeapi.Container).GetId)
		streamed := recvAll(t, func() (grpc.ServerStreamingClient[runtimeapi.StreamContainersResponse], error) {
			return r.pleg.StreamContainers(ctx, &runtimeapi.StreamContainersRequest{Filter: f})
		}, (*runtimeapi.StreamContainersResponse).GetContainers)
		equalLists(t, "StreamContainers "+f.String(), want.GetContainers(), streamed, normContainer, (*runtimeapi.Container).GetId)
	}
	sfilters := []*runtimeapi.PodSandboxFilter{
		nil,
		{Id: multi},
		{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}},
		{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}},
		{LabelSelector: map[string]string{cruntime.LabelPodUID: pods[1].UID}},
		{LabelSelector: map[string]string{"no-such": "label"}},
	}
	for _, f := range sfilters {
		want, err := r.direct.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.pleg.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		equalLists(t, "ListPodSandbox "+f.String(), want.GetItems(), got.GetItems(), normSandbox, (*runtimeapi.PodSandbox).GetId)
		streamed := recvAll(t, func() (grpc.ServerStreamingClient[runtimeapi.StreamPodSandboxesResponse], error) {
			return r.pleg.StreamPodSandboxes(ctx, &runtimeapi.StreamPodSandboxesRequest{Filter: f})
		}, (*runtimeapi.StreamPodSandboxesResponse).GetPodSandboxes)
		equalLists(t, "StreamPodSandboxes "+f.String(), want.GetItems(), streamed, normSandbox, (*runtimeapi.PodSandbox).GetId)
	}
	for _, c := range all {
		want, err := r.direct.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if w, g := normContainerStatus(want.GetStatus()), normContainerStatus(got.GetStatus()); !proto.Equal(w, g) {
			t.Errorf("ContainerStatus %s differs:\nruntime: %s\npleg:    %s", c.GetId(), prototext.Format(w), prototext.Format(g))
		}
	}
	for _, sb := range sbs {
		want, err := r.direct.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.pleg.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		// The simulator gives every container of the pod; pleg those of
		// this sandbox (a container's sandbox is the newest created
		// before it).
		want.ContainersStatuses = nil
		for _, c := range all {
			if c.GetPodSandboxId() == sb.GetId() {
				cs, err := r.direct.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
				if err != nil {
					t.Fatal(err)
				}
				want.ContainersStatuses = append(want.ContainersStatuses, cs.GetStatus())
			}
		}
		if w, g := normSandboxStatus(want), normSandboxStatus(got); !proto.Equal(w, g) {
			t.Errorf("PodSandboxStatus %s differs:\nruntime: %s\npleg:    %s", sb.GetId(), prototext.Format(w), prototext.Format(g))
		}
	}
	if _, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "no-such-id"}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus of an unknown ID: %v, want NotFound", err)
	}
	if _, err := r.pleg.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "no-such-id"}); status.Code(err) != codes.NotFound {
		t.Errorf("PodSandboxStatus of an unknown ID: %v, want NotFound", err)
	}
	st, err := r.pleg.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantSt, err := r.direct.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(st, wantSt) {
		t.Errorf("Status: pleg %v, runtime %v", st, wantSt)
	}
	// Every answer above came from pleg's state: the only runtime calls
	// are the test's own, straight to the simulator.
	direct := r.sim.Calls()
	r.sim.ResetCalls()
	for i := 0; i < 3; i++ {
		if _, err := r.pleg.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.pleg.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: all[0].GetId()}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.pleg.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sbs[0].GetId()}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.pleg.Status(ctx, &runtimeapi.StatusRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := r.sim.Calls(); len(calls) != 0 {
		t.Errorf("pleg's state-served calls reached the runtime: %v", calls)
	}
	if direct["ListContainers"] == 0 {
		t.Errorf("the comparison made no direct call (%v): it compared nothing", direct)
	}
}

// recvAll reads a streamed listing to its end.
func recvAll[M any, T any](t *testing.T, open func() (grpc.ServerStreamingClient[M], error), items func(*M) []T) []T {
	t.Helper()
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for {
		m, err := s.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("streamed listing: %v", err)
			}
			return out
		}
		out = append(out, items(m)...)
	}
}

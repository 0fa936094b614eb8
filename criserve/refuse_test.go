package criserve

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// The calls the issue names as writes: each must be refused.
var mustRefuse = []string{
	"/runtime.v1.RuntimeService/RunPodSandbox", "/runtime.v1.RuntimeService/StopPodSandbox", "/runtime.v1.RuntimeService/RemovePodSandbox",
	"/runtime.v1.RuntimeService/CreateContainer", "/runtime.v1.RuntimeService/StartContainer", "/runtime.v1.RuntimeService/StopContainer",
	"/runtime.v1.RuntimeService/RemoveContainer", "/runtime.v1.RuntimeService/Exec", "/runtime.v1.RuntimeService/ExecSync",
	"/runtime.v1.RuntimeService/Attach", "/runtime.v1.RuntimeService/PortForward", "/runtime.v1.RuntimeService/UpdateContainerResources",
	"/runtime.v1.RuntimeService/ReopenContainerLog", "/runtime.v1.RuntimeService/UpdateRuntimeConfig",
	"/runtime.v1.RuntimeService/CheckpointContainer", "/runtime.v1.ImageService/PullImage", "/runtime.v1.ImageService/RemoveImage",
}

// TestMethodsClassified: every method of both generated services is
// classified, the writes refused, and what is served exists.
func TestMethodsClassified(t *testing.T) {
	m := Methods()
	for _, name := range mustRefuse {
		if m[name] != Refused {
			t.Errorf("%s is %q, want refused", name, m[name])
		}
	}
	for name := range runtimeMethods {
		if _, ok := m["/runtime.v1.RuntimeService/"+name]; !ok {
			t.Errorf("runtimeMethods lists %s, which RuntimeService has not", name)
		}
	}
	for name := range imageMethods {
		if _, ok := m["/runtime.v1.ImageService/"+name]; !ok {
			t.Errorf("imageMethods lists %s, which ImageService has not", name)
		}
	}
	n := len(runtimeapi.RuntimeService_ServiceDesc.Methods) + len(runtimeapi.RuntimeService_ServiceDesc.Streams) +
		len(runtimeapi.ImageService_ServiceDesc.Methods) + len(runtimeapi.ImageService_ServiceDesc.Streams)
	if len(m) != n {
		t.Errorf("Methods has %d methods, the services %d", len(m), n)
	}
}

// TestRefusedNeverReachRuntime calls every refused method, found from the
// generated services, through pleg: each answers PermissionDenied naming
// the method and the flag, and the runtime sees no call and does not
// change.
func TestRefusedNeverReachRuntime(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, sim.Config{Seed: 3, Pods: 3, ContainersPerPod: 1}, Config{Flag: "--cri-socket", Metrics: m})
	r.synced(t)
	r.stopGen()
	before := states(listAll(t, r))
	r.sim.ResetCalls()
	ctx := context.Background()
	methods := Methods()
	names := slices.Sorted(maps.Keys(methods))
	refused := 0
	for _, name := range names {
		if methods[name] != Refused {
			continue
		}
		refused++
		var err error
		if isStream(name) {
			var s grpc.ClientStream
			s, err = r.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, name)
			if err == nil {
				if err = s.SendMsg(&runtimeapi.VersionRequest{}); err == nil {
					_ = s.CloseSend()
					err = s.RecvMsg(&runtimeapi.VersionResponse{})
				}
			}
		} else {
			err = r.conn.Invoke(ctx, name, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{})
		}
		st, _ := status.FromError(err)
		method := name[strings.LastIndexByte(name, '/')+1:]
		if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), method) || !strings.Contains(st.Message(), "--cri-socket") {
			t.Errorf("%s: %v, want PermissionDenied naming the method and --cri-socket", name, err)
		}
	}
	if refused < len(mustRefuse) {
		t.Errorf("refused %d methods, want at least %d", refused, len(mustRefuse))
	}
	// The typed client too, with real requests.
	pods := r.sim.Pods()
	_, err = r.pleg.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "evil", Namespace: "default", Uid: "evil-uid"}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("RunPodSandbox: %v, want PermissionDenied", err)
	}
	if _, err := r.pleg.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pods[0].SandboxID()}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("RemovePodSandbox: %v, want PermissionDenied", err)
	}
	if _, err := r.pleg.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: pods[0].ContainerIDs()[0]}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("StopContainer: %v, want PermissionDenied", err)
	}
	if _, err := r.pleg.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: pods[0].ContainerIDs()[0], Cmd: []string{"id"}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ExecSync: %v, want PermissionDenied", err)
	}
	if calls := r.sim.Calls(); len(calls) != 0 {
		t.Errorf("refused calls reached the runtime: %v", calls)
	}
	if after := states(listAll(t, r)); after != before {
		t.Errorf("the runtime changed:\nbefore %s\nafter  %s", before, after)
	}
	if n := testutil.ToFloat64(m.calls.WithLabelValues("--cri-socket", "RunPodSandbox", "refused")); n != 2 {
		t.Errorf("pleg_cri_requests_total{method=RunPodSandbox,served=refused} = %v, want 2", n)
	}
	if n := testutil.ToFloat64(m.calls.WithLabelValues("--cri-socket", "Attach", "refused")); n != 1 {
		t.Errorf("pleg_cri_requests_total{method=Attach,served=refused} = %v, want 1", n)
	}
	if n := testutil.CollectAndCount(m.runtime); n != 0 {
		t.Errorf("pleg_cri_runtime_calls_total has %d series, want none", n)
	}
}

func isStream(fullName string) bool {
	for _, d := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, s := range d.Streams {
			if "/"+d.ServiceName+"/"+s.StreamName == fullName {
				return true
			}
		}
	}
	return false
}

func listAll(t *testing.T, r *rig) ([]*runtimeapi.Container, []*runtimeapi.PodSandbox) {
	t.Helper()
	c, err := r.direct.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.direct.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return c.GetContainers(), s.GetItems()
}

// TestNewMethodRefused: a method the generated service gains later, which
// no list here names, is refused, not served by accident.
func TestNewMethodRefused(t *testing.T) {
	desc := runtimeapi.RuntimeService_ServiceDesc
	desc.Methods = append(slices.Clone(desc.Methods), grpc.MethodDesc{MethodName: "DeleteEverything",
		Handler: func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
			t.Error("the new method's own handler ran")
			return nil, nil
		}})
	desc.Streams = append(slices.Clone(desc.Streams), grpc.StreamDesc{StreamName: "AttachEverything", ServerStreams: true,
		Handler: func(any, grpc.ServerStream) error {
			t.Error("the new stream's own handler ran")
			return nil
		}})
	g := guarded(desc, runtimeMethods, "--cri-socket", logr.Discard())
	var h func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error)
	for _, m := range g.Methods {
		if m.MethodName == "DeleteEverything" {
			h = m.Handler
		}
	}
	_, err := h(nil, context.Background(), func(any) error { return nil }, nil)
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "DeleteEverything") {
		t.Errorf("a new method: %v, want PermissionDenied naming it", err)
	}
	for _, s := range g.Streams {
		if s.StreamName == "AttachEverything" {
			if err := s.Handler(nil, fakeStream{}); status.Code(err) != codes.PermissionDenied {
				t.Errorf("a new stream: %v, want PermissionDenied", err)
			}
		}
	}
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

// TestPassThroughBounded: verbose statuses and images reach the runtime;
// a verbose status is kept while pleg's state of its item is unchanged,
// and callers asking for it at once share one runtime call; beyond the
// concurrency limit a call waits (within its deadline) without reaching
// the runtime.
func TestPassThroughBounded(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, sim.Config{Seed: 5, Pods: 4, ContainersPerPod: 1}, Config{MaxInFlight: 1, Rate: 1000, Burst: 1000, Metrics: m})
	r.synced(t)
	r.stopGen()
	ctx := context.Background()
	pods := r.sim.Pods()
	id := pods[0].ContainerIDs()[0]
	r.sim.ResetCalls()
	for range 3 {
		v, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		if v.GetInfo()["info"] == "" {
			t.Errorf("verbose ContainerStatus has no info: %v", v)
		}
		if _, err := r.pleg.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pods[0].SandboxID(), Verbose: true}); err != nil {
			t.Fatal(err)
		}
	}
	imgs, err := r.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantImgs, err := runtimeapi.NewImageServiceClient(dialCRI(t, r.sim.Endpoint())).ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs.GetImages()) == 0 || !proto.Equal(imgs, wantImgs) {
		t.Errorf("ListImages through pleg %v, straight %v", imgs, wantImgs)
	}
	ver, err := r.pleg.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ver.GetRuntimeName() != sim.RuntimeName+RuntimeNameSuffix || ver.GetRuntimeVersion() != sim.RuntimeVersion {
		t.Errorf("Version: %v", ver)
	}
	if _, err := r.pleg.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(m.runtime.WithLabelValues("--cri-socket", "ContainerStatus")); n != 1 {
		t.Errorf("pleg_cri_runtime_calls_total{method=ContainerStatus} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.calls.WithLabelValues("--cri-socket", "ContainerStatus", "state")); n != 3 {
		t.Errorf("pleg_cri_requests_total{method=ContainerStatus} = %v, want 3", n)
	}
	calls := r.sim.Calls()
	if calls["ContainerStatus"] != 1 || calls["PodSandboxStatus"] != 1 || calls["Version"] != 1 || calls["ListImages"] != 2 {
		t.Errorf("runtime calls %v, want one verbose ContainerStatus and one PodSandboxStatus (the others kept), one Version (the second cached), two ListImages (pleg's and the test's)", calls)
	}

	// Callers asking at once share one runtime call.
	r.sim.SetHung(pods[1].UID, true)
	r.sim.ResetCalls()
	shared := pods[1].ContainerIDs()[0]
	const callers = 20
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: shared, Verbose: true})
			errs <- err
		}()
	}
	waitFor(t, "the first verbose status to reach the runtime", func() (bool, string) {
		return r.sim.Calls()["ContainerStatus"] == 1, fmt.Sprint(r.sim.Calls())
	})
	// Concurrency: that call holds the only slot; another item's call
	// waits for it until its deadline, and never reaches the runtime.
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = r.pleg.ContainerStatus(dctx, &runtimeapi.ContainerStatusRequest{ContainerId: pods[2].ContainerIDs()[0], Verbose: true})
	cancel()
	if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.ResourceExhausted {
		t.Errorf("a call beyond the concurrency limit: %v, want it to wait out its deadline", err)
	}
	r.sim.SetHung(pods[1].UID, false)
	for range callers {
		if err := <-errs; err != nil {
			t.Errorf("a caller of the shared verbose status: %v", err)
		}
	}
	if n := r.sim.Calls()["ContainerStatus"]; n != 1 {
		t.Errorf("the runtime had %d ContainerStatus calls for %d callers and one waiting in pleg, want 1", n, callers)
	}
}

// TestVerboseNotFoundShared: the verbose status of a container the
// runtime removed after pleg listed it reaches the runtime once: its
// NotFound is kept for the callers after (an agent each, asking on the
// container's event), where another error is not.
func TestVerboseNotFoundShared(t *testing.T) {
	r := newRig(t, sim.Config{Seed: 5, Pods: 2, ContainersPerPod: 1}, Config{})
	r.synced(t)
	r.stopGen() // pleg's state keeps the container the runtime removes
	ctx := context.Background()
	gone, other := r.sim.Pods()[0].ContainerIDs()[0], r.sim.Pods()[1]
	if err := r.sim.RemoveContainer(gone); err != nil {
		t.Fatal(err)
	}
	r.sim.ResetCalls()
	for range 3 {
		_, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: gone, Verbose: true})
		if status.Code(err) != codes.NotFound {
			t.Errorf("verbose ContainerStatus of a removed container: %v, want NotFound", err)
		}
	}
	if n := r.sim.Calls()["ContainerStatus"]; n != 1 {
		t.Errorf("the runtime had %d ContainerStatus calls for 3 callers of a removed container, want 1", n)
	}
	// A call that failed otherwise (the runtime's error) is asked again.
	r.sim.SetErrorRate(1)
	for range 2 {
		_, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: other.ContainerIDs()[0], Verbose: true})
		if c := status.Code(err); c != codes.Unavailable && c != codes.Internal {
			t.Errorf("verbose ContainerStatus with the runtime failing: %v, want its error", err)
		}
	}
	r.sim.SetErrorRate(0)
	if n := r.sim.Calls()["ContainerStatus"]; n != 3 {
		t.Errorf("the runtime had %d ContainerStatus calls, want 3: the removed container's once, the other's for each caller", n)
	}
}

// TestRateRefusesAtOnce: past the burst, a call whose token would come
// after its timeout is refused at once and never reaches the runtime.
func TestRateRefusesAtOnce(t *testing.T) {
	r := newRig(t, sim.Config{Seed: 5, Pods: 2, ContainersPerPod: 1}, Config{Rate: 0.001, Burst: 1, Timeout: time.Minute})
	r.synced(t)
	r.stopGen()
	ctx := context.Background()
	id := r.sim.Pods()[0].ContainerIDs()[0]
	r.sim.ResetCalls()
	if _, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true}); err != nil {
		t.Fatal(err)
	}
	_, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: r.sim.Pods()[1].ContainerIDs()[0], Verbose: true})
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "ContainerStatus") {
		t.Errorf("a call past the rate: %v, want ResourceExhausted naming it", err)
	}
	if n := r.sim.Calls()["ContainerStatus"]; n != 1 {
		t.Errorf("the runtime had %d ContainerStatus calls, want 1", n)
	}
	// Calls from state are not rate-limited.
	for i := 0; i < 5; i++ {
		if _, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
	}
}

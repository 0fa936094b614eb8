package cri

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

// statusServer answers status calls from maps; missing IDs are NotFound,
// and IDs in fail fail with codes.Internal.
func statusServer(f *fakeCRI, sandboxes map[string]*runtimeapi.PodSandboxStatus, containers map[string]*runtimeapi.ContainerStatus, fail map[string]bool) {
	f.sandboxStatus = func(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
		if fail[r.PodSandboxId] {
			return nil, status.Error(codes.Internal, "sandbox store broken")
		}
		s, ok := sandboxes[r.PodSandboxId]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "sandbox %q not found", r.PodSandboxId)
		}
		return &runtimeapi.PodSandboxStatusResponse{Status: s}, nil
	}
	f.containerStatus = func(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
		if fail[r.ContainerId] {
			return nil, status.Error(codes.Internal, "container store broken")
		}
		s, ok := containers[r.ContainerId]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "container %q not found", r.ContainerId)
		}
		return &runtimeapi.ContainerStatusResponse{Status: s}, nil
	}
}

func sandboxStatus(id string, st runtimeapi.PodSandboxState, created int64, ip string, more ...string) *runtimeapi.PodSandboxStatus {
	s := &runtimeapi.PodSandboxStatus{
		Id:        id,
		Metadata:  &runtimeapi.PodSandboxMetadata{Name: "pod", Uid: "uid", Namespace: "ns", Attempt: 1},
		State:     st,
		CreatedAt: created,
		Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: ip},
	}
	for _, m := range more {
		s.Network.AdditionalIps = append(s.Network.AdditionalIps, &runtimeapi.PodIP{Ip: m})
	}
	return s
}

func testPod() *cruntime.Pod {
	return &cruntime.Pod{
		UID: "uid", Name: "pod", Namespace: "ns",
		Sandboxes:  []*cruntime.Container{{ID: "sb-old"}, {ID: "sb-new"}, {ID: "sb-gone"}},
		Containers: []*cruntime.Container{{ID: "c1", Name: "listed-c1"}, {ID: "c-gone"}, {ID: "c2", Name: "listed-c2"}},
	}
}

func TestPodStatus(t *testing.T) {
	const sec = int64(time.Second)
	newest := sandboxStatus("sb-new", runtimeapi.PodSandboxState_SANDBOX_READY, 200*sec, "10.0.0.2", "", "fd00::2")
	newest.Linux = &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
		Options: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
	}}
	f := &fakeCRI{}
	statusServer(f,
		map[string]*runtimeapi.PodSandboxStatus{
			"sb-old": sandboxStatus("sb-old", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, 100*sec, "10.0.0.1"),
			"sb-new": newest,
		},
		map[string]*runtimeapi.ContainerStatus{
			"c1": {
				Id:         "c1",
				Metadata:   &runtimeapi.ContainerMetadata{Name: "app", Attempt: 3},
				State:      runtimeapi.ContainerState_CONTAINER_EXITED,
				CreatedAt:  210*sec + 5,
				StartedAt:  211 * sec,
				FinishedAt: 212 * sec,
				ExitCode:   137,
				Image:      &runtimeapi.ImageSpec{Image: "nginx:1"},
				ImageRef:   "docker.io/library/nginx@sha256:abc",
				Reason:     "OOMKilled",
				Message:    "out of memory",
			},
			// Nil metadata, labels and image, zero times: the listing
			// names it.
			"c2": {
				Id:        "c2",
				State:     runtimeapi.ContainerState_CONTAINER_CREATED,
				CreatedAt: 220 * sec,
			},
		}, nil)
	c := f.start(t)

	ps, err := c.PodStatus(context.Background(), testPod())

	if err != nil {
		t.Fatal(err)
	}
	want := &cruntime.PodStatus{
		UID: "uid", Name: "pod", Namespace: "ns",
		IPs: []string{"10.0.0.2", "fd00::2"},
		SandboxStatuses: []*cruntime.SandboxStatus{
			{ID: "sb-new", State: cruntime.StateRunning, CreatedAt: time.Unix(200, 0), Attempt: 1,
				IPs: []string{"10.0.0.2", "fd00::2"}, HostNetwork: true},
			{ID: "sb-old", State: cruntime.StateExited, CreatedAt: time.Unix(100, 0), Attempt: 1,
				IPs: []string{"10.0.0.1"}},
		},
		ContainerStatuses: []*cruntime.ContainerStatus{
			{ID: "c2", Name: "listed-c2", State: cruntime.StateCreated, CreatedAt: time.Unix(220, 0)},
			{ID: "c1", Name: "app", Attempt: 3, State: cruntime.StateExited, Image: "nginx:1",
				ImageRef: "docker.io/library/nginx@sha256:abc", CreatedAt: time.Unix(210, 5),
				StartedAt: time.Unix(211, 0), FinishedAt: time.Unix(212, 0), ExitCode: 137,
				Reason: "OOMKilled", Message: "out of memory"},
		},
	}
	if !reflect.DeepEqual(ps, want) {
		t.Errorf("PodStatus:\n got %s\nwant %s", dumpStatus(ps), dumpStatus(want))
	}
	if !ps.ContainerStatuses[0].StartedAt.IsZero() || !ps.ContainerStatuses[0].FinishedAt.IsZero() {
		t.Errorf("zero CRI timestamps should map to the zero time.Time")
	}

	_, _, sIDs, cIDs := f.recorded()
	sort.Strings(sIDs)
	sort.Strings(cIDs)
	if !reflect.DeepEqual(sIDs, []string{"sb-gone", "sb-new", "sb-old"}) || !reflect.DeepEqual(cIDs, []string{"c-gone", "c1", "c2"}) {
		t.Errorf("status calls: sandboxes %v, containers %v", sIDs, cIDs)
	}
	if sl, cl, _, _ := f.recorded(); len(sl)+len(cl) != 0 {
		t.Errorf("PodStatus made list calls")
	}
}

func dumpStatus(ps *cruntime.PodStatus) string {
	if ps == nil {
		return "nil"
	}
	s := sprint(*ps)
	for _, sb := range ps.SandboxStatuses {
		s += "\n  sandbox " + sprint(*sb)
	}
	for _, c := range ps.ContainerStatuses {
		s += "\n  container " + sprint(*c)
	}
	return s
}

func TestPodStatusIPsOnlyFromReadyNewest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sandboxes map[string]*runtimeapi.PodSandboxStatus
		want      []string
	}{
		{
			name: "newest not ready, older ready",
			sandboxes: map[string]*runtimeapi.PodSandboxStatus{
				"sb-old": sandboxStatus("sb-old", runtimeapi.PodSandboxState_SANDBOX_READY, 100, "10.0.0.1"),
				"sb-new": sandboxStatus("sb-new", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, 200, "10.0.0.2"),
			},
		},
		{
			name: "newest ready without network",
			sandboxes: map[string]*runtimeapi.PodSandboxStatus{
				"sb-old": sandboxStatus("sb-old", runtimeapi.PodSandboxState_SANDBOX_READY, 100, "10.0.0.1"),
				"sb-new": {Id: "sb-new", State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: 200},
			},
		},
		{
			name: "newest ready",
			sandboxes: map[string]*runtimeapi.PodSandboxStatus{
				"sb-old": sandboxStatus("sb-old", runtimeapi.PodSandboxState_SANDBOX_READY, 100, "10.0.0.1"),
				"sb-new": sandboxStatus("sb-new", runtimeapi.PodSandboxState_SANDBOX_READY, 200, "", "10.0.0.3"),
			},
			want: []string{"10.0.0.3"},
		},
		{name: "no sandbox left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCRI{}
			statusServer(f, tc.sandboxes, nil, nil)
			c := f.start(t)
			pod := testPod()
			pod.Containers = nil
			ps, err := c.PodStatus(context.Background(), pod)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ps.IPs, tc.want) {
				t.Errorf("IPs = %v, want %v", ps.IPs, tc.want)
			}
			if len(ps.SandboxStatuses) != len(tc.sandboxes) {
				t.Errorf("%d sandbox statuses, want %d", len(ps.SandboxStatuses), len(tc.sandboxes))
			}
			for _, s := range ps.SandboxStatuses {
				if s.HostNetwork {
					t.Errorf("sandbox %s: HostNetwork without NODE network namespace", s.ID)
				}
			}
		})
	}
}

func TestPodStatusErrors(t *testing.T) {
	for _, tc := range []struct {
		name, failID, wantMsg string
	}{
		{"container", "abc123", `ContainerStatus "abc123": rpc error: code = Internal desc = container store broken`},
		{"sandbox", "sb-new", `PodSandboxStatus "sb-new": rpc error: code = Internal desc = sandbox store broken`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCRI{}
			statusServer(f,
				map[string]*runtimeapi.PodSandboxStatus{"sb-new": sandboxStatus("sb-new", 0, 1, "10.0.0.1")},
				map[string]*runtimeapi.ContainerStatus{"abc123": {Id: "abc123"}},
				map[string]bool{tc.failID: true})
			m := metrics.New(nil)
			c := f.start(t, WithMetrics(m))
			pod := &cruntime.Pod{UID: "uid", Sandboxes: []*cruntime.Container{{ID: "sb-new"}},
				Containers: []*cruntime.Container{{ID: "gone"}, {ID: "abc123"}}}
			ps, err := c.PodStatus(context.Background(), pod)
			if ps != nil {
				t.Errorf("PodStatus returned a status with its error: %s", dumpStatus(ps))
			}
			if err == nil || err.Error() != tc.wantMsg {
				t.Fatalf("PodStatus error = %v\nwant %s", err, tc.wantMsg)
			}
			if status.Code(err) != codes.Internal {
				t.Errorf("status.Code(err) = %v, want Internal", status.Code(err))
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Errorf("an Internal error matches a context error")
			}
			op := metrics.OpContainerStatus
			if tc.name == "sandbox" {
				op = metrics.OpPodSandboxStatus
			}
			if got := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(op)); got < 1 {
				t.Errorf("%s errors = %v, want >= 1", op, got)
			}
		})
	}
}

func TestPodStatusNilPod(t *testing.T) {
	c := (&fakeCRI{}).start(t)
	if _, err := c.PodStatus(context.Background(), nil); err == nil {
		t.Error("PodStatus(nil) succeeded")
	}
	ps, err := c.PodStatus(context.Background(), &cruntime.Pod{UID: "u", Name: "n", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if ps.UID != "u" || ps.Name != "n" || ps.Namespace != "ns" || ps.IPs != nil || ps.SandboxStatuses != nil || ps.ContainerStatuses != nil {
		t.Errorf("PodStatus(empty pod) = %s", dumpStatus(ps))
	}
}

func TestPodStatusNilStatusInResponse(t *testing.T) {
	f := &fakeCRI{
		sandboxStatus: func(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
			return &runtimeapi.PodSandboxStatusResponse{}, nil
		},
		containerStatus: func(context.Context, *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			return &runtimeapi.ContainerStatusResponse{}, nil
		},
	}
	c := f.start(t)
	ps, err := c.PodStatus(context.Background(), testPod())
	if err != nil {
		t.Fatal(err)
	}
	if len(ps.SandboxStatuses)+len(ps.ContainerStatuses) != 0 {
		t.Errorf("PodStatus = %s; want no statuses", dumpStatus(ps))
	}
}

func TestStatusConditions(t *testing.T) {
	f := &fakeCRI{
		status: func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
			return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
				{Type: cruntime.RuntimeReady, Status: true},
				{Type: cruntime.NetworkReady, Status: false, Reason: "NetworkPluginNotReady", Message: "cni plugin not initialized"},
			}}}, nil
		},
	}
	m := metrics.New(nil)
	c := f.start(t, WithMetrics(m))
	conds, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []cruntime.Condition{
		{Type: "RuntimeReady", Status: true},
		{Type: "NetworkReady", Status: false, Reason: "NetworkPluginNotReady", Message: "cni plugin not initialized"},
	}
	if !reflect.DeepEqual(conds, want) {
		t.Errorf("Status = %+v, want %+v", conds, want)
	}
	if got := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(metrics.OpStatus)); got != 1 {
		t.Errorf("status operations = %v, want 1", got)
	}
}

func TestStatusErrors(t *testing.T) {
	f := &fakeCRI{
		status: func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
			return &runtimeapi.StatusResponse{}, nil
		},
	}
	c := f.start(t)
	if _, err := c.Status(context.Background()); !errors.Is(err, cruntime.ErrMalformed) || !contains(err.Error(), "no status") {
		t.Errorf("Status with an empty response: err = %v", err)
	}

	m := metrics.New(nil)
	c = (&fakeCRI{}).start(t, WithMetrics(m))
	_, err := c.Status(context.Background())
	if status.Code(err) != codes.Unimplemented || !contains(err.Error(), "Status: rpc error") {
		t.Errorf("Status against a runtime without it: err = %v", err)
	}
	if got := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpStatus)); got != 1 {
		t.Errorf("status errors = %v, want 1", got)
	}
}

// With a status concurrency of 1, a pod's calls are made one after another,
// sandboxes first, in listing order, as the kubelet does.
func TestPodStatusSerialOrder(t *testing.T) {
	f := &fakeCRI{}
	f.sandboxStatus = func(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
		return nil, status.Error(codes.NotFound, "gone")
	}
	f.containerStatus = func(context.Context, *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
		return nil, status.Error(codes.NotFound, "gone")
	}
	c := f.start(t, WithStatusConcurrency(1))
	_, _ = c.PodStatus(context.Background(), &cruntime.Pod{UID: "u",
		Sandboxes:  []*cruntime.Container{{ID: "s1"}, {ID: "s2"}},
		Containers: []*cruntime.Container{{ID: "c1"}, {ID: "c2"}, {ID: "c3"}}})
	_, _, sIDs, cIDs := f.recorded()
	if !reflect.DeepEqual(sIDs, []string{"s1", "s2"}) || !reflect.DeepEqual(cIDs, []string{"c1", "c2", "c3"}) {
		t.Fatalf("calls %v %v", sIDs, cIDs)
	}
}

// Concurrent calls stop at the first real error: the calls still out are
// cancelled and PodStatus returns that error.
func TestPodStatusConcurrentError(t *testing.T) {
	f := &fakeCRI{}
	f.containerStatus = func(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
		if r.ContainerId == "bad" {
			return nil, status.Error(codes.Internal, "boom")
		}
		<-ctx.Done() // the others hang until cancelled
		return nil, ctx.Err()
	}
	c := f.start(t, WithStatusConcurrency(4), WithTimeout(time.Minute))
	start := time.Now()
	_, err := c.PodStatus(context.Background(), &cruntime.Pod{UID: "u",
		Containers: []*cruntime.Container{{ID: "slow1"}, {ID: "bad"}, {ID: "slow2"}}})
	if status.Code(errors.Unwrap(err)) != codes.Internal || !strings.Contains(err.Error(), `ContainerStatus "bad"`) {
		t.Fatalf("err %v", err)
	}
	// Cancelled at once; left alone they would hang for the minute of the
	// client's timeout.
	if time.Since(start) > 30*time.Second {
		t.Fatal("the hung calls were not cancelled")
	}
}

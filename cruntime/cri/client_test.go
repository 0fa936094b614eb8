package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestDialEndpoints(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		path     string // "" means an error is expected
	}{
		{"unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock"},
		{"unix:///run/crio/crio.sock", "/run/crio/crio.sock"},
		{"unix:///run/k3s/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock"},
		{"unix:/run/x.sock", "/run/x.sock"},
		{"/run/x.sock", "/run/x.sock"},
		{"unix:///run//x/../x.sock", "/run/x.sock"},
		{"passthrough:///unix:///run/x.sock", "/run/x.sock"},
		{"passthrough:////run/x.sock", "/run/x.sock"},

		{"", ""},
		{"tcp://127.0.0.1:1234", ""},
		{"http://localhost/x.sock", ""},
		{"npipe:////./pipe/containerd", ""},
		{"run/x.sock", ""},
		{"x.sock", ""},
		{"unix://", ""},
		{"unix://run/x.sock", ""},
		{"unix:run/x.sock", ""},
		{"passthrough:///", ""},
		{"passthrough:///run/x.sock", ""},
		{"passthrough:///tcp://1.2.3.4:5", ""},
	} {
		c, err := Dial(tc.endpoint)
		if tc.path == "" {
			if err == nil {
				c.Close()
				t.Errorf("Dial(%q) succeeded; want an error", tc.endpoint)
				continue
			}
			if !contains(err.Error(), "runtime endpoint") || (tc.endpoint != "" && !contains(err.Error(), `"`+tc.endpoint+`"`)) {
				t.Errorf("Dial(%q) error %q does not name the endpoint", tc.endpoint, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Dial(%q): %v", tc.endpoint, err)
			continue
		}
		if c.path != tc.path || c.Endpoint() != tc.endpoint {
			t.Errorf("Dial(%q): path %q, Endpoint() %q; want %q, %q", tc.endpoint, c.path, c.Endpoint(), tc.path, tc.endpoint)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestVersion(t *testing.T) {
	var got *runtimeapi.VersionRequest
	f := &fakeCRI{version: func(_ context.Context, r *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
		got = r
		return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "containerd", RuntimeVersion: "v2.1.0", RuntimeApiVersion: "v1"}, nil
	}}
	m := metrics.New(nil)
	c := f.start(t, WithMetrics(m))
	name, version, err := c.Version(context.Background())
	if err != nil || name != "containerd" || version != "v2.1.0" {
		t.Errorf("Version = %q, %q, %v", name, version, err)
	}
	if got == nil || got.Version == "" {
		t.Errorf("Version request = %v; want the client's API version", got)
	}
	if n := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(metrics.OpVersion)); n != 1 {
		t.Errorf("version operations = %v, want 1", n)
	}
}

func TestVersionUnimplemented(t *testing.T) {
	c := (&fakeCRI{}).start(t)
	_, _, err := c.Version(context.Background())
	if err == nil || !contains(err.Error(), "does not serve the CRI v1 runtime service") || !contains(err.Error(), c.Endpoint()) {
		t.Errorf("Version error = %v", err)
	}
}

func TestVersionNoSocket(t *testing.T) {
	endpoint := "unix://" + filepath.Join(socketDir(t), "missing.sock")
	m := metrics.New(nil)
	// A failure that waited for the timeout (the kubelet's 2m) instead of
	// failing at once is told apart by a bound any machine keeps.
	c, err := Dial(endpoint, WithTimeout(2*time.Minute), WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, _, err = c.Version(context.Background())
	if err == nil {
		t.Fatal("Version succeeded without a runtime")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Version took %v to fail; want a fast failure", d)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "connect to runtime at "+endpoint+": ") || !contains(msg, "no such file or directory") {
		t.Errorf("Version error = %q; want it to name %s and say no such file or directory", msg, endpoint)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("status.Code = %v, want Unavailable", status.Code(err))
	}
	// The typed error says why, without gRPC's wrapping.
	var ce *CallError
	var oe *net.OpError
	if !errors.As(err, &ce) || ce.Method != "Version" || ce.Endpoint != endpoint || ce.Code != codes.Unavailable {
		t.Errorf("error %#v is not a CallError for Version at %s", err, endpoint)
	} else if !errors.As(ce.Unreachable, &oe) || !errors.Is(ce.Unreachable, syscall.ENOENT) {
		t.Errorf("Unreachable = %v, want the dial's *net.OpError with ENOENT", ce.Unreachable)
	} else if got, want := Cause(err), "dial unix "+filepath.Join(strings.TrimPrefix(endpoint, "unix://"))+": connect: no such file or directory"; got != want {
		t.Errorf("Cause = %q, want %q", got, want)
	}
	if n := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpVersion)); n != 1 {
		t.Errorf("version errors = %v, want 1", n)
	}
}

func TestTimeout(t *testing.T) {
	f := &fakeCRI{
		listSandboxes: func(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
			<-ctx.Done() // stuck until the client gives up
			return nil, ctx.Err()
		},
	}
	m := metrics.New(nil)
	c := f.start(t, WithTimeout(100*time.Millisecond), WithMetrics(m))

	// Without the client's timeout the stuck call would end only with
	// this backstop, a minute later.
	backstop, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	start := time.Now()
	_, err := c.ListPods(backstop)
	d := time.Since(start)
	if err == nil {
		t.Fatal("ListPods succeeded against a stuck runtime")
	}
	// Not before the timeout; after it, as soon as a busy machine gets to
	// it, long before the backstop.
	if d < 90*time.Millisecond || d > 30*time.Second {
		t.Errorf("ListPods failed after %v; want about 100ms", d)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("status.Code(%v) = %v, want DeadlineExceeded", err, status.Code(err))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, context.DeadlineExceeded) = false", err)
	}
	if !strings.HasPrefix(err.Error(), "ListPodSandbox: ") {
		t.Errorf("error %q does not name the call", err)
	}
	if n := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(metrics.OpListPodSandbox)); n != 1 {
		t.Errorf("list_podsandbox errors = %v, want 1", n)
	}

	// The caller's context still bounds the call. (Against a client whose
	// own timeout is far away: with the 100ms one, a cancellation that a
	// busy machine runs late could lose the race to it.)
	long, err := Dial(c.Endpoint(), WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = long.ListPods(ctx)
	if !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled {
		t.Errorf("ListPods with a cancelled context: err = %v; want Canceled", err)
	}
}

func TestNoTimeout(t *testing.T) {
	f := &fakeCRI{
		listSandboxes: func(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
			if _, ok := ctx.Deadline(); ok {
				return nil, status.Error(codes.InvalidArgument, "unexpected deadline")
			}
			return &runtimeapi.ListPodSandboxResponse{}, nil
		},
		listContainers: func(ctx context.Context, _ *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return &runtimeapi.ListContainersResponse{}, nil
		},
	}
	c := f.start(t, WithTimeout(0))
	if _, err := c.ListPods(context.Background()); err != nil {
		t.Errorf("ListPods without timeout: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	f := &fakeCRI{}
	staticLister(f,
		[]*runtimeapi.PodSandbox{sandbox("sb", "uid", "pod", "ns", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1)},
		[]*runtimeapi.Container{container("c1", "app", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 2, label("uid", "pod", "ns", "app"))})
	statusServer(f,
		map[string]*runtimeapi.PodSandboxStatus{"sb": sandboxStatus("sb", 0, 1, "10.0.0.1")},
		map[string]*runtimeapi.ContainerStatus{"c1": {Id: "c1"}}, nil)
	m := metrics.New(nil)
	c := f.start(t, WithMetrics(m))
	ctx := context.Background()

	if _, err := c.ListPods(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListPods(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListPod(ctx, "uid"); err != nil {
		t.Fatal(err)
	}
	pod := &cruntime.Pod{UID: "uid", Sandboxes: []*cruntime.Container{{ID: "sb"}},
		Containers: []*cruntime.Container{{ID: "c1"}, {ID: "c-gone"}}}
	if _, err := c.PodStatus(ctx, pod); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		op           string
		total, error float64
	}{
		{metrics.OpListPodSandbox, 3, 0},
		{metrics.OpListContainers, 3, 0},
		{metrics.OpPodSandboxStatus, 1, 0},
		// NotFound counts as an error, as in the kubelet.
		{metrics.OpContainerStatus, 2, 1},
		{metrics.OpStatus, 0, 0},
	} {
		if got := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(tc.op)); got != tc.total {
			t.Errorf("%s operations = %v, want %v", tc.op, got, tc.total)
		}
		if got := testutil.ToFloat64(m.RuntimeOperationErrors.WithLabelValues(tc.op)); got != tc.error {
			t.Errorf("%s errors = %v, want %v", tc.op, got, tc.error)
		}
	}
	// One duration series per operation type called.
	if n := testutil.CollectAndCount(m.RuntimeOperationDuration); n != 4 {
		t.Errorf("%d duration series, want 4", n)
	}
}

func TestCallTracer(t *testing.T) {
	f := &fakeCRI{}
	staticLister(f,
		[]*runtimeapi.PodSandbox{sandbox("sb", "uid", "pod", "ns", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1)},
		nil)
	statusServer(f,
		map[string]*runtimeapi.PodSandboxStatus{"sb": sandboxStatus("sb", 0, 1, "10.0.0.1")},
		map[string]*runtimeapi.ContainerStatus{"c1": {Id: "c1"}}, nil)
	f.status = func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
		return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}, nil
	}
	c := f.start(t)
	tr := &recordingTracer{}
	ctx := cruntime.WithCallTracer(context.Background(), tr)

	if _, err := c.ListPods(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PodStatus(ctx, &cruntime.Pod{UID: "uid", Sandboxes: []*cruntime.Container{{ID: "sb"}},
		Containers: []*cruntime.Container{{ID: "c1"}, {ID: "c-gone"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, _ = c.Version(ctx) // Unimplemented

	want := []string{
		"list_podsandbox ",
		"list_containers ",
		"podsandbox_status sb",
		"container_status c1",
		"container_status c-gone (error)",
		"status ",
		"version  (error)",
	}
	got := tr.summary()
	// A pod's status calls run concurrently: their order is free.
	if len(got) == len(want) {
		sort.Strings(got[2:5])
		sort.Strings(want[2:5])
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("traced calls:\n got %q\nwant %q", got, want)
	}

	// No tracer, no trouble.
	if _, err := c.ListPods(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(tr.summary()); n != len(want) {
		t.Errorf("calls without the tracer's context were traced")
	}
}

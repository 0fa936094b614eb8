package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRI is an in-process CRI runtime service. Each method calls its hook
// when set and answers Unimplemented otherwise. Set hooks before start.
// Requests are recorded.
type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	version         func(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error)
	listSandboxes   func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error)
	listContainers  func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error)
	sandboxStatus   func(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error)
	containerStatus func(context.Context, *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error)
	status          func(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error)
	events          func(*runtimeapi.GetEventsRequest, grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error

	mu                 sync.Mutex
	sandboxListReqs    []*runtimeapi.ListPodSandboxRequest
	containerListReqs  []*runtimeapi.ListContainersRequest
	sandboxStatusIDs   []string
	containerStatusIDs []string
}

func (f *fakeCRI) Version(ctx context.Context, r *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if f.version == nil {
		return f.UnimplementedRuntimeServiceServer.Version(ctx, r)
	}
	return f.version(ctx, r)
}

func (f *fakeCRI) ListPodSandbox(ctx context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	f.sandboxListReqs = append(f.sandboxListReqs, r)
	f.mu.Unlock()
	if f.listSandboxes == nil {
		return f.UnimplementedRuntimeServiceServer.ListPodSandbox(ctx, r)
	}
	return f.listSandboxes(ctx, r)
}

func (f *fakeCRI) ListContainers(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	f.containerListReqs = append(f.containerListReqs, r)
	f.mu.Unlock()
	if f.listContainers == nil {
		return f.UnimplementedRuntimeServiceServer.ListContainers(ctx, r)
	}
	return f.listContainers(ctx, r)
}

func (f *fakeCRI) PodSandboxStatus(ctx context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	f.sandboxStatusIDs = append(f.sandboxStatusIDs, r.PodSandboxId)
	f.mu.Unlock()
	if f.sandboxStatus == nil {
		return f.UnimplementedRuntimeServiceServer.PodSandboxStatus(ctx, r)
	}
	return f.sandboxStatus(ctx, r)
}

func (f *fakeCRI) ContainerStatus(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	f.containerStatusIDs = append(f.containerStatusIDs, r.ContainerId)
	f.mu.Unlock()
	if f.containerStatus == nil {
		return f.UnimplementedRuntimeServiceServer.ContainerStatus(ctx, r)
	}
	return f.containerStatus(ctx, r)
}

func (f *fakeCRI) Status(ctx context.Context, r *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	if f.status == nil {
		return f.UnimplementedRuntimeServiceServer.Status(ctx, r)
	}
	return f.status(ctx, r)
}

func (f *fakeCRI) GetContainerEvents(r *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	if f.events == nil {
		return f.UnimplementedRuntimeServiceServer.GetContainerEvents(r, s)
	}
	return f.events(r, s)
}

// socketDir returns a directory for a unix socket, short enough for the
// 108-byte limit on socket paths.
func socketDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) < 80 {
		return dir
	}
	dir, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// start serves f on a fresh unix socket and returns a client of it. The
// server is stopped and the client closed when the test ends.
func (f *fakeCRI) start(t *testing.T, opts ...Option) *Client {
	t.Helper()
	sock := filepath.Join(socketDir(t), "cri.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	c, err := Dial("unix://"+sock, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (f *fakeCRI) recorded() (sl []*runtimeapi.ListPodSandboxRequest, cl []*runtimeapi.ListContainersRequest, sIDs, cIDs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxListReqs, f.containerListReqs, f.sandboxStatusIDs, f.containerStatusIDs
}

// call is one call seen by a recordingTracer.
type call struct {
	op, id string
	done   bool
	err    error
}

type recordingTracer struct {
	mu    sync.Mutex
	calls []*call
}

func (r *recordingTracer) StartCall(op, id string) func(time.Duration, error) {
	c := &call{op: op, id: id}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return func(d time.Duration, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if c.done {
			panic("done called twice")
		}
		c.done, c.err = true, err
	}
}

func (r *recordingTracer) summary() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		s := c.op + " " + c.id
		if !c.done {
			s += " (not done)"
		}
		if c.err != nil {
			s += " (error)"
		}
		out = append(out, s)
	}
	return out
}

var errBoom = errors.New("boom")

func label(uid, pod, ns, ctr string) map[string]string {
	l := map[string]string{}
	for k, v := range map[string]string{
		"io.kubernetes.pod.uid":        uid,
		"io.kubernetes.pod.name":       pod,
		"io.kubernetes.pod.namespace":  ns,
		"io.kubernetes.container.name": ctr,
	} {
		if v != "" {
			l[k] = v
		}
	}
	return l
}

func sprint(v any) string { return fmt.Sprintf("%+v", v) }

package sim

import (
	"context"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestLatency(t *testing.T) {
	r, c := newSim(t, Config{Pods: 3, Latency: Latency{Base: 20 * time.Millisecond}})
	ctx := ctxT(t)
	start := time.Now()
	if _, err := c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("Version took %v, want >= 20ms", d)
	}
	r.SetLatency(Latency{Base: 5 * time.Millisecond, PerItem: 10 * time.Millisecond, Jitter: time.Millisecond, JitterDist: Exponential})
	start = time.Now()
	resp, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d, want := time.Since(start), 5*time.Millisecond+10*time.Millisecond*time.Duration(len(resp.Items)); len(resp.Items) != 3 || d < want {
		t.Errorf("ListPodSandbox of %d items took %v, want >= %v", len(resp.Items), d, want)
	}
	// A latency longer than the caller's deadline ends with the deadline.
	r.SetLatency(Latency{Base: time.Minute})
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	_, err = c.Status(short, &runtimeapi.StatusRequest{})
	wantCode(t, err, codes.DeadlineExceeded)
}

func TestHungStatusCalls(t *testing.T) {
	r, c := newSim(t, Config{Seed: 7, Pods: 2, HangPods: 1})
	ctx := ctxT(t)
	pods := r.Pods()
	hung, fine := pods[0], pods[1]
	if got := r.Hung(); len(got) != 1 || got[0] != hung.UID {
		t.Fatalf("Hung() = %v, want [%s]", got, hung.UID)
	}
	if _, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: fine.Containers[0].ID}); err != nil {
		t.Fatalf("status of a pod that is not hung: %v", err)
	}
	if _, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil {
		t.Fatalf("list calls do not hang: %v", err)
	}
	for _, call := range []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: hung.Containers[0].ID})
			return err
		},
		func(ctx context.Context) error {
			_, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: hung.SandboxID()})
			return err
		},
	} {
		// The call hangs until its deadline: it returns with the deadline
		// passed (measured against the context's own deadline, not a
		// second clock read taken after it, which load can delay).
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		deadline, _ := short.Deadline()
		err := call(short)
		returned := time.Now()
		cancel()
		wantCode(t, err, codes.DeadlineExceeded)
		if returned.Before(deadline) {
			t.Errorf("hung call returned %v before its deadline", deadline.Sub(returned))
		}
	}

	// Un-hanging releases a waiting call (the third ContainerStatus).
	done := make(chan error, 1)
	go func() {
		_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: hung.Containers[0].ID})
		done <- err
	}()
	waitFor(t, "the hung call", func() bool { return r.Calls()["ContainerStatus"] == 3 })
	r.SetHung(hung.UID, false)
	if err := <-done; err != nil {
		t.Fatalf("released call: %v", err)
	}

	// Stop ends a hung call.
	r.SetHung(hung.UID, true)
	go func() {
		_, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: hung.SandboxID()})
		done <- err
	}()
	waitFor(t, "the hung call", func() bool { return r.Calls()["PodSandboxStatus"] == 2 })
	stopped := make(chan struct{})
	go func() { r.Stop(); close(stopped) }()
	select {
	case err := <-done:
		wantCode(t, err, codes.Unavailable, codes.Canceled)
	case <-time.After(patience):
		t.Fatal("Stop did not end the hung call")
	}
	select {
	case <-stopped:
	case <-time.After(patience):
		t.Fatal("Stop did not return")
	}
}

func TestErrorRate(t *testing.T) {
	r, c := newSim(t, Config{Pods: 1, ErrorRate: 1})
	ctx := ctxT(t)
	pod := r.Pods()[0]
	calls := []func() error{
		func() error { _, err := c.Version(ctx, &runtimeapi.VersionRequest{}); return err },
		func() error { _, err := c.Status(ctx, &runtimeapi.StatusRequest{}); return err },
		func() error { _, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); return err },
		func() error { _, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); return err },
		func() error {
			_, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod.SandboxID()})
			return err
		},
		func() error {
			_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: pod.Containers[0].ID})
			return err
		},
		func() error {
			s, err := c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
	}
	for range 3 {
		for _, call := range calls {
			wantCode(t, call(), codes.Unavailable, codes.Internal)
		}
	}
	if n := r.Calls()["ListContainers"]; n != 3 {
		t.Errorf("ListContainers counted %d times, want 3", n)
	}
	r.SetErrorRate(0)
	for _, call := range calls[:6] {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGoAwayAndComeBack(t *testing.T) {
	r, c := newSim(t, Config{Seed: 3, Pods: 4, ContainersPerPod: 2})
	ctx := ctxT(t)
	before, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	events := subscribe(t, r, c, 1)
	path := r.Endpoint()[len("unix://"):]

	r.GoAway()
	if r.Serving() {
		t.Error("still serving after GoAway")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket still there after GoAway: %v", err)
	}
	if _, err := events.Recv(); err == nil {
		t.Error("event stream survived GoAway")
	}
	_, err = c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	wantCode(t, err, codes.Unavailable)
	// The model lives on while the runtime is away.
	mustAdd(t, r, PodSpec{Containers: []string{"x"}})

	if err := r.ComeBack(); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	after, err := c.ListContainers(wait, &runtimeapi.ListContainersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Containers) != len(before.Containers)+1 {
		t.Fatalf("%d containers after coming back, want %d", len(after.Containers), len(before.Containers)+1)
	}
	for i, b := range before.Containers {
		if after.Containers[i].Id != b.Id {
			t.Fatalf("container %d: %s, was %s", i, after.Containers[i].Id, b.Id)
		}
	}
	if err := r.ComeBack(); err != nil {
		t.Errorf("ComeBack while serving: %v", err)
	}
}

func TestStopIdempotentAndServeAfterStop(t *testing.T) {
	r := New(Config{Pods: 1})
	sock := t.TempDir() + "/cri.sock"
	if err := r.Serve(sock); err != nil {
		t.Fatal(err)
	}
	if err := r.Serve(sock); err == nil {
		t.Error("second Serve succeeded")
	}
	r.Run(context.Background(), time.Hour)
	r.Stop()
	r.Stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after Stop: %v", err)
	}
	if err := r.Serve(sock); err != ErrStopped {
		t.Errorf("Serve after Stop: %v", err)
	}
	if err := r.ComeBack(); err != ErrStopped {
		t.Errorf("ComeBack after Stop: %v", err)
	}
}

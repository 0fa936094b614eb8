package cri

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// withInternLimits bounds the client's Interner by lim.
func withInternLimits(lim cruntime.InternLimits) Option {
	return func(o *options) { o.intern = lim }
}

// turnover is a fake runtime whose one pod is replaced by the next, each
// pod's sandbox carrying values of its own (the kubelet's
// kubernetes.io/config.seen, a CNI's 4 KB network status) and its
// container the annotations every replica carries.
type turnover struct {
	mu  sync.Mutex
	pod int
}

func (w *turnover) uid(i int) string  { return fmt.Sprintf("0b6f7c1e-4d2a-4f3b-9c8d-%012d", i) }
func (w *turnover) seen(i int) string { return fmt.Sprintf("2026-11-29T10:00:00.%09dZ", i) }
func (w *turnover) net(i int) string {
	return fmt.Sprintf(`[{"name":"cbr0","ips":["10.1.%d.%d"],"x":%q}]`, i/250, i%250, strings.Repeat("n", 4<<10))
}

func (w *turnover) current() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

func (w *turnover) serve(f *fakeCRI) {
	f.listSandboxes = func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
		i := w.current()
		return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{
			Id: "sb-" + w.uid(i), State: runtimeapi.PodSandboxState_SANDBOX_READY,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Uid: w.uid(i), Namespace: "default"},
			Labels:   label(w.uid(i), "web", "default", ""),
		}}}, nil
	}
	f.listContainers = func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		i := w.current()
		return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{
			Id: "ct-" + w.uid(i), PodSandboxId: "sb-" + w.uid(i), State: runtimeapi.ContainerState_CONTAINER_RUNNING,
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			Labels:   label(w.uid(i), "web", "default", "app"),
		}}}, nil
	}
	f.sandboxStatus = func(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
		i := w.current()
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{
			Id: r.PodSandboxId, State: runtimeapi.PodSandboxState_SANDBOX_READY,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Uid: w.uid(i), Namespace: "default"},
			Labels:   label(w.uid(i), "web", "default", ""),
			Annotations: map[string]string{
				"kubernetes.io/config.seen":         w.seen(i),
				"kubernetes.io/config.source":       "api",
				"k8s.v1.cni.cncf.io/network-status": w.net(i),
			},
		}}, nil
	}
	f.containerStatus = func(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
		i := w.current()
		return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
			Id: r.ContainerId, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			ImageRef: "sha256:" + strings.Repeat("ab", 32),
			Labels:   label(w.uid(i), "web", "default", "app"),
			Annotations: map[string]string{
				"io.kubernetes.container.hash":                   "5d1e2c3b",
				"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
			},
		}}, nil
	}
}

// replace makes pod i the runtime's one pod, lists it as a relist does
// and fetches its statuses.
func (w *turnover) replace(t *testing.T, c *Client, i int) *cruntime.PodStatus {
	t.Helper()
	w.mu.Lock()
	w.pod = i
	w.mu.Unlock()
	pods, err := c.ListPods(context.Background())
	if err != nil || len(pods) != 1 {
		t.Fatalf("pod %d: listed %d pods, %v", i, len(pods), err)
	}
	st, err := c.PodStatus(context.Background(), pods[0])
	if err != nil || len(st.SandboxStatuses) != 1 || len(st.ContainerStatuses) != 1 {
		t.Fatalf("pod %d: status %v, %v", i, st, err)
	}
	return st
}

// A node whose pods are replaced one after another, each with values of
// its own: the client's table keeps what the live pods use, not what
// every dead pod used; the 4 KB network status is never kept; the
// replicas' annotations stay shared. Before, the table kept every value
// up to 4,096 of them (4,096 network statuses: 16 MiB).
func TestInternerLetsGoOfDeadPods(t *testing.T) {
	const sweep = 8 << 10
	var w turnover
	f := &fakeCRI{}
	w.serve(f)
	c := f.start(t, withInternLimits(cruntime.InternLimits{SweepBytes: sweep}))

	const pods = 400
	var last, before *cruntime.PodStatus
	peak := 0
	for i := range pods {
		before, last = last, w.replace(t, c, i)
		peak = max(peak, c.shared.Stats().Bytes)
	}
	st := c.shared.Stats()
	if st.Sweeps == 0 {
		t.Fatalf("%d pods replaced and no sweep: %+v", pods, st)
	}
	// A pod adds its UID, timestamp, label and annotation sets, ~600
	// bytes: twice the floor and a pod or two at most, never the dead.
	if peak > 3*sweep {
		t.Errorf("the table reached %d bytes for one live pod (now %+v)", peak, st)
	}
	for _, i := range []int{0, 1, pods / 2} {
		if c.shared.Holds(w.uid(i)) || c.shared.Holds(w.seen(i)) {
			t.Errorf("dead pod %d's values are still in the table", i)
		}
	}
	if c.shared.Holds(strings.Repeat("n", 4<<10)) {
		t.Error("a 4 KB network status was interned")
	}
	if !c.shared.Holds(w.uid(pods - 1)) {
		t.Error("the live pod's UID is not in the table")
	}
	a, b := last.ContainerStatuses[0].Annotations, before.ContainerStatuses[0].Annotations
	if !a.SameAs(b) {
		t.Error("two replicas' equal annotations are kept twice")
	}
	if last.SandboxStatuses[0].Annotations.Get("kubernetes.io/config.seen") != w.seen(pods-1) {
		t.Errorf("annotations %v", last.SandboxStatuses[0].Annotations)
	}
}

// Two clients keep tables of their own: what one decodes is not in the
// other's, and their sets are not shared between them (under -race:
// decoding through both at once is race-free).
func TestClientsDoNotShareATable(t *testing.T) {
	var wa, wb turnover
	fa, fb := &fakeCRI{}, &fakeCRI{}
	wa.serve(fa)
	wb.serve(fb)
	ca, cb := fa.start(t), fb.start(t)
	if ca.shared == cb.shared {
		t.Fatal("two clients hold one Interner")
	}
	var sa, sb [20]*cruntime.PodStatus
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range sa {
			sa[i] = wa.replace(t, ca, i)
		}
	}()
	go func() {
		defer wg.Done()
		for i := range sb {
			sb[i] = wb.replace(t, cb, 1000+i)
		}
	}()
	wg.Wait()
	if !sa[0].ContainerStatuses[0].Annotations.SameAs(sa[1].ContainerStatuses[0].Annotations) {
		t.Error("one client's replicas do not share their annotations")
	}
	if sa[0].ContainerStatuses[0].Annotations.SameAs(sb[0].ContainerStatuses[0].Annotations) {
		t.Error("two clients share a label set")
	}
	if ca.shared.Holds(wb.uid(1000)) || cb.shared.Holds(wa.uid(0)) {
		t.Error("a client's table holds what the other decoded")
	}
	if !ca.shared.Holds(wa.uid(0)) || !cb.shared.Holds(wb.uid(1000)) {
		t.Error("a client's table does not hold what it decoded")
	}
}

package e2e

// Streaming lists (KEP-5825) on real containerd: 2.4 has
// StreamPodSandboxes and StreamContainers, sending 5,000 items a message;
// earlier versions answer Unimplemented.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
)

// envLargeNode=1 runs TestListLargerThanMessageLimit (minutes).
const envLargeNode = "PLEG_E2E_LARGE_NODE"

// hasListStreaming reports whether e's runtime serves the streaming
// list RPCs (containerd 2.4 and later, CRI-O 1.36).
func (e *env) hasListStreaming() bool {
	if e.kind == kindCRIO {
		return true
	}
	return !strings.HasPrefix(e.version, "1.") && !strings.HasPrefix(e.version, "2.2.") && !strings.HasPrefix(e.version, "2.3.")
}

// dialStreaming dials the suite's containerd in list streaming mode m.
func dialStreaming(t testing.TB, m cri.ListStreaming) *cri.Client {
	t.Helper()
	c, err := cri.Dial(CRIEndpoint(), cri.WithTimeout(30*time.Second), cri.WithLogger(logr.Discard()), cri.WithListStreaming(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestListStreaming runs on every containerd. In auto mode the client
// streams on 2.4 and falls back to the unary calls on earlier versions
// (which answer Unimplemented); in on mode those fail with Unimplemented.
// Two library generators, one listing in auto mode and one with the
// unary calls, relisted by hand over the same changes (pods run, a
// container stopped, another started, one removed), see identical
// listings, deliver the same events per pod and cache the same statuses.
func TestListStreaming(t *testing.T) {
	forEachRuntime(t, testListStreaming)
}

func testListStreaming(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	auto, off := dialStreaming(t, cri.ListStreamingAuto), dialStreaming(t, cri.ListStreamingOff)
	type side struct {
		name string
		g    *pleg.Generator
		ch   <-chan *pleg.Event
	}
	var sides []*side
	for _, c := range []struct {
		name string
		c    *cri.Client
	}{{"auto", auto}, {"unary", off}} {
		g, err := pleg.New(pleg.Options{Runtime: c.c, Events: pleg.EventsOff})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		sides = append(sides, &side{name: c.name, g: g, ch: g.Watch()})
	}
	mine := map[string]bool{}
	relist := func(what string) {
		t.Helper()
		got := map[string]map[string][]string{}
		for _, s := range sides {
			if err := s.g.Relist(ctx); err != nil {
				t.Fatalf("%s: %s: %v", what, s.name, err)
			}
			got[s.name] = map[string][]string{}
			for more := true; more; {
				select {
				case ev := <-s.ch:
					if mine[string(ev.PodUID)] {
						got[s.name][string(ev.PodUID)] = append(got[s.name][string(ev.PodUID)], fmt.Sprintf("%s %.12s", ev.Type, ev.ContainerID))
					}
				default:
					more = false
				}
			}
		}
		// The order of a pod's events follows the runtime's listing order,
		// which containerd does not keep from one call to the next.
		for _, byPod := range got {
			for _, evs := range byPod {
				slices.Sort(evs)
			}
		}
		if !reflect.DeepEqual(got["auto"], got["unary"]) {
			t.Fatalf("%s: events differ:\nauto:  %v\nunary: %v", what, got["auto"], got["unary"])
		}
		for uid := range mine {
			a, aerr := sides[0].g.Cache().Get(types.UID(uid))
			u, uerr := sides[1].g.Cache().Get(types.UID(uid))
			if !reflect.DeepEqual(a, u) || (aerr == nil) != (uerr == nil) {
				t.Fatalf("%s: pod %.8s cached differently:\nauto:  %+v %v\nunary: %+v %v", what, uid, a, aerr, u, uerr)
			}
		}
		al, err := auto.ListPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ul, err := off.ListPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffListings(al, ul); d != "" {
			t.Fatalf("%s: listings differ: %s", what, d)
		}
	}

	relist("before")
	if got, want := auto.ListStreamingActive(), e.hasListStreaming(); got != want {
		t.Fatalf("%s: auto mode streams %v after a listing, want %v", e.name(), got, want)
	}
	on := dialStreaming(t, cri.ListStreamingOn)
	_, err := on.ListPods(ctx)
	if e.hasListStreaming() && err != nil {
		t.Fatalf("on: %v", err)
	}
	if !e.hasListStreaming() && status.Code(err) != codes.Unimplemented {
		t.Fatalf("on, %s: %v, want Unimplemented", e.name(), err)
	}

	sb1, uid1 := RunPod(t, "stream-a")
	sb2, uid2 := RunPod(t, "stream-b")
	mine[uid1], mine[uid2] = true, true
	a1 := CreateAndStart(t, sb1, "app", nil)
	a2 := CreateAndStart(t, sb1, "side", nil)
	b1 := CreateAndStart(t, sb2, "app", nil)
	WaitContainerState(t, b1, runtimeapi.ContainerState_CONTAINER_RUNNING, 30*time.Second)
	relist("pods started")
	StopContainer(t, a2, 0)
	b2 := CreateAndStart(t, sb2, "late", nil)
	WaitContainerState(t, b2, runtimeapi.ContainerState_CONTAINER_RUNNING, 30*time.Second)
	relist("a container stopped, one started")
	RemoveContainer(t, a2)
	StopContainer(t, a1, 0)
	relist("a container removed, one stopped")
	for _, s := range sides {
		if st, err := s.g.Cache().Get(types.UID(uid1)); err != nil || len(st.ContainerStatuses) != 1 || st.ContainerStatuses[0].State != cruntime.StateExited {
			t.Fatalf("%s: pod a cached as %+v, %v; want its app container exited", s.name, st, err)
		}
	}
}

// TestListLargerThanMessageLimit runs on containerd 2.4 only, by hand
// (PLEG_E2E_LARGE_NODE=1). containerd 2.4.2 streams 5,000 items a message
// and sends no message over 16 MiB, so a listing that streaming can serve
// while the unary call cannot needs more than 5,000 items of at most
// ~3.3 KiB: a few hundred large containers exceed 16 MiB in one batch and
// fail streamed too. A node
// whose container listing exceeds 16 MiB (5,600 created containers with
// 2,900-byte annotations in 8 pods, ~17 MiB listed; containerd streams
// 5,000 items a message, each message under the limit) cannot be listed
// with the unary calls: `pleg run --list-streaming=off` logs one line
// naming the 16 MiB limit and the flag, and its /healthz fails. `pleg run`
// at its defaults streams, keeps relisting and delivers the events of a
// pod started on that node.
func TestListLargerThanMessageLimit(t *testing.T) {
	if os.Getenv(envLargeNode) != "1" {
		t.Skipf("creates 5,600 containers: containerd 2.4.2 made 4,500 in 2.5 minutes here, then stalled (one attempt); set %s=1 to run it", envLargeNode)
	}
	base := useRuntime(t, "2.4.")
	PlegBinary(t) // into the suite's dir, which outlives this test's env
	start := time.Now()
	// A containerd of its own, its root on a tmpfs: thousands of creates
	// are bolt transactions, each synced to disk otherwise (~10 a second
	// on this machine's disk); the supervisor unmounts it at teardown.
	e, err := startEnvWith(baseEnv, base.version, func(e *env) error {
		root := filepath.Join(e.dir, "root")
		if err := os.MkdirAll(root, 0o700); err != nil {
			return err
		}
		return syscall.Mount("pleg-e2e-root", root, "tmpfs", 0, "mode=0700")
	})
	if e != nil {
		t.Cleanup(func() {
			if err := e.teardown(); err != nil {
				t.Errorf("teardown of the large node's containerd: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("starting a containerd %s: %v", base.version, err)
	}
	useEnv(t, e)
	const pods, perPod = 8, 700
	annot := strings.Repeat("a", 2900)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	var created atomic.Int64
	for i := range pods {
		// Not RunPod: its cleanup would remove 700 containers a pod
		// through CRI; the env's teardown removes its root instead.
		name, uid := fmt.Sprintf("big-%d", i), newUID()
		cfg := suite.podSandboxConfig(name, uid, map[string]string{labelPodUID: uid, labelPodName: name, labelPodNamespace: podNamespace}, nil)
		resp, err := suite.cri.rt.RunPodSandbox(criCtx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			t.Fatalf("RunPodSandbox %s: %v", name, err)
		}
		sb := resp.PodSandboxId
		wg.Add(1)
		go func() { // several pods at once: containerd's creates are mostly waiting
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			for j := range perPod {
				name := fmt.Sprintf("c%d", j)
				_, err := suite.cri.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
					PodSandboxId: sb, SandboxConfig: cfg,
					Config: &runtimeapi.ContainerConfig{
						Metadata: &runtimeapi.ContainerMetadata{Name: name},
						Image:    &runtimeapi.ImageSpec{Image: workloadImage, UserSpecifiedImage: workloadImage},
						Labels: map[string]string{labelContainerName: name, labelPodName: cfg.Metadata.Name,
							labelPodNamespace: cfg.Metadata.Namespace, labelPodUID: uid},
						Annotations: map[string]string{"e2e.pleg/padding": annot},
						Linux: &runtimeapi.LinuxContainerConfig{
							SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaceOptions()},
						},
					},
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("pod %d container %d: %w", i, j, err))
					mu.Unlock()
					return
				}
				if n := created.Add(1); n%500 == 0 {
					t.Logf("%d containers created in %v", n, time.Since(start).Round(time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d containers created in %v", pods*perPod, time.Since(start).Round(time.Millisecond))

	// The unary listing fails; the streamed one has every container.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = dialStreaming(t, cri.ListStreamingOff).ListPods(ctx)
	if !errors.Is(err, cri.ErrListTooLarge) {
		t.Fatalf("unary listing: %v, want ErrListTooLarge", err)
	}
	t.Logf("unary listing: %v", err)
	listed, err := dialStreaming(t, cri.ListStreamingAuto).ListPods(ctx)
	if err != nil {
		t.Fatalf("streamed listing: %v", err)
	}
	n := 0
	for _, p := range listed {
		n += len(p.Containers)
	}
	if n < pods*perPod {
		t.Fatalf("streamed listing: %d containers, want at least %d", n, pods*perPod)
	}

	off := startDaemon(t, "pleg run --list-streaming=off", "--list-streaming=off")
	off.waitStderr(t, "gRPC message limit and list streaming is off: use --list-streaming=auto", 30*time.Second)
	for _, l := range off.stderrLines() {
		if strings.Contains(l, "gRPC message limit") {
			t.Logf("pleg run --list-streaming=off: %s", l)
			if !strings.Contains(l, "16 MiB") {
				t.Errorf("the line does not name the 16 MiB limit: %s", l)
			}
			break
		}
	}
	if code, _, err := off.get("/healthz"); err != nil || code == 200 {
		t.Errorf("pleg run --list-streaming=off: /healthz %d %v, want a failure: it never listed", code, err)
	}

	d := startDaemon(t, "pleg run")
	d.waitStderr(t, "listening on", 10*time.Second)
	eventually(t, 60*time.Second, "pleg run lists the >16 MiB node and is healthy", func() error {
		if code, b, err := d.get("/healthz"); err != nil || code != 200 {
			return fmt.Errorf("/healthz %d %q %v", code, b, err)
		}
		return nil
	})
	sb, _ := RunPod(t, "small")
	id := CreateAndStart(t, sb, "app", nil)
	eventually(t, 30*time.Second, "pleg run delivers ContainerStarted of a pod started on the node", func() error {
		if _, ok := d.log.find(pleg.ContainerStarted, id); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	_, b, err := d.get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := parseMetrics(b)
	if err != nil {
		t.Fatal(err)
	}
	relists, sum := histogramTotals(mfs, "kubelet_pleg_relist_duration_seconds")
	if relists < 2 {
		t.Errorf("pleg run relisted %d times", relists)
	}
	measure(t, "list-larger-than-16MiB: %d containers listed streamed; pleg run relisted %d times, mean %s; whole test %v",
		n, relists, ms(time.Duration(sum/float64(relists)*float64(time.Second))), time.Since(start).Round(time.Millisecond))
}

// diffListings compares two listings, each pod's sandboxes and containers
// by ID (containerd lists them in no stable order), and says how they
// differ.
func diffListings(a, b []*cruntime.Pod) string {
	norm := func(pods []*cruntime.Pod) map[types.UID]cruntime.Pod {
		out := map[types.UID]cruntime.Pod{}
		for _, p := range pods {
			c := *p
			c.Sandboxes = slices.Clone(p.Sandboxes)
			c.Containers = slices.Clone(p.Containers)
			slices.SortFunc(c.Sandboxes, func(x, y *cruntime.Container) int { return strings.Compare(x.ID, y.ID) })
			slices.SortFunc(c.Containers, func(x, y *cruntime.Container) int { return strings.Compare(x.ID, y.ID) })
			out[p.UID] = c
		}
		return out
	}
	na, nb := norm(a), norm(b)
	for uid, p := range na {
		q, ok := nb[uid]
		if !ok {
			return fmt.Sprintf("pod %.8s only in the first", uid)
		}
		if !reflect.DeepEqual(p, q) {
			return fmt.Sprintf("pod %.8s:\n%+v\n%+v", uid, p, q)
		}
	}
	if len(na) != len(nb) {
		return fmt.Sprintf("%d and %d pods", len(na), len(nb))
	}
	return ""
}

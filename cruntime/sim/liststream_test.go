package sim_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/metrics"
)

// serveSim serves r on a socket of t's and stops it at the end.
func serveSim(t *testing.T, r *sim.Runtime) {
	t.Helper()
	if err := r.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
}

// dialMode returns a project client of r in list streaming mode m.
func dialMode(t *testing.T, r *sim.Runtime, m cri.ListStreaming, opts ...cri.Option) *cri.Client {
	t.Helper()
	c, err := cri.Dial(r.Endpoint(), append([]cri.Option{cri.WithTimeout(30 * time.Second), cri.WithListStreaming(m)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxMinute(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eventKey is an event without its delivery time.
func eventKey(e *pleg.Event) string {
	code := ""
	if e.ExitCode != nil {
		code = fmt.Sprint(*e.ExitCode)
	}
	return fmt.Sprintf("%s %s %s %s sandbox=%t exit=%s", e.Type, e.PodUID, e.ContainerID, e.ContainerName, e.Sandbox, code)
}

// drain returns the events waiting on ch, by pod in delivery order
// (across pods the order is that in which inspections finish).
func drain(ch <-chan *pleg.Event) (map[string][]string, int) {
	out := map[string][]string{}
	for n := 0; ; n++ {
		select {
		case e := <-ch:
			out[string(e.PodUID)] = append(out[string(e.PodUID)], eventKey(e))
		default:
			return out, n
		}
	}
}

// TestListStreamingDifferential drives four generators over the same
// churning simulated node, two listing through the streaming RPCs in
// batches of 7 items, two with the unary calls, of each one decoding as
// the replies arrive (the client's direct listings, the default) and one
// through gRPC's connection (cri.WithDirectLists(false)): at every step
// their listings, their events and their caches are identical, and each
// made only its own kind of list call. The listing memo works the same: a
// streamed listing of an unchanged node returns the previous listing's
// pods (same pointers).
func TestListStreamingDifferential(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	r := sim.New(sim.Config{Seed: 5825, Pods: 30, ContainersPerPod: 3, ChurnPerStep: 10, Clock: clk, ListStreamBatch: 7})
	serveSim(t, r)
	ctx := ctxMinute(t)

	type side struct {
		c *cri.Client
		g *pleg.Generator
	}
	sides := map[string]*side{}
	for _, name := range []string{"stream", "unary", "stream-grpc", "unary-grpc"} {
		m := cri.ListStreamingOn
		if strings.HasPrefix(name, "unary") {
			m = cri.ListStreamingOff
		}
		c := dialMode(t, r, m, cri.WithDirectLists(!strings.HasSuffix(name, "-grpc")))
		// A fake clock of the generator's own: both see the same times.
		g, err := pleg.New(pleg.Options{Runtime: c, Clock: clocktesting.NewFakeClock(clk.Now()), Events: pleg.EventsOff})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		sides[name] = &side{c: c, g: g}
	}
	s := sides["stream"]
	others := []string{"unary", "stream-grpc", "unary-grpc"}
	var events int
	for step := range 20 {
		if step > 0 {
			r.Step()
		}
		for _, sd := range sides {
			if err := sd.g.Relist(ctx); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		se, n := drain(s.g.Watch())
		events += n
		sc := s.g.Cache().List()
		sp, err := s.c.ListPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range others {
			u := sides[name]
			ue, _ := drain(u.g.Watch())
			if !reflect.DeepEqual(se, ue) {
				t.Fatalf("step %d: events differ:\nstreamed: %v\n%s: %v", step, se, name, ue)
			}
			uc := u.g.Cache().List()
			if len(sc) != len(uc) {
				t.Fatalf("step %d: %d cached pods streamed, %d %s", step, len(sc), len(uc), name)
			}
			for i := range sc {
				if !reflect.DeepEqual(sc[i].Status, uc[i].Status) || (sc[i].Err == nil) != (uc[i].Err == nil) {
					t.Fatalf("step %d: cache entry %d differs:\nstreamed: %+v\n%s: %+v", step, i, sc[i], name, uc[i])
				}
			}
			up, err := u.c.ListPods(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sp, up) {
				t.Fatalf("step %d: listings differ, streamed and %s", step, name)
			}
		}
	}
	if events < 60 {
		t.Fatalf("only %d events in 20 steps: the node did not churn", events)
	}

	// Nothing changes: the streamed listing is the last one, pod for pod.
	a, err := s.c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("%d then %d pods", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("pod %s was built again for an unchanged streamed listing", a[i].UID)
		}
	}

	calls := r.Calls()
	for _, m := range []string{"StreamPodSandboxes", "StreamContainers", "ListPodSandbox", "ListContainers"} {
		if calls[m] == 0 {
			t.Errorf("no %s call: %v", m, calls)
		}
	}
	// Each side made its kind of call once per listing: 20 relists and 22
	// direct listings streamed, 20 and 20 through gRPC; 20 and 20 unary
	// on each.
	if calls["StreamContainers"] != 82 || calls["ListContainers"] != 80 {
		t.Errorf("StreamContainers %d (want 82), ListContainers %d (want 80)", calls["StreamContainers"], calls["ListContainers"])
	}
}

// TestListStreamingFallback: in auto mode, a runtime without the
// streaming RPCs answers Unimplemented once per connection, and the
// listing is made with the unary calls, counted as one operation without
// error; the client does not ask again on that connection, even once the
// runtime has them, and probes again after it reconnected. In on mode the
// listing fails with Unimplemented; in off mode no stream is asked for.
func TestListStreamingFallback(t *testing.T) {
	r := sim.New(sim.Config{Seed: 1, Pods: 3, ContainersPerPod: 2, DisableListStreaming: true})
	serveSim(t, r)
	ctx := ctxMinute(t)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	c := dialMode(t, r, cri.ListStreamingAuto, cri.WithMetrics(m))

	list := func(want int) {
		t.Helper()
		pods, err := c.ListPods(ctx)
		if err != nil || len(pods) != want {
			t.Fatalf("ListPods: %d pods, %v; want %d", len(pods), err, want)
		}
	}
	list(3)
	list(3)
	if got, want := r.Calls(), map[string]int64{"StreamPodSandboxes": 1, "ListPodSandbox": 2, "ListContainers": 2}; !subset(got, want) {
		t.Errorf("calls %v, want %v and no StreamContainers", got, want)
	}
	if c.ListStreamingActive() {
		t.Error("streaming still active after Unimplemented")
	}
	if n := testutil.ToFloat64(m.RuntimeOperations.WithLabelValues(metrics.OpListPodSandbox)); n != 2 {
		t.Errorf("list_podsandbox operations %v, want 2 (one per listing)", n)
	}
	if n := testutil.CollectAndCount(m.RuntimeOperationErrors); n != 0 {
		t.Errorf("%d runtime operation error series, want none: the probe is not an error", n)
	}

	// The runtime gains the RPCs: not asked again on this connection.
	r.SetListStreaming(true, 2)
	r.ResetCalls()
	list(3)
	if got := r.Calls(); got["StreamPodSandboxes"] != 0 || got["StreamContainers"] != 0 {
		t.Errorf("streamed on the connection that answered Unimplemented: %v", got)
	}
	// A restarted runtime (new connection) is probed again, and streams.
	r.GoAway()
	if err := r.ComeBack(); err != nil {
		t.Fatal(err)
	}
	// The client sees its connection end (gRPC's transport reader does,
	// asynchronously): from then on the next listing probes again.
	for deadline := time.Now().Add(10 * time.Second); !c.ListStreamingActive(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client did not notice the connection ending within 10 s")
		}
	}
	r.ResetCalls()
	var err error
	for range 50 { // the first call after the restart may still fail while the client reconnects
		if _, err = c.ListPods(ctx); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Calls(); got["StreamPodSandboxes"] == 0 || got["StreamContainers"] == 0 || got["ListContainers"] != 0 {
		t.Errorf("after the reconnect: %v, want streamed listings only", got)
	}
	if !c.ListStreamingActive() {
		t.Error("streaming not active after the reconnect")
	}

	// On: Unimplemented is the listing's error.
	r.SetListStreaming(false, 0)
	on := dialMode(t, r, cri.ListStreamingOn)
	_, err = on.ListPods(ctx)
	var ce *cri.CallError
	if status.Code(err) != codes.Unimplemented || !errors.As(err, &ce) || ce.Method != "StreamPodSandboxes" {
		t.Errorf("on, without the RPCs: %v, want Unimplemented from StreamPodSandboxes", err)
	}
	// Off: never streams.
	r.SetListStreaming(true, 0)
	r.ResetCalls()
	off := dialMode(t, r, cri.ListStreamingOff)
	if _, err := off.ListPods(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.Calls(); got["StreamPodSandboxes"] != 0 || got["StreamContainers"] != 0 {
		t.Errorf("off: %v", got)
	}
}

// subset reports whether got has every count of want, and nothing of the
// list methods want leaves out.
func subset(got, want map[string]int64) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	for _, k := range []string{"StreamPodSandboxes", "StreamContainers", "ListPodSandbox", "ListContainers"} {
		if _, ok := want[k]; !ok && got[k] != 0 {
			return false
		}
	}
	return true
}

// TestListLargerThanMessageLimit: a node whose container listing is
// larger than the 16 MiB gRPC message limit (17 created containers with
// 1 MiB annotations, 4 a message when streamed) cannot be listed with the unary calls: the error
// matches cri.ErrListTooLarge and says, on one line, the limit and the
// flag. Streamed in batches that each fit, it lists every container.
func TestListLargerThanMessageLimit(t *testing.T) {
	r := sim.New(sim.Config{Seed: 2, ListStreamBatch: 4})
	serveSim(t, r)
	ctx := ctxMinute(t)
	raw := dialMode(t, r, cri.ListStreamingOff).RuntimeService()
	p, err := r.AddPod(sim.PodSpec{Name: "big", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandboxes[0]
	big := strings.Repeat("x", 1<<20)
	const n = 17 // 17 x 1 MiB, in messages of 4 items
	for i := range n {
		_, err := raw.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: sb.ID,
			Config: &runtimeapi.ContainerConfig{
				Metadata:    &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c%d", i)},
				Image:       &runtimeapi.ImageSpec{Image: "busybox"},
				Annotations: map[string]string{"big": big},
			},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Uid: p.UID, Namespace: p.Namespace}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	off := dialMode(t, r, cri.ListStreamingOff)
	_, err = off.ListPods(ctx)
	if !errors.Is(err, cri.ErrListTooLarge) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary listing of %d x 1 MiB: %v, want ErrListTooLarge (ResourceExhausted)", n, err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "16 MiB") || !strings.Contains(msg, "--list-streaming=auto") {
		t.Errorf("error %q: want one line naming the 16 MiB limit and --list-streaming", msg)
	}
	t.Logf("unary: %v", err)

	for _, m := range []cri.ListStreaming{cri.ListStreamingAuto, cri.ListStreamingOn} {
		c := dialMode(t, r, m)
		pods, err := c.ListPods(ctx)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if len(pods) != 1 || len(pods[0].Containers) != n+1 {
			t.Fatalf("%s: %d pods, want 1 with %d containers", m, len(pods), n+1)
		}
		var created int
		for _, c := range pods[0].Containers {
			if c.State == cruntime.StateCreated {
				created++
			}
		}
		if created != n {
			t.Errorf("%s: %d created containers, want %d", m, created, n)
		}
	}
}

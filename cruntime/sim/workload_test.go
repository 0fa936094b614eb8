package sim

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func runSteps(seed uint64, steps int) (*Runtime, []PodInfo) {
	r := New(Config{Clock: fakeClock(), Seed: seed, Pods: 30, ContainersPerPod: 2, ChurnPerStep: 5,
		Mix: Mix{Steady: 1, CrashLoop: 1, Batch: 1, RollingUpdate: 1}})
	for range steps {
		r.Step()
	}
	// Direct mutations are deterministic too.
	p, _ := r.AddPod(PodSpec{Containers: []string{"x"}})
	r.Step()
	_, _ = r.RestartContainer(p.UID, "x")
	return r, r.Pods()
}

func TestDeterminism(t *testing.T) {
	r1, a := runSteps(42, 40)
	r2, b := runSteps(42, 40)
	t.Cleanup(r1.Stop)
	t.Cleanup(r2.Stop)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, same steps: different models")
	}
	if len(a) < 30 {
		t.Fatalf("%d pods", len(a))
	}
	for _, p := range a {
		for _, c := range p.Containers {
			if len(c.ID) != 64 || strings.Trim(c.ID, "0123456789abcdef") != "" {
				t.Fatalf("container ID %q is not 64 hex characters", c.ID)
			}
		}
	}
	// The same through CRI listings.
	c1, c2 := serve(t, r1), serve(t, r2)
	ctx := ctxT(t)
	l1, err1 := c1.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	l2, err2 := c2.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !proto.Equal(l1, l2) {
		t.Error("same seed: different ListContainers answers")
	}
	s1, err1 := c1.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	s2, err2 := c2.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !proto.Equal(s1, s2) {
		t.Error("same seed: different ListPodSandbox answers")
	}

	_, c := runSteps(43, 40)
	if reflect.DeepEqual(a, c) || a[0].UID == c[0].UID || a[0].Containers[0].ID == c[0].Containers[0].ID {
		t.Error("different seeds: same model")
	}
}

func TestChurnChangesTheModel(t *testing.T) {
	r := New(Config{Seed: 9, Pods: 20, ContainersPerPod: 2, ChurnPerStep: 4})
	t.Cleanup(r.Stop)
	before := r.Pods()
	for range 30 {
		r.Step()
	}
	if reflect.DeepEqual(before, r.Pods()) {
		t.Error("30 steps with churn changed nothing")
	}
	if r.StepCount() != 30 {
		t.Errorf("StepCount = %d", r.StepCount())
	}
}

func TestCrashLoopAndGC(t *testing.T) {
	r := New(Config{Seed: 1, Pods: 1, ContainersPerPod: 1, ChurnPerStep: 1, Mix: Mix{CrashLoop: 1}})
	t.Cleanup(r.Stop)
	uid := r.Pods()[0].UID
	seen := map[string]uint32{}
	var maxAttempt uint32
	for step := range 20 {
		r.Step()
		p, ok := r.Pod(uid)
		if !ok {
			t.Fatal("crash-looping pod vanished")
		}
		for _, c := range p.Containers {
			if a, ok := seen[c.ID]; ok && a != c.Attempt {
				t.Fatalf("container %s changed attempt", c.ID)
			}
			seen[c.ID] = c.Attempt
			if c.State == runtimeapi.ContainerState_CONTAINER_EXITED && (c.ExitCode == 0 || c.Reason != "Error") {
				t.Errorf("crash: exit code %d reason %q", c.ExitCode, c.Reason)
			}
		}
		cur, _ := p.Container("main")
		if cur.Attempt < maxAttempt {
			t.Fatalf("attempt went back from %d to %d", maxAttempt, cur.Attempt)
		}
		maxAttempt = cur.Attempt
		// Current attempt + KeepExitedAttempts (1) + one superseded this tick.
		if len(p.Containers) > 3 {
			t.Fatalf("step %d: %d attempts kept: %+v", step, len(p.Containers), p.Containers)
		}
	}
	if maxAttempt < 5 || len(seen) != int(maxAttempt)+1 {
		t.Errorf("after 20 steps: attempt %d, %d distinct IDs", maxAttempt, len(seen))
	}
	p, _ := r.Pod(uid)
	for _, c := range p.Containers {
		if c.Attempt+2 < maxAttempt {
			t.Errorf("attempt %d not garbage-collected (newest %d)", c.Attempt, maxAttempt)
		}
	}
}

func TestGCKeepsConfiguredAttempts(t *testing.T) {
	r := New(Config{KeepExitedAttempts: -1})
	t.Cleanup(r.Stop)
	p := mustAdd(t, r, PodSpec{Containers: []string{"app"}})
	first := p.Containers[0].ID
	second, err := r.RestartContainer(p.UID, "app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RestartContainer(p.UID, "app"); err != nil {
		t.Fatal(err)
	}
	if p, _ = r.Pod(p.UID); len(p.Containers) != 3 {
		t.Fatalf("before GC: %d containers", len(p.Containers))
	}
	r.Step()
	p, _ = r.Pod(p.UID)
	if len(p.Containers) != 1 || p.Containers[0].Attempt != 2 {
		t.Fatalf("after GC (keep none): %+v", p.Containers)
	}
	if _, ok := r.Container(first); ok {
		t.Error("first attempt survived")
	}
	if _, ok := r.Container(second); ok {
		t.Error("second attempt survived")
	}
}

func TestBatchPodsComplete(t *testing.T) {
	r := New(Config{Seed: 5, Pods: 1, ContainersPerPod: 2, ChurnPerStep: 1, Mix: Mix{Batch: 1}})
	t.Cleanup(r.Stop)
	p := r.Pods()[0]
	r.Step()
	r.Step()
	got, _ := r.Pod(p.UID)
	for _, c := range got.Containers {
		if c.State != runtimeapi.ContainerState_CONTAINER_EXITED || c.ExitCode != 0 || c.Reason != "Completed" {
			t.Errorf("batch container = %+v", c)
		}
	}
	r.Step()
	got, _ = r.Pod(p.UID)
	if got.Sandboxes[0].State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || got.Sandboxes[0].IP != "" {
		t.Errorf("finished batch sandbox = %+v", got.Sandboxes[0])
	}
	r.Step()
	if _, ok := r.Pod(p.UID); ok {
		t.Error("finished batch pod not removed")
	}
	pods := r.Pods()
	if len(pods) != 1 || pods[0].Behaviour != Batch || pods[0].UID == p.UID {
		t.Errorf("no new batch pod: %+v", pods)
	}
}

func TestRollingUpdateReplacesPods(t *testing.T) {
	r := New(Config{Seed: 8, Pods: 1, ContainersPerPod: 1, ChurnPerStep: 1, Mix: Mix{RollingUpdate: 1}})
	t.Cleanup(r.Stop)
	old := r.Pods()[0]
	r.Step()
	pods := r.Pods()
	if len(pods) != 2 {
		t.Fatalf("%d pods after an update, want 2", len(pods))
	}
	next := pods[1]
	app := old.Name[:strings.Index(old.Name, "-")]
	if !strings.HasPrefix(next.Name, app+"-") || next.Namespace != old.Namespace || next.UID == old.UID {
		t.Errorf("replacement %s/%s for %s/%s", next.Namespace, next.Name, old.Namespace, old.Name)
	}
	if o := pods[0]; o.Sandboxes[0].State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || o.Containers[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old pod not stopped: %+v", o)
	}
	r.Step()
	uids := []string{}
	for _, p := range r.Pods() {
		uids = append(uids, p.UID)
	}
	if slices.Contains(uids, old.UID) || !slices.Contains(uids, next.UID) || len(uids) != 2 {
		t.Errorf("after the second step: %v (old %s, next %s)", uids, old.UID, next.UID)
	}
}

func TestRunOnFakeClock(t *testing.T) {
	clk := fakeClock()
	r := New(Config{Clock: clk, Pods: 2, ChurnPerStep: 1})
	t.Cleanup(r.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	r.Run(ctx, time.Second)
	for want := uint64(1); want <= 3; want++ {
		waitFor(t, "the step timer", clk.HasWaiters)
		clk.Step(time.Second)
		waitFor(t, "a step", func() bool { return r.StepCount() == want })
	}
	// The timer is re-armed after the step is counted: wait for it, or
	// "no waiters" below could be the moment in between.
	waitFor(t, "the step timer", clk.HasWaiters)
	cancel()
	// Only Run's return stops its timer: once it has, no step can come,
	// however long the test waited.
	waitFor(t, "Run to end", func() bool { return !clk.HasWaiters() })
	clk.Step(time.Second)
	if n := r.StepCount(); n != 3 {
		t.Errorf("StepCount = %d after cancel", n)
	}
}

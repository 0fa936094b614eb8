package sim_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// TestWithProjectClient drives the simulator with the project's own CRI
// client, as the generator does.
func TestWithProjectClient(t *testing.T) {
	r := sim.New(sim.Config{Seed: 11, Pods: 5, ContainersPerPod: 2})
	if err := r.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	c, err := cri.Dial(r.Endpoint(), cri.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	name, _, err := c.Version(ctx)
	if err != nil || name != sim.RuntimeName {
		t.Fatalf("Version: %q %v", name, err)
	}
	pods, err := c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 5 {
		t.Fatalf("%d pods listed, want 5", len(pods))
	}
	for _, p := range pods {
		if len(p.Sandboxes) != 1 || len(p.Containers) != 2 || p.Name == "" || p.Namespace == "" {
			t.Errorf("pod %+v", p)
		}
	}
	st, err := c.PodStatus(ctx, pods[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(st.IPs) != 1 || len(st.ContainerStatuses) != 2 || len(st.SandboxStatuses) != 1 || st.ContainerStatuses[0].StartedAt.IsZero() {
		t.Errorf("status %+v", st)
	}
	one, err := c.ListPod(ctx, pods[1].UID)
	if err != nil || one == nil || one.UID != pods[1].UID {
		t.Fatalf("ListPod: %+v %v", one, err)
	}

	// Pods and statuses through the runtime interface the generator uses.
	var rt cruntime.Runtime = c
	r.SetRuntimeReady(false, "Testing", "not ready on purpose")
	if sc, ok := rt.(cruntime.StatusChecker); ok {
		conds, err := sc.Status(ctx)
		if err != nil || len(conds) != 2 || conds[0].Type != cruntime.RuntimeReady || conds[0].Status || conds[0].Reason != "Testing" {
			t.Errorf("Status: %+v %v", conds, err)
		}
	}
	p, err := r.AddPod(sim.PodSpec{Name: "late", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	lp, err := rt.ListPod(ctx, types.UID(p.UID))
	if err != nil || lp == nil || len(lp.Containers) != 1 || lp.Containers[0].ID != p.Containers[0].ID {
		t.Fatalf("ListPod of a new pod: %+v %v", lp, err)
	}
	if err := r.RemovePod(p.UID); err != nil {
		t.Fatal(err)
	}
	if lp, err := rt.ListPod(ctx, types.UID(p.UID)); err != nil || lp != nil {
		t.Errorf("ListPod of a removed pod: %+v %v", lp, err)
	}
}

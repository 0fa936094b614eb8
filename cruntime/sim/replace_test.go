package sim

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ReplacePerStep replaces the oldest pods each Step with pods of their
// own, and SandboxAnnotationBytes gives each sandbox an annotation of
// that size that only its pod has.
func TestReplacePods(t *testing.T) {
	r := New(Config{Clock: fakeClock(), Seed: 1, Pods: 5, ContainersPerPod: 2, ReplacePerStep: 2, SandboxAnnotationBytes: 4096, KubeletMetadata: true})
	t.Cleanup(r.Stop)
	before := r.Pods()
	r.Step()
	after := r.Pods()
	if len(after) != 5 {
		t.Fatalf("%d pods after a step, want 5", len(after))
	}
	uids := map[string]bool{}
	for _, p := range after {
		uids[p.UID] = true
		if len(p.Containers) != 2 {
			t.Errorf("pod %s: %d containers, want 2", p.Name, len(p.Containers))
		}
	}
	for i, p := range before {
		if gone := !uids[p.UID]; gone != (i < 2) {
			t.Errorf("pod %d of 5 (%s): replaced %v", i, p.Name, gone)
		}
	}
	sbs, err := serve(t, r).ListPodSandbox(ctxT(t), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sb := range sbs.Items {
		v := sb.Annotations[NetworkStatusAnnotation]
		if len(v) < 4000 || len(v) > 4200 || seen[v] {
			t.Errorf("sandbox %s: a network status of %d bytes, seen before %v", sb.Id, len(v), seen[v])
		}
		seen[v] = true
	}
}

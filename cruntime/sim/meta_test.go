package sim

import (
	"maps"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"
)

// With KubeletMetadata, every sandbox and container carries a kubelet's
// labels and annotations: the replicas of a workload share every value
// but kubernetes.io/config.seen and the io.kubernetes.pod.* labels, and a
// restarted container keeps its annotations with its restart count.
// Without it, they carry what they always did.
func TestKubeletMetadata(t *testing.T) {
	r := New(Config{Seed: 7, Pods: 40, ContainersPerPod: 2, Mix: Mix{Steady: 1}, KubeletMetadata: true})
	byApp := map[string]*pod{}
	replicas := 0
	for _, p := range r.order {
		sb, c := p.sandboxes[0], p.containers[0]
		for _, k := range []string{"app", "pod-template-hash", cruntime.LabelPodUID} {
			if sb.labels[k] == "" {
				t.Fatalf("pod %s: sandbox label %s missing: %v", p.name, k, sb.labels)
			}
		}
		for _, k := range []string{"kubernetes.io/config.seen", "kubernetes.io/config.source"} {
			if sb.annotations[k] == "" {
				t.Fatalf("pod %s: sandbox annotation %s missing: %v", p.name, k, sb.annotations)
			}
		}
		for _, k := range []string{"io.kubernetes.container.hash", "io.kubernetes.container.restartCount", "io.kubernetes.container.terminationMessagePolicy", "io.kubernetes.container.ports"} {
			if c.annotations[k] == "" {
				t.Fatalf("pod %s: container annotation %s missing: %v", p.name, k, c.annotations)
			}
		}
		other, ok := byApp[p.namespace+"/"+p.app]
		if !ok {
			byApp[p.namespace+"/"+p.app] = p
			continue
		}
		replicas++
		if !maps.Equal(c.annotations, other.containers[0].annotations) {
			t.Errorf("replicas %s and %s: container annotations differ: %v, %v", p.name, other.name, c.annotations, other.containers[0].annotations)
		}
		if sb.labels["pod-template-hash"] != other.sandboxes[0].labels["pod-template-hash"] {
			t.Errorf("replicas %s and %s: pod-template-hash differs", p.name, other.name)
		}
	}
	if replicas == 0 {
		t.Fatal("no two pods of one workload: nothing shared to check")
	}
	p := r.order[0]
	name := p.names[0]
	before := maps.Clone(p.latest(name).annotations)
	if _, err := r.RestartContainer(p.uid, name); err != nil {
		t.Fatal(err)
	}
	after := p.latest(name).annotations
	if after["io.kubernetes.container.restartCount"] != "1" || after["io.kubernetes.container.hash"] != before["io.kubernetes.container.hash"] {
		t.Errorf("restarted container's annotations %v, before %v", after, before)
	}

	plain := New(Config{Seed: 7, Pods: 1, ContainersPerPod: 1, Mix: Mix{Steady: 1}})
	if sb := plain.order[0].sandboxes[0]; sb.labels["app"] != "" || len(sb.annotations) != 1 {
		t.Errorf("without KubeletMetadata: sandbox labels %v, annotations %v", sb.labels, sb.annotations)
	}
}

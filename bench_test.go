package pleg

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// benchPod builds a running pod with one ready sandbox and n running
// containers; gen distinguishes the container IDs of successive attempts.
func benchPod(i, n, gen int) *cruntime.Pod {
	uid := types.UID(fmt.Sprintf("pod-%05d", i))
	p := &cruntime.Pod{UID: uid, Name: fmt.Sprintf("app-%05d", i), Namespace: "default"}
	p.Sandboxes = []*cruntime.Container{{ID: fmt.Sprintf("sb-%05d", i), Name: p.Name, State: cruntime.StateRunning}}
	for c := range n {
		p.Containers = append(p.Containers, &cruntime.Container{
			ID: fmt.Sprintf("ctr-%05d-%02d-%d", i, c, gen), Name: fmt.Sprintf("c%d", c), State: cruntime.StateRunning,
		})
	}
	return p
}

func BenchmarkDiff(b *testing.B) {
	const n = 10
	b.Run("unchanged", func(b *testing.B) {
		old, cur := benchPod(1, n, 0), benchPod(1, n, 0) // equal, not the same objects
		b.ReportAllocs()
		for b.Loop() {
			if ev := Diff(old.UID, old, cur); ev != nil {
				b.Fatal(ev)
			}
		}
	})
	b.Run("one-restarted", func(b *testing.B) {
		// One container restarted with a new ID, its old attempt removed:
		// Died and Removed for the old ID, Started for the new.
		old, cur := benchPod(1, n, 0), benchPod(1, n, 0)
		cur.Containers[3].ID += "-restarted"
		b.ReportAllocs()
		for b.Loop() {
			if ev := Diff(old.UID, old, cur); len(ev) != 3 {
				b.Fatal(ev)
			}
		}
	})
	b.Run("new-pod", func(b *testing.B) {
		cur := benchPod(1, n, 0)
		b.ReportAllocs()
		for b.Loop() {
			if ev := Diff(cur.UID, nil, cur); len(ev) != n+1 {
				b.Fatal(ev)
			}
		}
	})
}

// TestDiffUnchangedAllocs guards the steady-state fast path: diffing a pod
// against an equal listing allocates nothing.
func TestDiffUnchangedAllocs(t *testing.T) {
	old, cur := benchPod(1, 10, 0), benchPod(1, 10, 0)
	if a := testing.AllocsPerRun(100, func() { Diff(old.UID, old, cur) }); a != 0 {
		t.Fatalf("Diff of an unchanged pod: %v allocations, want 0", a)
	}
}

// benchRuntime is a minimal in-memory runtime for the relist benchmarks:
// it returns prebuilt listings (alternating between them, one per call)
// and statuses made from the listing, so that what is measured is the generator alone.
type benchRuntime struct {
	listings [][]*cruntime.Pod
	next     atomic.Int64
	calls    atomic.Int64
}

func (r *benchRuntime) ListPods(context.Context) ([]*cruntime.Pod, error) {
	i := r.next.Add(1) - 1
	return r.listings[int(i)%len(r.listings)], nil
}

func (r *benchRuntime) ListPod(_ context.Context, uid types.UID) (*cruntime.Pod, error) {
	for _, p := range r.listings[0] {
		if p.UID == uid {
			return p, nil
		}
	}
	return nil, nil
}

func (r *benchRuntime) ItemStatuses(_ context.Context, p *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	r.calls.Add(1)
	sbOut := make([]*cruntime.SandboxStatus, len(sbs))
	for i, sb := range sbs {
		sbOut[i] = &cruntime.SandboxStatus{ID: sb.ID, State: sb.State, IPs: []string{"10.88.0.1"}}
	}
	ctOut := make([]*cruntime.ContainerStatus, len(cts))
	for i, c := range cts {
		ctOut[i] = &cruntime.ContainerStatus{ID: c.ID, Name: c.Name, State: c.State}
	}
	return sbOut, ctOut, nil
}

// newBenchNode returns a runtime of pods x containers whose successive
// listings differ in changed pods (a container restarted each time).
func newBenchNode(pods, containers, changed int) *benchRuntime {
	r := &benchRuntime{}
	gens := 1
	if changed > 0 {
		gens = 2
	}
	for gen := range gens {
		var l []*cruntime.Pod
		for i := range pods {
			g := 0
			if i < changed {
				g = gen
			}
			l = append(l, benchPod(i, containers, g))
		}
		r.listings = append(r.listings, l)
	}
	return r
}

func benchRelist(b *testing.B, rt *benchRuntime, parallel int, wantCalls int64) {
	g, err := New(Options{Runtime: rt, MaxParallelInspections: parallel, Events: EventsOff})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Stop()
	ctx := context.Background()
	// Warm up: the first relist inspects every pod.
	for range 2 {
		if err := g.Relist(ctx); err != nil {
			b.Fatal(err)
		}
	}
	rt.calls.Store(0)
	b.ReportAllocs()
	n := int64(0)
	for b.Loop() {
		if err := g.Relist(ctx); err != nil {
			b.Fatal(err)
		}
		n++
	}
	if got := rt.calls.Load(); got != wantCalls*n {
		b.Fatalf("%d pod inspections in %d relists, want %d per relist", got, n, wantCalls)
	}
}

// BenchmarkRelistIdle1000x10 is one relist of 1,000 pods of 10 containers
// where nothing changed: the listing is compared and nothing inspected.
func BenchmarkRelistIdle1000x10(b *testing.B) {
	benchRelist(b, newBenchNode(1000, 10, 0), 0, 0)
}

// BenchmarkRelistChanged1000x10 is one relist of 1,000 pods of 10
// containers with 10 pods changed (each inspected, 3 events each).
func BenchmarkRelistChanged1000x10(b *testing.B) {
	for _, c := range []struct {
		name     string
		parallel int
	}{{"parallel", 0}, {"serial", 1}} {
		b.Run(c.name, func(b *testing.B) {
			benchRelist(b, newBenchNode(1000, 10, 10), c.parallel, 10)
		})
	}
}

func (r *benchRuntime) Identities(context.Context, *cruntime.Pod, []*cruntime.Container) ([]*cruntime.Identity, error) {
	return nil, cruntime.ErrIdentityUnsupported
}

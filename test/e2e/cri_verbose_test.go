package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestMeasureVerboseStatusCost measures what a verbose status costs
// containerd 2.2 beside a plain one: containerd's CPU per call and the
// answer's bytes, for a pod with a running and an exited container, each
// method in the order plain, verbose, verbose, plain (so that a drift in
// the machine's load counts against both). With --cri-socket, pleg's
// relist makes its ContainerStatus calls verbose (one per changed
// container); its PodSandboxStatus calls stay plain, and their verbose
// cost is measured for the record. The MEASURE lines state the trade that
// docs/cri.md and docs/performance.md give; the test asserts causes only:
// a verbose answer carries the runtime's info (with the init PID of a
// running container) and is larger than the plain one.
func TestMeasureVerboseStatusCost(t *testing.T) {
	e := useRuntime(t, "2.2")
	pid := containerdPid(t, e)
	t.Cleanup(func() { drainEventBacklog(t, e) })
	sb, _ := RunPod(t, "verbose-cost")
	running := CreateAndStart(t, sb, "app", []string{"run"})
	exited := CreateAndStart(t, sb, "done", []string{"exit", "0"})
	rt := RuntimeClient()
	eventually(t, 20*time.Second, "the second container exited", func() error {
		r, err := rt.ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: exited})
		if err != nil {
			return err
		}
		if s := r.GetStatus().GetState(); s != runtimeapi.ContainerState_CONTAINER_EXITED {
			return fmt.Errorf("state %v", s)
		}
		return nil
	})

	const rounds = 200
	type cost struct {
		cpu   time.Duration
		bytes int
		calls int
	}
	// phase makes rounds calls of one kind for each of ids.
	phase := func(sandbox, verbose bool, ids ...string) cost {
		t.Helper()
		waitQuiet(t, pid)
		c0 := threadCPU(t, pid)
		var c cost
		for range rounds {
			for _, id := range ids {
				var r proto.Message
				var err error
				if sandbox {
					r, err = rt.PodSandboxStatus(criCtx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
				} else {
					var cr *runtimeapi.ContainerStatusResponse
					cr, err = rt.ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
					if err == nil && verbose && cr.GetInfo()["info"] == "" {
						t.Fatalf("a verbose ContainerStatus of %s has no info: %v", id, cr.GetInfo())
					}
					r = cr
				}
				if err != nil {
					t.Fatal(err)
				}
				c.bytes += proto.Size(r)
				c.calls++
			}
		}
		c.cpu = threadCPU(t, pid).since(c0)
		return c
	}
	add := func(a, b cost) cost { return cost{a.cpu + b.cpu, a.bytes + b.bytes, a.calls + b.calls} }
	per := func(c cost) (time.Duration, int) { return c.cpu / time.Duration(c.calls), c.bytes / c.calls }
	for _, k := range []struct {
		name    string
		sandbox bool
		ids     []string
	}{{"ContainerStatus", false, []string{running, exited}}, {"PodSandboxStatus", true, []string{sb}}} {
		// plain, verbose, verbose, plain: a drift in the machine's load
		// counts against both.
		plain := phase(k.sandbox, false, k.ids...)
		verbose := add(phase(k.sandbox, true, k.ids...), phase(k.sandbox, true, k.ids...))
		plain = add(plain, phase(k.sandbox, false, k.ids...))
		pc, pb := per(plain)
		vc, vb := per(verbose)
		measure(t, "verbose_status_cost method=%s calls=%d containerd_cpu_per_call plain=%v verbose=%v (%.2fx, +%v) bytes_per_answer plain=%d verbose=%d (%.1fx)",
			k.name, verbose.calls, pc.Round(time.Microsecond), vc.Round(time.Microsecond), float64(vc)/float64(pc), (vc - pc).Round(time.Microsecond), pb, vb, float64(vb)/float64(pb))
		if vb <= pb {
			t.Errorf("%s: verbose answers average %d bytes, plain ones %d: want the verbose ones larger", k.name, vb, pb)
		}
	}
	r, err := rt.ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: running, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.GetInfo()["info"], `"pid"`) {
		t.Errorf("a running container's verbose info has no pid: %.200s", r.GetInfo()["info"])
	}
}

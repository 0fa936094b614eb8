package pleg_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	testclock "k8s.io/utils/clock/testing"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/metrics"
)

// inspector is a generator relisted by hand against a shared simulated
// runtime, with its own CRI client and registry.
type inspector struct {
	gen    *pleg.Generator
	reg    *prometheus.Registry
	events <-chan *pleg.Event
}

func newInspector(t *testing.T, endpoint string, full bool) *inspector {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	rt, err := cri.Dial(endpoint, cri.WithTimeout(5*time.Second), cri.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	g, err := pleg.New(pleg.Options{Runtime: rt, Metrics: m, Events: pleg.EventsOff, FullInspection: full})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return &inspector{gen: g, reg: reg, events: g.Watch()}
}

// relist relists and returns the events, sorted.
func (in *inspector) relist(t *testing.T) []string {
	t.Helper()
	if err := in.gen.Relist(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		select {
		case e := <-in.events:
			out = append(out, fmt.Sprintf("%s %s %s %v", e.PodUID, e.Type, e.ContainerID, exitCode(e)))
		default:
			slices.Sort(out)
			return out
		}
	}
}

func exitCode(e *pleg.Event) any {
	if e.ExitCode == nil {
		return "-"
	}
	return *e.ExitCode
}

// counter sums the samples of a counter family, for the label value given
// ("" for all).
func counter(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if value == "" || labelIs(m, label, value) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// canonical is a cache entry in a form two generators can be compared by:
// items created at the same instant are in listing order, which a runtime
// does not keep from one list call to the next, so ties are ordered by ID.
func canonical(s *cruntime.PodStatus) *cruntime.PodStatus {
	if s == nil {
		return nil
	}
	c := *s
	c.SandboxStatuses = slices.Clone(s.SandboxStatuses)
	c.ContainerStatuses = slices.Clone(s.ContainerStatuses)
	slices.SortStableFunc(c.SandboxStatuses, func(a, b *cruntime.SandboxStatus) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	slices.SortStableFunc(c.ContainerStatuses, func(a, b *cruntime.ContainerStatus) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return &c
}

// mutate makes one random change to the simulated node: what a kubelet and
// its containers do to a runtime (start, exit, restart, remove, stop a pod,
// remove it, recreate its sandbox with a new IP, add a pod).
func mutate(t *testing.T, r *rand.Rand, s *sim.Runtime) string {
	t.Helper()
	pods := s.Pods()
	if len(pods) == 0 || r.IntN(10) == 0 {
		names := []string{"app", "sidecar", "init"}[:1+r.IntN(3)]
		p, err := s.AddPod(sim.PodSpec{Containers: names, CreatedOnly: r.IntN(3) == 0, HostNetwork: r.IntN(4) == 0})
		if err != nil {
			t.Fatal(err)
		}
		return "add " + p.UID
	}
	p := pods[r.IntN(len(pods))]
	var err error
	var what string
	switch k := r.IntN(8); {
	case k == 0:
		what, err = "stop pod", s.StopPod(p.UID)
	case k == 1 && r.IntN(2) == 0:
		what, err = "remove pod", s.RemovePod(p.UID)
	case k == 2:
		what = "recreate sandbox"
		_, err = s.RecreateSandbox(p.UID)
	case len(p.Containers) == 0:
		return "nothing"
	default:
		c := p.Containers[r.IntN(len(p.Containers))]
		switch r.IntN(4) {
		case 0:
			what, err = "start "+c.ID, s.StartContainer(c.ID)
		case 1:
			what, err = "exit "+c.ID, s.ExitContainer(c.ID, int32(r.IntN(3)))
		case 2:
			what = "restart " + c.Name
			_, err = s.RestartContainer(p.UID, c.Name)
		default:
			what, err = "remove "+c.ID, s.RemoveContainer(c.ID)
		}
	}
	if err != nil {
		// Not every change applies to every state (starting a running
		// container, say); the runtime refuses and nothing changes.
		return what + ": refused"
	}
	return what
}

// TestDeltaInspectionMatchesFull is the property of delta inspection: after
// every relist, over random changes to a node, a generator that fetches only
// the changed items has the same cache and emitted the same events as one
// that fetches every item of a changed pod, as the kubelet does; and it made
// fewer status calls.
func TestDeltaInspectionMatchesFull(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
			s := sim.New(sim.Config{Clock: clk, Seed: seed + 1, Pods: 8, ContainersPerPod: 3, ChurnPerStep: 2,
				Mix: sim.Mix{Steady: 1, CrashLoop: 2, Batch: 1, RollingUpdate: 1}})
			if err := s.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Stop)
			full := newInspector(t, s.Endpoint(), true)
			delta := newInspector(t, s.Endpoint(), false)
			r := rand.New(rand.NewPCG(seed, 7))
			for step := range 60 {
				var did []string
				for range r.IntN(4) {
					did = append(did, mutate(t, r, s))
				}
				s.Step()
				clk.Step(time.Duration(1+r.IntN(3)) * time.Second)
				fe, de := full.relist(t), delta.relist(t)
				if !slices.Equal(fe, de) {
					t.Fatalf("step %d (%v): events differ\nfull:  %v\ndelta: %v", step, did, fe, de)
				}
				fc, dc := full.gen.Cache().List(), delta.gen.Cache().List()
				if len(fc) != len(dc) {
					t.Fatalf("step %d (%v): %d cache entries with full inspection, %d with delta", step, did, len(fc), len(dc))
				}
				for _, f := range fc {
					uid := f.Status.UID
					d, ok := delta.gen.Cache().Entry(uid)
					if !ok {
						t.Fatalf("step %d: pod %s cached by full inspection only", step, uid)
					}
					if fs, ds := canonical(f.Status), canonical(d.Status); !reflect.DeepEqual(fs, ds) || fmt.Sprint(f.Err) != fmt.Sprint(d.Err) {
						t.Fatalf("step %d (%v): pod %s\nfull:  %s (err %v)\ndelta: %s (err %v)", step, did, uid, dump(fs), f.Err, dump(ds), d.Err)
					}
				}
			}
			calls := func(in *inspector) float64 {
				return counter(t, in.reg, "kubelet_runtime_operations_total", "operation_type", "container_status") +
					counter(t, in.reg, "kubelet_runtime_operations_total", "operation_type", "podsandbox_status")
			}
			fc, dc := calls(full), calls(delta)
			reused := counter(t, delta.reg, "pleg_pod_status_items_total", "source", "reused")
			t.Logf("status calls: full %v, delta %v; items reused %v", fc, dc, reused)
			if dc >= fc || reused == 0 {
				t.Errorf("delta inspection made %v status calls against full's %v, reusing %v items: it reused nothing", dc, fc, reused)
			}
			if got := counter(t, full.reg, "pleg_pod_status_items_total", "source", "reused"); got != 0 {
				t.Errorf("full inspection reused %v items", got)
			}
		})
	}
}

func dump(s *cruntime.PodStatus) string {
	if s == nil {
		return "<nil>"
	}
	out := fmt.Sprintf("%s ips=%v", s.UID, s.IPs)
	for _, sb := range s.SandboxStatuses {
		out += fmt.Sprintf("\n  sandbox %+v", *sb)
	}
	for _, c := range s.ContainerStatuses {
		out += fmt.Sprintf("\n  container %+v", *c)
	}
	return out
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/internal/lineproto"
	"github.com/podlifecycle/pleg/metrics"
)

// TestMeasureContainerdCPU measures, on the real containerd, containerd's
// own CPU time per relist under churn: pleg's (a library generator, events
// off, relists driven by hand) against the kubelet v1.37.2's own relist
// (the kubelet-relist program of test/kubelet: the kubelet's GenericPLEG,
// kuberuntime manager and CRI client) pointed at the same socket, with the
// same pods and the same changes. 10 pods of 3 containers; before each of
// 10 measured relists, 4 pods each get one container restarted (a new
// attempt created and started, the old one stopped and removed), outside
// the measured window, and containerd is let go quiet. containerd's CPU is
// the run time of its threads (/proc/<pid>/task/*/schedstat, in ns) around
// each relist. Most of the test's time is creating and removing the pods.
//
// On every runtime (TestMeasureContainerdCPU/containerd-<version>).
func TestMeasureContainerdCPU(t *testing.T) {
	forEachRuntime(t, testMeasureContainerdCPU)
}

const (
	cpuPods, cpuContainers, cpuChanged, cpuRelists = 10, 3, 4, 10
)

func testMeasureContainerdCPU(t *testing.T, e *env) {
	// Registered first, so it runs after the pods' own cleanups.
	t.Cleanup(func() { drainEventBacklog(t, e) })
	bin := kubeletRelistBin(t, e)
	pid := containerdPid(t, e)
	pods := runLoad(t, "cpu", cpuPods, cpuContainers)
	next := 0
	churn := func(t *testing.T) {
		t.Helper()
		idx := make([]int, cpuChanged)
		for i := range idx {
			idx[i] = next % len(pods)
			next++
		}
		inParallel(t, len(idx), len(idx), func(tb testing.TB, i int) {
			p := &pods[idx[i]]
			old := p.containers[0]
			p.containers[0] = CreateAndStart(tb, p.sandbox, "c0", []string{"run"})
			StopContainer(tb, old, 0)
			RemoveContainer(tb, old)
		})
		waitQuiet(t, pid)
	}

	type result struct {
		cpu    time.Duration // containerd's, over the measured relists
		calls  float64       // runtime calls, over the measured relists
		events int
	}
	measureOne := func(name string, relist func() (calls float64, events int, err error)) result {
		var r result
		for i := 0; i < 2; i++ { // warm-up: every pod is new, then nothing changed
			if _, _, err := relist(); err != nil {
				t.Fatalf("%s: warm-up relist: %v", name, err)
			}
		}
		for i := 0; i < cpuRelists; i++ {
			churn(t)
			c0 := threadCPU(t, pid)
			calls, events, err := relist()
			c1 := threadCPU(t, pid)
			if err != nil {
				t.Fatalf("%s: relist: %v", name, err)
			}
			r.cpu += c1.since(c0)
			r.calls += calls
			r.events += events
		}
		return r
	}

	k := measureOne("kubelet", startKubeletRelist(t, bin))
	p := measureOne("pleg", startPLEGRelist(t))
	// The floor under both: the listing's two calls alone, every reply
	// discarded (cri.Client.ListDiscard), which each relist makes in full.
	// A relist of pleg's cannot cost containerd less.
	var floor time.Duration
	bare, err := cri.Dial(CRIEndpoint(), cri.WithTimeout(10*time.Second), cri.WithLogger(logr.Discard()))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	for i := -1; i < cpuRelists; i++ {
		waitQuiet(t, pid)
		c0 := threadCPU(t, pid)
		_, err := bare.ListDiscard(context.Background())
		c1 := threadCPU(t, pid)
		if err != nil {
			t.Fatalf("bare list calls: %v", err)
		}
		if i >= 0 { // the first dials
			floor += c1.since(c0)
		}
	}

	// The kubelet's GetPodStatus: per changed pod its sandbox and its 3
	// containers (the old attempt is removed); the listing two calls.
	if want := float64(cpuRelists * (2 + cpuChanged*(1+cpuContainers))); k.calls != want {
		t.Errorf("kubelet: %v runtime calls over %d relists, want %v", k.calls, cpuRelists, want)
	}
	// Each restart: the new container started, the old one died and was
	// removed; both generators see the same.
	if k.events != p.events || k.events < cpuRelists*cpuChanged*2 {
		t.Errorf("events over the relists: kubelet %d, pleg %d, want equal and at least %d", k.events, p.events, cpuRelists*cpuChanged*2)
	}
	if p.calls >= k.calls {
		t.Errorf("pleg made %v runtime calls, the kubelet %v: no fewer", p.calls, k.calls)
	}
	n := float64(cpuRelists)
	ratio := -1.0
	if k.cpu > 0 {
		ratio = float64(p.cpu) / float64(k.cpu)
	}
	floorRatio := -1.0
	if k.cpu > 0 {
		floorRatio = float64(floor) / float64(k.cpu)
	}
	measure(t, "containerd_cpu_per_relist pleg=%s kubelet=%s ratio=%.2f list_calls_alone=%s (%.2f of the kubelet's) calls_per_relist pleg=%.1f kubelet=%.1f pods=%d containers=%d changed=%d relists=%d",
		ms(time.Duration(float64(p.cpu)/n)), ms(time.Duration(float64(k.cpu)/n)), ratio,
		ms(time.Duration(float64(floor)/n)), floorRatio, p.calls/n, k.calls/n,
		cpuPods, cpuContainers, cpuChanged, cpuRelists)
	if floor <= 0 {
		t.Errorf("containerd spent %v on %d pairs of list calls: not measured", floor, cpuRelists)
	}
}

// kubeletRelistBin builds the kubelet-relist program (and the kubelet) with
// test/kubelet/build.sh, the one entry point every suite builds them
// through, into <cache>/kubelet (cached; locked against other suites).
var kubeletRelistBin = func() func(t *testing.T, e *env) string {
	var (
		once sync.Once
		bin  string
		err  error
	)
	return func(t *testing.T, e *env) string {
		t.Helper()
		once.Do(func() {
			out := filepath.Join(e.cacheDir, "kubelet")
			ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
			defer cancel()
			start := time.Now()
			b, berr := exec.CommandContext(ctx, "bash", filepath.Join(e.repoRoot, "test", "kubelet", "build.sh"), out).CombinedOutput()
			if berr != nil {
				err = fmt.Errorf("test/kubelet/build.sh %s: %v\n%s", out, berr, b)
				return
			}
			logf("kubelet-relist ready in %v", time.Since(start).Round(time.Millisecond))
			bin = filepath.Join(out, "kubelet-relist")
		})
		if err != nil {
			t.Fatal(err)
		}
		return bin
	}
}()

// startPLEGRelist returns a relist function of a library generator on
// the suite's containerd (events off), stopped at the end of t.
func startPLEGRelist(t *testing.T) func() (float64, int, error) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	client, err := cri.Dial(CRIEndpoint(), cri.WithTimeout(10*time.Second), cri.WithMetrics(m), cri.WithLogger(logr.Discard()))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pleg.New(pleg.Options{Runtime: client, Metrics: m, Events: pleg.EventsOff})
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Stop()
		client.Close()
	})
	events := g.Watch()
	calls := func() float64 {
		var n float64
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kubelet_runtime_operations_total" {
				for _, mt := range mf.GetMetric() {
					n += mt.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	return func() (float64, int, error) {
		c0 := calls()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := g.Relist(ctx)
		n := 0
		for drained := false; !drained; {
			select {
			case <-events:
				n++
			default:
				drained = true
			}
		}
		return calls() - c0, n, err
	}
}

// startKubeletRelist starts the kubelet-relist program on the suite's
// containerd and returns a relist function; the program is stopped at the
// end of t (killed if it does not quit), and killed by a relist that does
// not answer within a minute.
func startKubeletRelist(t *testing.T, bin string) func() (float64, int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c, _, err := lineproto.Start("kubelet-relist", exec.CommandContext(ctx, bin, "--endpoint", CRIEndpoint(), "--runtime-request-timeout", "10s"), nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
	})
	return func() (float64, int, error) {
		stop := time.AfterFunc(time.Minute, cancel)
		defer stop.Stop()
		var r struct {
			Calls      map[string]float64 `json:"calls"`
			Events     int                `json:"events"`
			ListFailed bool               `json:"listFailed"`
		}
		if err := c.CallJSON(&r, "relist"); err != nil {
			return 0, 0, err
		}
		if r.ListFailed {
			return 0, 0, errors.New("kubelet-relist: the listing failed")
		}
		var calls float64
		for _, v := range r.Calls {
			calls += v
		}
		return calls, r.Events, nil
	}
}

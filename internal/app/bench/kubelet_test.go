package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kubeletRelist builds the kubelet-relist program with test/kubelet/build.sh,
// the one entry point every suite builds the kubelet through, into the
// directory the e2e suite uses ($PLEG_E2E_CACHE/kubelet, default
// <repo>/.cache/e2e/kubelet): when both suites run at once, one builds and
// the other waits on the script's lock and reuses the binaries.
func kubeletRelist(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "kubelet", "build.sh")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	cache := os.Getenv("PLEG_E2E_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache", "e2e")
	}
	out := filepath.Join(cache, "kubelet")
	// A cold build compiles the kubelet: minutes on a small machine.
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	start := time.Now()
	b, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "kubelet", "build.sh"), out).CombinedOutput()
	if err != nil {
		t.Fatalf("test/kubelet/build.sh %s: %v\n%s", out, err, b)
	}
	t.Logf("kubelet-relist ready in %v", time.Since(start).Round(time.Millisecond))
	return filepath.Join(out, "kubelet-relist")
}

// TestKubeletBaseline runs small scenarios with both columns and checks
// that the kubelet's is the kubelet v1.37 algorithm (unchanged since v1.36): per changed pod one
// PodSandboxStatus per sandbox and one ContainerStatus per container, one
// pod after another, with no pod inspection timeout; the same events as
// pleg's; and every figure measured in its own process.
func TestKubeletBaseline(t *testing.T) {
	bin := kubeletRelist(t)
	sc := small()
	idle := Scenario{Name: "110x5-idle", Pods: 110, Containers: 5, Relists: 3, KubeletRelists: 3, RequestTimeout: 5 * time.Second}
	hung := Scenario{
		Name: "hung", Pods: 6, Containers: 2, HungPods: 1,
		Relists: 3, KubeletRelists: 2,
		RequestTimeout:    600 * time.Millisecond,
		InspectionTimeout: 100 * time.Millisecond,
	}
	rep, err := Run(context.Background(), Options{Scenarios: []Scenario{sc, idle, hung}, Kubelet: bin})
	if err != nil {
		t.Fatal(err)
	}

	res := rep.Scenarios[0]
	p, k := res.PLEG, res.Kubelet
	if p == nil || k == nil {
		t.Fatalf("runs: pleg %v, kubelet %v", p, k)
	}
	checkRun(t, sc, p, sc.Relists)
	checkRun(t, sc, k, sc.KubeletRelists)
	// pleg's delta inspection fetches only what changed, so the bench's
	// probe must not hide the client's single-item fetches from it.
	if p.CallsPerRelist >= k.CallsPerRelist {
		t.Errorf("runtime calls per relist: pleg %v (%v), kubelet %v: pleg made no fewer", p.CallsPerRelist, p.CallsByOp, k.CallsPerRelist)
	}
	if k.EventsPerRelist != p.EventsPerRelist {
		t.Errorf("events per relist: kubelet %v, pleg %v", k.EventsPerRelist, p.EventsPerRelist)
	}
	// The kubelet's status calls sleep the latency one after the other: a
	// lower bound that holds however loaded the machine is.
	if min := k.CallsPerRelist * ms(sc.Latency); k.RelistP50Ms < min {
		t.Errorf("kubelet relist p50 %vms, below the %vms its calls sleep one after another", k.RelistP50Ms, min)
	}
	// Its own process: a Go program with the kubelet's packages loaded.
	if k.PeakRSSBytes < 8<<20 || k.ListP50Ms != -1 || k.PodInspectionTimeoutMs != -1 {
		t.Errorf("kubelet: peak RSS %d, list p50 %v, inspection timeout %v", k.PeakRSSBytes, k.ListP50Ms, k.PodInspectionTimeoutMs)
	}
	t.Logf("%s: relist p50 pleg %.1fms kubelet %.1fms; CPU pleg %.2fms kubelet %.2fms; peak RSS pleg %s kubelet %s",
		sc.Name, p.RelistP50Ms, k.RelistP50Ms, p.CPUPerRelistMs, k.CPUPerRelistMs, fmtBytes(float64(p.PeakRSSBytes)), fmtBytes(float64(k.PeakRSSBytes)))

	// Idle: the listing only; the targets are checked against the measured
	// kubelet.
	res = rep.Scenarios[1]
	if k := res.Kubelet; k == nil || k.CallsPerRelist != 2 || k.PodsInspectedPerRelist != 0 || k.EventsPerRelist != 0 || k.CPUPerRelistMs <= 0 {
		t.Errorf("idle kubelet: %+v", k)
	}
	if len(res.Targets) != 2 || !res.Targets[0].Checked || !res.Targets[1].Checked {
		t.Errorf("idle targets not checked: %+v", res.Targets)
	}

	// A hung pod: the kubelet waits for the full request timeout every
	// relist; pleg gives up after its inspection timeout.
	p, k = rep.Scenarios[2].PLEG, rep.Scenarios[2].Kubelet
	if k.RelistP50Ms < ms(hung.RequestTimeout) || k.PodsInspectedPerRelist != 1 {
		t.Errorf("kubelet with a hung pod: relist p50 %vms, %v pods inspected per relist; want at least the request timeout, 1", k.RelistP50Ms, k.PodsInspectedPerRelist)
	}
	if p.RelistMaxMs >= ms(hung.RequestTimeout) || p.InspectionTimeouts < 1 {
		t.Errorf("pleg with a hung pod: relist max %vms, %v inspection timeouts", p.RelistMaxMs, p.InspectionTimeouts)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubelet v1.37.2", "measured relists: pleg 3, kubelet 2", "peak RSS (VmHWM)",
		"kubelet: every relist inspected exactly 4 pods", "target: CPU per relist at most 1/10 of the kubelet's: pleg "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

package crictl

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/api/lifecycle/server"
	"github.com/podlifecycle/pleg/criserve"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

const patience = 30 * time.Second

// node is a simulated runtime, pleg's generator on it and pleg's CRI
// endpoint.
type node struct {
	sim      *sim.Runtime
	plegSock string
	simSock  string
	crictl   string
	config   string // an empty crictl config: no host settings apply
	clock    *clocktesting.FakeClock
}

func startNode(t *testing.T, crictl string) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "crictl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The simulator's clock stands months back: crictl's tables show ages
	// ("8 months ago") that two runs a moment apart agree on.
	clk := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	n := &node{sim: sim.New(sim.Config{Clock: clk, Seed: 7, Pods: 6, ContainersPerPod: 2, KeepExitedAttempts: 2}), crictl: crictl,
		clock: clk, simSock: filepath.Join(dir, "sim.sock"), plegSock: filepath.Join(dir, "pleg.sock"), config: filepath.Join(dir, "crictl.yaml")}
	if err := os.WriteFile(n.config, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.sim.Serve(n.simSock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.sim.Stop)
	client, err := cri.Dial(n.sim.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	gen, err := pleg.New(pleg.Options{Runtime: client, RelistPeriod: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ready := pleg.NewReadiness(gen, pleg.ReadinessOptions{Runtime: client, Interval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	gen.Start()
	readyDone := make(chan struct{})
	go func() {
		defer close(readyDone)
		ready.Run(ctx)
	}()
	srv, err := criserve.New(criserve.Config{Journal: gen.Journal(), Runtime: client.RuntimeService(), Images: client.ImageService(), Conditions: ready})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := server.ListenUnix(n.plegSock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		<-readyDone
		gen.Stop()
	})
	return n
}

// run runs crictl on sock and returns its output and exit code.
func (n *node) run(t *testing.T, sock string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	all := append([]string{"--config", n.config, "--runtime-endpoint", "unix://" + sock, "--image-endpoint", "unix://" + sock, "--timeout", "10s"}, args...)
	cmd := exec.CommandContext(ctx, n.crictl, all...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("crictl %v: %v", args, err)
	}
	return out.String() + errOut.String(), code
}

// both runs crictl on the runtime and on pleg; both must succeed.
func (n *node) both(t *testing.T, args ...string) (runtimeOut, plegOut string) {
	t.Helper()
	r, rc := n.run(t, n.simSock, args...)
	p, pc := n.run(t, n.plegSock, args...)
	if rc != 0 || pc != 0 {
		t.Fatalf("crictl %v: exit %d straight to the runtime (%s), %d through pleg (%s)", args, rc, r, pc, p)
	}
	return r, p
}

// synced waits until crictl ps -a -q lists the same containers both ways.
func (n *node) synced(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		r, p := n.both(t, "ps", "-a", "-q")
		rs, ps := n.both(t, "pods", "-q")
		if lines(r) == lines(p) && lines(rs) == lines(ps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pleg's listing never matched the runtime's:\nruntime %s\npleg    %s", lines(r), lines(p))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lines is out's lines, sorted.
func lines(out string) string {
	ls := strings.Split(strings.TrimSpace(out), "\n")
	sort.Strings(ls)
	return strings.Join(ls, "\n")
}

// TestCrictl proves pleg's read-only CRI endpoint with the real crictl on
// the simulator: it compares crictl's pods, ps -a, inspect and inspectp, as
// tables and as JSON, through pleg and straight to the runtime, and checks
// that runp, stopp, rmp, stop, rm and exec are refused and change
// nothing.
func TestCrictl(t *testing.T) {
	crictl, src, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crictl from %s", src)
	n := startNode(t, crictl)
	pods := n.sim.Pods()
	// Time passes between the changes, as on a node: pleg tells a
	// container's sandbox by creation times (docs/cri.md).
	n.clock.Step(time.Minute)
	if err := n.sim.ExitContainer(pods[0].ContainerIDs()[0], 3); err != nil {
		t.Fatal(err)
	}
	n.clock.Step(time.Minute)
	if _, err := n.sim.RecreateSandbox(pods[1].UID); err != nil {
		t.Fatal(err)
	}
	n.clock.Step(time.Minute)
	if _, err := n.sim.RestartContainer(pods[1].UID, pods[1].Containers[0].Name); err != nil {
		t.Fatal(err)
	}
	n.synced(t)

	r, p := n.both(t, "pods", "-o", "json")
	EqualJSON(t, "crictl pods -o json", Items(t, r, "items", "runtimeHandler"), Items(t, p, "items", "runtimeHandler"))
	r, p = n.both(t, "ps", "-a", "-o", "json")
	EqualJSON(t, "crictl ps -a -o json", Items(t, r, "containers", "imageRef", "imageId", "image.userSpecifiedImage"), Items(t, p, "containers", "imageRef", "imageId", "image.userSpecifiedImage"))
	r, p = n.both(t, "pods")
	t.Logf("crictl pods through pleg:\n%s", p)
	if lines(r) != lines(p) {
		t.Errorf("crictl pods differs:\nruntime:\n%s\npleg:\n%s", r, p)
	}
	r, p = n.both(t, "ps", "-a")
	t.Logf("crictl ps -a through pleg:\n%s", p)
	if lines(r) != lines(p) {
		t.Errorf("crictl ps -a differs:\nruntime:\n%s\npleg:\n%s", r, p)
	}
	cid, sid := pods[0].ContainerIDs()[0], pods[1].SandboxID()
	r, p = n.both(t, "inspect", "-o", "json", cid)
	if r != p {
		t.Errorf("crictl inspect differs:\nruntime:\n%s\npleg:\n%s", r, p)
	}
	r, p = n.both(t, "inspectp", "-o", "json", sid)
	if r != p {
		t.Errorf("crictl inspectp differs:\nruntime:\n%s\npleg:\n%s", r, p)
	}

	// Writes: refused through pleg, the runtime unchanged.
	before, _ := n.run(t, n.simSock, "ps", "-a", "-q")
	beforePods, _ := n.run(t, n.simSock, "pods", "-q")
	dir := t.TempDir()
	podCfg := filepath.Join(dir, "pod.json")
	if err := os.WriteFile(podCfg, []byte(`{"metadata":{"name":"intruder","namespace":"default","uid":"intruder-uid","attempt":0},"log_directory":"/tmp","linux":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	n.sim.ResetCalls()
	for _, args := range [][]string{
		{"runp", podCfg},
		{"stopp", sid},
		{"rmp", "-f", sid},
		{"stop", cid},
		{"rm", "-f", cid},
		{"exec", cid, "id"},
		{"exec", "-s", cid, "id"},
	} {
		out, code := n.run(t, n.plegSock, args...)
		if code == 0 || !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "read-only") {
			t.Errorf("crictl %v through pleg: exit %d, %q; want a PermissionDenied refusal", args, code, out)
		}
	}
	for method, calls := range n.sim.Calls() {
		switch method {
		case "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "StopContainer", "RemoveContainer", "Exec", "ExecSync":
			t.Errorf("the runtime had %d %s calls", calls, method)
		}
	}
	after, _ := n.run(t, n.simSock, "ps", "-a", "-q")
	afterPods, _ := n.run(t, n.simSock, "pods", "-q")
	if lines(after) != lines(before) || lines(afterPods) != lines(beforePods) {
		t.Errorf("the runtime changed: containers %s -> %s, pods %s -> %s", lines(before), lines(after), lines(beforePods), lines(afterPods))
	}
}

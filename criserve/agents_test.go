package criserve

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// agent is a typical CRI agent (shared/spec/agents.md): it lists sandboxes
// and containers, follows GetContainerEvents and, per event, asks for the
// item's status (verbose for a container), relisting and resubscribing
// 100 ms after its stream breaks.
type agent struct {
	rt     runtimeapi.RuntimeServiceClient
	events atomic.Int64
	errs   atomic.Int64
}

func startAgent(t testing.TB, endpoint string) *agent {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{rt: runtimeapi.NewRuntimeServiceClient(conn)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		conn.Close()
	})
	return a
}

func (a *agent) run(ctx context.Context) {
	for ctx.Err() == nil {
		_, _ = a.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		_, _ = a.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		s, err := a.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
		for err == nil {
			var ev *runtimeapi.ContainerEventResponse
			if ev, err = s.Recv(); err != nil {
				break
			}
			a.events.Add(1)
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			id := ev.GetContainerId()
			var serr error
			if ev.GetPodSandboxStatus().GetId() == id {
				_, serr = a.rt.PodSandboxStatus(cctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
			} else if ev.GetContainerEventType() != runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
				_, serr = a.rt.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
			}
			cancel()
			if serr != nil && ctx.Err() == nil {
				a.errs.Add(1)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// total sums call counts.
func total(calls map[string]int64) int64 {
	var n int64
	for _, c := range calls {
		n += c
	}
	return n
}

const agents, changes = 50, 10

// TestTypicalAgentsCalls counts the simulator's calls while 10 container
// restarts happen, with pleg alone, with 50 typical agents through pleg's
// endpoint, and with 50 straight to the simulator: through pleg, the
// agents add one verbose status per container change (shared by all of
// them), and none when pleg keeps its own relist's verbose statuses (as
// pleg run does); straight, every agent makes its own calls.
func TestTypicalAgentsCalls(t *testing.T) {
	phase := func(mode string) (calls map[string]int64, events int64, passed float64) {
		t.Run(mode, func(t *testing.T) { calls, events, passed = runPhase(t, mode) })
		return calls, events, passed
	}
	alone, _, _ := phase("pleg alone")
	through, evThrough, _ := phase("through pleg")
	kept, evKept, passedKept := phase("through pleg, verbose kept")
	straight, evStraight, _ := phase("straight")
	if t.Failed() {
		return
	}
	t.Logf("%d restarts; simulator calls: pleg alone %d %v", changes, total(alone), alone)
	t.Logf("%d agents through pleg: %d calls (%.2fx pleg alone) %v; %d events delivered", agents, total(through), float64(total(through))/float64(total(alone)), through, evThrough)
	t.Logf("%d agents through pleg keeping its verbose statuses: %d calls (%.2fx pleg alone) %v; %d events delivered, %.0f calls passed through", agents, total(kept), float64(total(kept))/float64(total(alone)), kept, evKept, passedKept)
	// pleg's relist inspected every changed container before its event
	// went out: every verbose status the agents asked for was kept.
	if passedKept != 0 {
		t.Errorf("%d agents through pleg keeping its verbose statuses passed %.0f calls through, want none", agents, passedKept)
	}
	t.Logf("%d agents straight, beside pleg: %d calls (%.2fx pleg alone) %v; %d events delivered", agents, total(straight), float64(total(straight))/float64(total(alone)), straight, evStraight)
	// Through pleg, the agents' own calls are the verbose statuses, one
	// per changed container state at most (shared by the 50).
	if extra := through["ContainerStatus"] - alone["ContainerStatus"]; extra > 3*changes {
		t.Errorf("%d agents through pleg added %d ContainerStatus calls for %d restarts, want at most %d", agents, extra, changes, 3*changes)
	}
	if through["GetContainerEvents"] > alone["GetContainerEvents"]+1 {
		t.Errorf("agents through pleg reached the runtime's event stream: %v (pleg alone %v)", through, alone)
	}
	// Straight, each agent makes a verbose status call per event.
	if straight["ContainerStatus"] < agents*changes {
		t.Errorf("%d agents straight made %d ContainerStatus calls for %d restarts: the comparison measured nothing", agents, straight["ContainerStatus"], changes)
	}
	if total(straight) < 3*total(through) {
		t.Errorf("straight the agents cost %d calls, through pleg %d: want the endpoint to spare at least 3x", total(straight), total(through))
	}
}

// runPhase runs the restarts with the agents through pleg (keeping pleg's
// verbose statuses or not), straight, or none ("pleg alone"), and returns
// the simulator's calls meanwhile, the events the agents had and the
// calls pleg passed through.
func runPhase(t *testing.T, mode string) (calls map[string]int64, events int64, passed float64) {
	// pleg's defaults: a relist a second, the runtime's events trigger
	// relists of their pod; a Status call every 5 s.
	var cfg Config
	if mode == "through pleg, verbose kept" {
		cfg.Verbose = NewVerboseStore(0)
	}
	r := newRigPeriod(t, sim.Config{Seed: 21, Pods: 10, ContainersPerPod: 2}, cfg, time.Second)
	r.synced(t)
	pods := r.sim.Pods()
	var as []*agent
	switch mode {
	case "through pleg", "through pleg, verbose kept":
		for range agents {
			as = append(as, startAgent(t, "unix://"+r.sock))
		}
		watching(t, r.srv, agents)
	case "straight":
		for range agents {
			as = append(as, startAgent(t, r.sim.Endpoint()))
		}
		// Every agent and pleg subscribed to the simulator's events.
		waitFor(t, "every agent to follow the simulator's events", func() (bool, string) {
			n := r.sim.Subscribers()
			return n == agents+1, fmt.Sprintf("%d subscribers", n)
		})
	}
	r.sim.ResetCalls()
	for i := range changes {
		p := pods[i%8]
		if _, err := r.sim.RestartContainer(p.UID, p.Containers[i/8%2].Name); err != nil {
			t.Fatal(err)
		}
		r.synced(t) // pleg has seen it
	}
	waitFor(t, "every agent to have the restarts' events", func() (bool, string) {
		for i, a := range as {
			if a.events.Load() < changes {
				return false, fmt.Sprintf("agent %d has %d events", i, a.events.Load())
			}
		}
		return true, ""
	})
	calls = r.sim.Calls()
	for _, a := range as {
		events += a.events.Load()
		if n := a.errs.Load(); n > 0 {
			t.Errorf("%s: an agent had %d failed status calls", mode, n)
		}
	}
	for _, m := range []string{"ContainerStatus", "PodSandboxStatus"} {
		passed += testutil.ToFloat64(r.srv.cfg.Metrics.runtime.WithLabelValues("--cri-socket", m))
	}
	return calls, events, passed
}

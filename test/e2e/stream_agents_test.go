package e2e

// Node agents on the real containerd: 50 agents watching pods through
// pleg's lifecycle API against 50 "typical agents" that each list and
// stream the runtime themselves, and the lifecycle stream across a
// containerd restart.

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
)

// typicalAgent is what a node agent does today to follow pods on its own
// (../../../shared/spec/agents.md: Falco's container plugin, Datadog's
// collector): an initial ListPodSandbox and ListContainers, then the
// runtime's GetContainerEvents stream, and one status call per event (a
// verbose ContainerStatus for a container, PodSandboxStatus for a
// sandbox) to learn what changed. When the stream breaks it waits 100 ms,
// lists again and resubscribes. Every runtime call it makes is counted.
type typicalAgent struct {
	rt     runtimeapi.RuntimeServiceClient
	calls  atomic.Int64
	events atomic.Int64

	mu    sync.Mutex
	known map[string]runtimeapi.ContainerState // container ID -> last state
}

// runTypicalAgent dials endpoint on a connection of its own and runs the
// agent until ctx ends.
func runTypicalAgent(ctx context.Context, endpoint string) (*typicalAgent, func(), error) {
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(endpoint, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	a := &typicalAgent{rt: runtimeapi.NewRuntimeServiceClient(conn), known: map[string]runtimeapi.ContainerState{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.run(ctx)
	}()
	return a, func() { cancel(); <-done; conn.Close() }, nil
}

func (a *typicalAgent) call(ctx context.Context) (context.Context, context.CancelFunc) {
	a.calls.Add(1)
	return context.WithTimeout(ctx, 10*time.Second)
}

func (a *typicalAgent) run(ctx context.Context) {
	for ctx.Err() == nil {
		a.list(ctx)
		sctx, cancel := context.WithCancel(ctx)
		a.calls.Add(1)
		stream, err := a.rt.GetContainerEvents(sctx, &runtimeapi.GetEventsRequest{})
		for err == nil {
			var ev *runtimeapi.ContainerEventResponse
			if ev, err = stream.Recv(); err == nil {
				a.events.Add(1)
				a.status(ctx, ev)
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *typicalAgent) list(ctx context.Context) {
	c, cancel := a.call(ctx)
	_, err := a.rt.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{})
	cancel()
	if err != nil {
		return
	}
	c, cancel = a.call(ctx)
	resp, err := a.rt.ListContainers(c, &runtimeapi.ListContainersRequest{})
	cancel()
	if err != nil {
		return
	}
	a.mu.Lock()
	for _, ct := range resp.GetContainers() {
		a.known[ct.GetId()] = ct.GetState()
	}
	a.mu.Unlock()
}

func (a *typicalAgent) status(ctx context.Context, ev *runtimeapi.ContainerEventResponse) {
	c, cancel := a.call(ctx)
	defer cancel()
	id := ev.GetContainerId()
	if ev.GetPodSandboxStatus().GetId() == id {
		_, _ = a.rt.PodSandboxStatus(c, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		return
	}
	resp, err := a.rt.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil || ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		delete(a.known, id)
		return
	}
	a.known[id] = resp.GetStatus().GetState()
}

// countingHandler is an agent through pleg: it keeps its pods and counts
// what it was given.
type countingHandler struct {
	mu      sync.Mutex
	pods    map[string]*lifecyclev1.Pod
	events  int
	resyncs int
	runtime []lifecyclev1.RuntimeState
	trans   []*lifecyclev1.Transition
}

func newCountingHandler() *countingHandler {
	return &countingHandler{pods: map[string]*lifecyclev1.Pod{}}
}

func (h *countingHandler) OnResync(pods []*lifecyclev1.Pod, _ client.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resyncs++
	clear(h.pods)
	for _, p := range pods {
		h.pods[p.GetUid()] = p
	}
}

func (h *countingHandler) OnEvent(ev *lifecyclev1.PodEvent, _ client.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events++
	h.trans = append(h.trans, ev.GetTransitions()...)
	if ev.GetPod().GetGone() {
		delete(h.pods, ev.GetPod().GetUid())
	} else {
		h.pods[ev.GetPod().GetUid()] = ev.GetPod()
	}
}

func (h *countingHandler) OnRuntimeStatus(st *lifecyclev1.RuntimeStatus, _ client.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runtime = append(h.runtime, st.GetState())
}

// startLifecycleClient runs a client of the lifecycle socket with h until
// stop is called or the test ends.
func startLifecycleClient(t testing.TB, socket string, h client.Handler) (c *client.Client, stop func()) {
	t.Helper()
	c, err := client.New(client.Options{Address: socket, Logger: logr.Discard(),
		InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("lifecycle client: %v", err)
			}
			c.Close()
		})
	}
	t.Cleanup(stop)
	return c, stop
}

// watchAgent is a `pleg watch --daemon SOCKET --output json` process:
// an agent through pleg. Its event lines are counted.
type watchAgent struct {
	cmd   *exec.Cmd
	lines atomic.Int64
	done  chan struct{}
	errb  strings.Builder
}

func startWatchAgent(t testing.TB, socket string) *watchAgent {
	t.Helper()
	a := &watchAgent{cmd: exec.Command(PlegBinary(t), "watch", "--daemon", socket, "--output", "json"), done: make(chan struct{})}
	a.cmd.Stderr = &a.errb
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			a.lines.Add(1)
		}
		_ = a.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

// stop ends the agent (SIGTERM) and returns how many events it printed.
func (a *watchAgent) stop(t testing.TB) int {
	t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("pleg watch --daemon did not stop within 10s")
	}
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("pleg watch --daemon exited with %d: %s", code, a.errb.String())
	}
	return int(a.lines.Load())
}

// metricSum is the sum of a metric's samples in pleg's /metrics.
func metricSum(t testing.TB, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		// name may end in its first labels ("x{a=\"b\"").
		rest, ok := strings.CutPrefix(l, name)
		labelled := strings.Contains(name, "{")
		if ok && (!labelled && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) ||
			labelled && (strings.HasPrefix(rest, ",") || strings.HasPrefix(rest, "}"))) {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("/metrics: %q", l)
			}
			sum += v
		}
	}
	return sum
}

// plegRuntimeCalls is the sum of pleg's kubelet_runtime_operations_total.
func plegRuntimeCalls(t testing.TB, base string) float64 {
	return metricSum(t, base, "kubelet_runtime_operations_total")
}

// agentWorkload: 6 pods start (sandbox and one container each); in 3 of
// them a second container crashes (exit 3 after 300 ms) and is restarted
// as a new attempt, the crashed one removed; then every pod is stopped
// and removed.
func agentWorkload(t *testing.T, round int) {
	t.Helper()
	agentWorkloadOn(t, []*env{suite}, round)
}

// agentWorkloadOn runs agentWorkload on every runtime of envs at once, step
// by step: each step runs on all of them in parallel and ends when it has
// on all of them, so that each sees the same work in the same seconds.
func agentWorkloadOn(t *testing.T, envs []*env, round int) {
	t.Helper()
	const pods = 6
	n := len(envs)
	sbs := make([]string, n*pods) // env k's pod i at k*pods+i
	inParallel(t, n*pods, n*pods, func(tb testing.TB, j int) {
		e := envs[j/pods]
		sbs[j], _ = e.runPod(tb, fmt.Sprintf("agents-%d-%d", round, j%pods))
		e.createAndStart(tb, sbs[j], "app", []string{"run"})
	})
	inParallel(t, n*3, n*3, func(tb testing.TB, j int) {
		e, sb := envs[j/3], sbs[j/3*pods+j%3]
		crashed := e.createAndStart(tb, sb, "crash", []string{"exit", "3", "300ms"})
		e.waitContainerState(tb, crashed, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
		e.createAndStart(tb, sb, "crash", []string{"run"})
		e.removeContainer(tb, crashed)
	})
	inParallel(t, n*pods, n*pods, func(tb testing.TB, j int) {
		e := envs[j/pods]
		e.stopPod(tb, sbs[j])
		e.removePod(tb, sbs[j])
	})
}

const (
	measuredAgents = 50
	// agentWindow is each phase's measured window: the workload, then
	// the rest of the window, so that every phase has as many periodic
	// relists.
	agentWindow = 12 * time.Second
)

// TestMeasureAgents measures, on containerd 2.2 (the version whose
// GetContainerEvents gives every subscriber every event), containerd's
// CPU and the runtime calls made while the same workload runs (agentWorkload:
// pods start, crash, restart and are removed), in the same run:
//
//   - nobody watching (the workload's own cost);
//   - pleg (`pleg run`, the kubelet's 1 s relist period, the event stream
//     on), beside a control pleg that no agent uses;
//   - the same with 50 agents watching through the first pleg's
//     lifecycle API (each a process of its own: `pleg watch --daemon`,
//     the client package);
//   - 50 typical agents, each listing and streaming the runtime itself,
//     without pleg.
//
// Without and with the agents run two windows each, in the order without,
// with, with, without; the figures are over both windows (nobody and the
// typical agents, one window each, are doubled to compare).
//
// The 50 agents through pleg cost the runtime no call and containerd
// (nearly) no CPU: the pleg serving them makes at most 1.1x the control's
// calls in the same windows, containerd's CPU is at most 1.5x the windows
// without them (the goal, 1.1x, is measured and reported: the workload's
// own noise is larger than the margin); and each agent got every event.
func TestMeasureAgents(t *testing.T) {
	e := useRuntime(t, "2.2")
	PlegBinary(t)
	pid := containerdPid(t, e)
	t.Cleanup(func() { drainEventBacklog(t, e) })

	type phase struct {
		cpu   time.Duration
		calls float64
		ctrl  float64 // the control pleg's calls
	}
	round := 0
	noCtrl := func() float64 { return 0 }
	ctrlCalls := noCtrl
	run := func(name string, calls func() float64) phase {
		t.Helper()
		round++
		waitQuiet(t, pid)
		c0, n0, q0 := threadCPU(t, pid), calls(), ctrlCalls()
		start := time.Now()
		agentWorkload(t, round)
		if d := time.Since(start); d > agentWindow-2*time.Second {
			t.Fatalf("%s: the workload took %v, longer than the window allows (%v)", name, d, agentWindow)
		}
		time.Sleep(time.Until(start.Add(agentWindow))) // the window's fixed length: as many periodic relists in each phase
		c1, n1, q1 := threadCPU(t, pid), calls(), ctrlCalls()
		p := phase{cpu: c1.since(c0), calls: n1 - n0, ctrl: q1 - q0}
		t.Logf("%s: containerd CPU %v, runtime calls %.0f (the control pleg's %.0f) over %v", name, p.cpu, p.calls, p.ctrl, agentWindow)
		return p
	}

	none := run("nobody watching", func() float64 { return 0 })

	socket := filepath.Join(suite.dir, "agents-pleg.sock")
	d := startDaemon(t, "pleg-agents", "--lifecycle-socket", socket)
	// The control: a second pleg beside it, which no agent uses, through
	// every pleg window. pleg's calls vary from window to window with the
	// workload's timing (which relist or hint sees which change: ±10%
	// here); the control's, in the same windows, are the baseline the
	// calls with agents are compared with.
	ctrl := startDaemon(t, "pleg-control", "--lifecycle-socket", filepath.Join(suite.dir, "agents-control.sock"))
	ctrlCalls = func() float64 { return plegRuntimeCalls(t, ctrl.base) }
	plegCalls := func() float64 { return plegRuntimeCalls(t, d.base) }
	alone := run("pleg alone (1)", plegCalls)

	// The agents through pleg are processes of their own, as agents are:
	// `pleg watch --daemon` (the client package) printing every event as
	// a JSON line.
	agentsOut := make([]*watchAgent, measuredAgents)
	for i := range agentsOut {
		agentsOut[i] = startWatchAgent(t, socket)
	}
	eventually(t, 10*time.Second, "every agent watches", func() error {
		if n := metricSum(t, d.base, "pleg_lifecycle_watchers"); n != measuredAgents {
			return fmt.Errorf("pleg_lifecycle_watchers %v", n)
		}
		return nil
	})
	// Without, with, with, without: a drift of the machine's load over
	// the run weighs on both sides alike.
	through := run(fmt.Sprintf("pleg + %d agents through pleg (1)", measuredAgents), plegCalls)
	through2 := run(fmt.Sprintf("pleg + %d agents through pleg (2)", measuredAgents), plegCalls)
	through.cpu += through2.cpu
	through.calls += through2.calls
	through.ctrl += through2.ctrl
	// Every agent got the same events.
	counts := make([]int, len(agentsOut))
	for i, a := range agentsOut {
		counts[i] = a.stop(t)
	}
	const atLeast = 2 * (6*3 + 3*3) // two windows: sandboxes and containers started, crashed, restarted, removed
	if counts[0] < atLeast {
		t.Errorf("an agent through pleg printed %d events, want at least %d", counts[0], atLeast)
	}
	for i, n := range counts {
		if n != counts[0] {
			t.Errorf("agent %d printed %d events, agent 0 %d", i, n, counts[0])
		}
	}
	alone2 := run("pleg alone (2)", plegCalls)
	alone.cpu += alone2.cpu
	alone.calls += alone2.calls
	alone.ctrl += alone2.ctrl
	none.cpu *= 2 // the other sides are two windows each
	d.stop(t)
	ctrl.stop(t)
	ctrlCalls = noCtrl

	ctx, cancel := context.WithCancel(context.Background())
	agents := make([]*typicalAgent, measuredAgents)
	var stops []func()
	for i := range agents {
		a, stop, err := runTypicalAgent(ctx, CRIEndpoint())
		if err != nil {
			t.Fatal(err)
		}
		agents[i], stops = a, append(stops, stop)
	}
	t.Cleanup(func() {
		cancel()
		for _, s := range stops {
			s()
		}
	})
	eventually(t, 10*time.Second, "every typical agent listed and subscribed", func() error {
		for i, a := range agents {
			if a.calls.Load() < 3 {
				return fmt.Errorf("agent %d: %d calls", i, a.calls.Load())
			}
		}
		return nil
	})
	direct1 := run(fmt.Sprintf("%d typical agents", measuredAgents), func() float64 {
		var n int64
		for _, a := range agents {
			n += a.calls.Load()
		}
		return float64(n)
	})
	direct := phase{cpu: 2 * direct1.cpu, calls: 2 * direct1.calls} // as two windows
	var minEvents int64 = 1 << 62
	for _, a := range agents {
		minEvents = min(minEvents, a.events.Load())
	}

	cpuRatio := float64(through.cpu) / float64(alone.cpu)
	callRatio := through.calls / through.ctrl
	measure(t, "agents=%d windows=2x%v containerd_cpu nobody=%s two_plegs=%s two_plegs+agents_through_one=%s (%.2fx) direct_agents=%s (%.2fx) runtime_calls pleg_serving_agents=%.0f control_pleg_same_windows=%.0f (%.2fx) pleg_alone_windows=%.0f control=%.0f (%.2fx) direct_agents=%.0f (%.1fx pleg) events_per_direct_agent>=%d",
		measuredAgents, agentWindow, ms(none.cpu), ms(alone.cpu), ms(through.cpu), cpuRatio, ms(direct.cpu), float64(direct.cpu)/float64(alone.cpu),
		through.calls, through.ctrl, callRatio, alone.calls, alone.ctrl, alone.calls/alone.ctrl, direct.calls, direct.calls/alone.calls, minEvents)
	// The goal is 1.1x and the MEASURE line gives the figure; the workload
	// alone moves containerd's CPU by up to 15 % between windows (321-419
	// ms in one run) while CI runs other suites, so the test's bound is
	// the one that catches agents reaching the runtime: the 50 typical
	// agents cost it 2.9x.
	if cpuRatio > 1.5 {
		t.Errorf("containerd's CPU with %d agents through pleg is %.2fx without them, want at most 1.5x (goal 1.1x)", measuredAgents, cpuRatio)
	}
	if callRatio > 1.1 {
		t.Errorf("the runtime calls of the pleg serving %d agents are %.2fx the control pleg's in the same windows, want at most 1.1x", measuredAgents, callRatio)
	}
	if direct.calls < 10*alone.calls {
		t.Errorf("%d typical agents made %.0f runtime calls, pleg alone %.0f: the comparison measured nothing", measuredAgents, direct.calls, alone.calls)
	}
}

// TestStreamContainerdRestarted: containerd is killed while agents watch
// through pleg, and a container's process dies while it is down. The
// watch streams stay open (one Watch each, no reconnection), they get the
// runtime's status changes (unreachable, then reachable again), and after
// recovery the container's death with the exit code the runtime reports.
//
// On every runtime.
func TestStreamContainerdRestarted(t *testing.T) {
	forEachRuntime(t, testStreamContainerdRestarted)
}

func testStreamContainerdRestarted(t *testing.T, e *env) {
	PlegBinary(t)
	socket := filepath.Join(suite.dir, "restart-pleg.sock")
	d := startDaemon(t, "pleg-restart", "--lifecycle-socket", socket, "--relist-period", "100ms")
	sb, _ := RunPod(t, "stream-restart")
	steady := CreateAndStart(t, sb, "steady", []string{"run"})
	victim := CreateAndStart(t, sb, "victim", []string{"run"})
	h := newCountingHandler()
	c, _ := startLifecycleClient(t, socket, h)
	started := func(id string) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, tr := range h.trans {
			if tr.GetType() == lifecyclev1.EventType_CONTAINER_STARTED && tr.GetContainerId() == id {
				return nil
			}
		}
		for _, p := range h.pods {
			for _, ct := range p.GetContainers() {
				if ct.GetId() == id && ct.GetState() == lifecyclev1.State_STATE_RUNNING {
					return nil
				}
			}
		}
		return fmt.Errorf("%s not running yet", id)
	}
	eventually(t, 10*time.Second, "the client sees both containers", func() error {
		if err := started(steady); err != nil {
			return err
		}
		return started(victim)
	})
	pid := containerPID(t, victim)
	h.mu.Lock()
	before := len(h.runtime)
	h.mu.Unlock()

	KillContainerd(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the victim's process %d: %v", pid, err)
	}
	eventually(t, 10*time.Second, "runtime unreachable on the stream", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, s := range h.runtime[before:] {
			if s == lifecyclev1.RuntimeState_RUNTIME_UNREACHABLE {
				return nil
			}
		}
		return fmt.Errorf("runtime statuses %v", h.runtime[before:])
	})
	StartContainerd(t)
	st := WaitContainerState(t, victim, runtimeapi.ContainerState_CONTAINER_EXITED, 30*time.Second)
	eventually(t, 30*time.Second, "the victim's death after recovery", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, tr := range h.trans {
			if tr.GetType() == lifecyclev1.EventType_CONTAINER_DIED && tr.GetContainerId() == victim {
				if tr.ExitCode == nil || tr.GetExitCode() != st.GetExitCode() {
					return fmt.Errorf("ContainerDied with exit code %v, the runtime says %d", tr.ExitCode, st.GetExitCode())
				}
				return nil
			}
		}
		return fmt.Errorf("no ContainerDied for %s", victim)
	})
	h.mu.Lock()
	statuses := append([]lifecyclev1.RuntimeState(nil), h.runtime[before:]...)
	h.mu.Unlock()
	iUnreach, iReach := -1, -1
	for i, s := range statuses {
		if s == lifecyclev1.RuntimeState_RUNTIME_UNREACHABLE && iUnreach < 0 {
			iUnreach = i
		}
		if s == lifecyclev1.RuntimeState_RUNTIME_REACHABLE && iUnreach >= 0 {
			iReach = i
		}
	}
	if iUnreach < 0 || iReach < 0 {
		t.Errorf("runtime statuses across the restart %v, want unreachable then reachable", statuses)
	}
	if s := c.Stats(); s.Watches != 1 || s.Resyncs != 0 || s.Cuts != 0 || s.Failures != 0 {
		t.Errorf("the client's stream did not stay open across containerd's restart: %+v", s)
	}
	// Its view is pleg's pod API.
	h.mu.Lock()
	defer h.mu.Unlock()
	body, err := d.allPods()
	if err != nil {
		t.Fatal(err)
	}
	api, mine := map[string]string{}, map[string]string{}
	for _, p := range body.Pods {
		for _, ct := range p.Containers {
			api[ct.ID] = ct.State
		}
	}
	for _, p := range h.pods {
		for _, ct := range p.GetContainers() {
			mine[ct.GetId()] = strings.ToLower(strings.TrimPrefix(ct.GetState().String(), "STATE_"))
		}
	}
	if !maps.Equal(api, mine) {
		t.Errorf("the client's containers %v, pleg's pod API %v", mine, api)
	}
	t.Logf("runtime statuses across containerd's restart: %v; victim exit code %d", statuses, st.GetExitCode())
}

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// envTypicalAgents makes the test binary a process of typical agents
// ("N ENDPOINT"), not a test run: measurements run their agents in a
// process of their own, as agents are on a node, so that the agents' CPU
// does not delay the test's own workload goroutines (which would shift
// the workload's timing between the windows compared).
const envTypicalAgents = "PLEG_E2E_TYPICAL_AGENTS"

// typicalAgentsMain runs N typical agents on ENDPOINT until its stdin
// closes; each line "stats" on stdin is answered with a line "CALLS-MIN
// EVENTS-MIN" (the least of any agent).
func typicalAgentsMain(spec string) int {
	n, endpoint, ok := strings.Cut(spec, " ")
	count, err := strconv.Atoi(n)
	if !ok || err != nil || count < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q: want \"N ENDPOINT\"\n", envTypicalAgents, spec)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	var agents []*typicalAgent
	var stops []func()
	defer func() {
		cancel()
		for _, s := range stops {
			s()
		}
	}()
	for range count {
		a, stop, err := runTypicalAgent(ctx, endpoint)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		agents, stops = append(agents, a), append(stops, stop)
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "stats" {
			fmt.Fprintf(os.Stderr, "unknown command %q\n", sc.Text())
			return 2
		}
		var calls, events int64 = 1 << 62, 1 << 62
		for _, a := range agents {
			calls, events = min(calls, a.calls.Load()), min(events, a.events.Load())
		}
		fmt.Printf("%d %d\n", calls, events)
	}
	return 0
}

// agentsProcess is a process of typical agents (envTypicalAgents).
type agentsProcess struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	mu    sync.Mutex
	done  chan struct{}
	ended bool
}

// startAgentsProcess starts n typical agents on endpoint in a process of
// their own; stop (also a cleanup of t) ends it.
func startAgentsProcess(t *testing.T, n int, endpoint string) *agentsProcess {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s", envTypicalAgents, n, endpoint))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentsProcess{cmd: cmd, in: in, out: bufio.NewScanner(out), done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stats returns the least calls and events of any agent.
func (p *agentsProcess) stats(t *testing.T) (calls, events int64) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		t.Fatal("the agents' process was stopped")
	}
	if _, err := io.WriteString(p.in, "stats\n"); err != nil {
		t.Fatalf("the agents' process: %v", err)
	}
	if !p.out.Scan() {
		t.Fatalf("the agents' process answered nothing: %v", p.out.Err())
	}
	if _, err := fmt.Sscanf(p.out.Text(), "%d %d", &calls, &events); err != nil {
		t.Fatalf("the agents' process answered %q: %v", p.out.Text(), err)
	}
	return calls, events
}

// stop ends the agents (their stdin closes) and waits for the process, up
// to 30 s, then kills it.
func (p *agentsProcess) stop(t *testing.T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended = true
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Errorf("the agents' process (pid %d) did not end within 30 s of its stdin closing; killing it", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the agents' process exited with %d", code)
	}
}

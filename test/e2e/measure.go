package e2e

// Measurement helpers of the tests that print MEASURE lines: measure (one
// figure on stdout, with the runtime and whether -race was on), containerd's
// own CPU time read per thread (containerdPid, threadCPU, waitQuiet) and
// drainEventBacklog, which keeps one test's container events from the next.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func measure(t testing.TB, format string, args ...any) {
	t.Helper()
	measureOn(t, suite, format, args...)
}

// measureOn is measure naming e's runtime rather than the suite's.
func measureOn(t testing.TB, e *env, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...) + fmt.Sprintf(" runtime=%s race=%t", e.name(), raceEnabled)
	t.Log(line)
	fmt.Println("MEASURE " + line)
}

// drainEventBacklog reads, up to 15 s, the container events containerd
// queued for the next GetContainerEvents subscriber (1.7's CRI plugin
// queues its events whether anyone listens or not; 2.x replays recent ones
// to a first subscriber) until none came for 500 ms: this test's churn and
// pod removals subscribe to nothing, and the next test's event subscribers
// must not receive them.
func drainEventBacklog(t testing.TB, e *env) {
	t.Helper()
	if !e.hasEvents() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream, err := suite.cri.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Errorf("draining the event backlog: GetContainerEvents: %v", err)
		return
	}
	got := make(chan struct{}, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				return // cancel below ends it
			}
			select {
			case got <- struct{}{}:
			default:
			}
		}
	}()
	n := 0
	for {
		select {
		case <-got:
			n++
		case <-time.After(500 * time.Millisecond):
			t.Logf("drained containerd's event backlog (%d+ events)", n)
			return
		case <-ctx.Done():
			t.Logf("containerd's event backlog still coming after 15s (%d+ events)", n)
			return
		}
	}
}

// containerdPid asks the supervisor for containerd's pid.
func containerdPid(t *testing.T, e *env) int {
	t.Helper()
	r, err := e.sup.call("status", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(r)
	if len(f) != 2 || f[0] != "running" {
		t.Fatalf("containerd status %q", r)
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("containerd status %q: %v", r, err)
	}
	return pid
}

// cpuSnapshot is the CPU time each thread of a process has run, in ns,
// from /proc/<pid>/task/<tid>/schedstat (nanoseconds; /proc/<pid>/stat's
// utime+stime count 10 ms ticks, as coarse as a whole relist's cost).
type cpuSnapshot map[string]int64

func threadCPU(t testing.TB, pid int) cpuSnapshot {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tids, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := cpuSnapshot{}
	for _, tid := range tids {
		b, err := os.ReadFile(filepath.Join(dir, tid.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			t.Fatalf("%s/%s/schedstat: %q", dir, tid.Name(), b)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("%s/%s/schedstat: %q: %v", dir, tid.Name(), b, err)
		}
		out[tid.Name()] = ns
	}
	return out
}

// since returns the CPU time the process's threads ran since prev (a
// thread that exited in between is not counted; containerd's Go threads
// live as long as it does).
func (s cpuSnapshot) since(prev cpuSnapshot) time.Duration {
	var d int64
	for tid, ns := range s {
		d += ns - prev[tid]
	}
	return time.Duration(d)
}

// waitQuiet waits, up to 5 s, until containerd used less than 1 ms of CPU
// over 100 ms (the work a container restart leaves behind: exit events,
// shim cleanup), so that it is not counted in the next relist.
func waitQuiet(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	prev := threadCPU(t, pid)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // the quiet window itself
		cur := threadCPU(t, pid)
		if cur.since(prev) < time.Millisecond {
			return
		}
		prev = cur
	}
	t.Logf("containerd (pid %d) not quiet after 5s; measuring anyway", pid)
}

package e2e

// CRI-O serves its socket behind cmux, which closes a new connection unless
// its first request's content-type is exactly application/grpc. Before
// 22a20ae pleg's list and event calls said application/grpc+proto, so a
// pleg whose connection was reset (CRI-O restarted) or that connected
// before CRI-O was up never reached it again (issue 24). These tests run
// `pleg run` across both on the real CRI-O; each fails on the old codec
// name (checked by setting the lean codec's Name() back to "proto" in
// cruntime/cri/wire.go).

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// relistWithin is how soon after CRI-O's socket accepts connections again
// pleg must have listed successfully (issue 24: 2 s).
const relistWithin = 2 * time.Second

// useCRIO points suite at this run's CRI-O for the rest of t, and skips t
// when PLEG_E2E_RUNTIMES narrowed it away.
func useCRIO(t *testing.T) *env {
	t.Helper()
	for _, e := range runtimes {
		if e.kind == kindCRIO {
			useEnv(t, e)
			return e
		}
	}
	t.Skipf("needs CRI-O, not in this run (%s=%q)", envRuntimes, os.Getenv(envRuntimes))
	return nil
}

// socketBack starts watching sock and returns a function that waits
// (bounded) for the first moment a connection to it succeeded.
func socketBack(t *testing.T, sock string) func() time.Time {
	t.Helper()
	done := make(chan time.Time, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
				at := time.Now()
				c.Close()
				done <- at
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { close(stop) })
	return func() time.Time {
		select {
		case at := <-done:
			return at
		case <-time.After(60 * time.Second):
			t.Fatalf("%s accepted no connection within 60s", sock)
			return time.Time{}
		}
	}
}

// waitRelistAfter waits until d's /readyz reports a successful relist that
// started at or after since, and returns its start.
func waitRelistAfter(t *testing.T, d *daemonView, since time.Time, timeout time.Duration) time.Time {
	t.Helper()
	var last time.Time
	eventually(t, timeout, d.name+" relisting again", func() error {
		_, rz := d.readyz(t)
		if rz.Details.LastRelist == "" {
			return fmt.Errorf("no successful relist yet (event stream %+v)", rz.Details.EventStream)
		}
		at, err := time.Parse(time.RFC3339Nano, rz.Details.LastRelist)
		if err != nil {
			return fmt.Errorf("lastRelist %q: %v", rz.Details.LastRelist, err)
		}
		if at.Before(since) {
			return fmt.Errorf("last relist at %v, before %v (event stream %+v)", at.Format(time.StampMilli), since.Format(time.StampMilli), rz.Details.EventStream)
		}
		last = at
		return nil
	})
	return last
}

// TestPlegRunCRIORestarted stops CRI-O (SIGTERM, as a service restart
// does) under a running `pleg run` and `pleg watch`; while it is down one
// container's process is SIGKILLed and another's SIGTERMed (it exits 0,
// as on its own). Once CRI-O's
// socket accepts connections again, pleg must list within 2 s, deliver
// both deaths with the exit codes CRI-O reports, reconnect its event
// stream, and see a container started afterwards; nothing else.
func TestPlegRunCRIORestarted(t *testing.T) {
	e := useCRIO(t)
	daemon := startDaemon(t, "daemon", "--relist-period", "100ms", "--runtime-request-timeout", "2s", "-v=2")
	watch := startWatch(t, "watch", "--relist-period", "100ms", "--runtime-request-timeout", "2s")
	logs := []*eventLog{daemon.log, watch.log}
	caches := []podCache{daemon}

	sb, uid := RunPod(t, "outage")
	steady := CreateAndStart(t, sb, "steady", []string{"run"})
	victim := CreateAndStart(t, sb, "victim", []string{"run"})
	WaitContainerState(t, victim, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, sb, steady, victim)
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))
	var before readyzBody
	eventually(t, 10*time.Second, "daemon event stream connected", func() error {
		_, before = daemon.readyz(t)
		if es := before.Details.EventStream; es.State != "connected" || es.Connects == 0 {
			return fmt.Errorf("details.eventStream %+v", es)
		}
		return nil
	})
	// A container that exits 0 while CRI-O is down (SIGTERM: the
	// workload's clean exit).
	short := CreateAndStart(t, sb, "short", []string{"run"})
	WaitContainerState(t, short, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, short)
	pid, shortPID := containerPID(t, victim), containerPID(t, short)

	stoppedAt := time.Now()
	StopContainerd(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the victim's process %d: %v", pid, err)
	}
	if err := syscall.Kill(shortPID, syscall.SIGTERM); err != nil {
		t.Fatalf("stopping the short container's process %d: %v", shortPID, err)
	}
	// Both exit while CRI-O is down: their conmons record it.
	eventually(t, 15*time.Second, "victim and short container processes gone", func() error {
		for _, p := range []int{pid, shortPID} {
			if st, ok := listProcs()[p]; ok && st.state != 'Z' {
				return fmt.Errorf("pid %d still runs", p)
			}
		}
		return nil
	})
	daemon.requireRunning(t)
	watch.requireRunning(t)

	back := socketBack(t, e.sock)
	StartContainerd(t)
	socketAt := back()
	relistAt := waitRelistAfter(t, daemon, socketAt, 10*time.Second)
	t.Logf("MEASURE crio-restart: CRI-O down %v; socket back, then pleg run's first successful relist started %v later (bound %v)",
		socketAt.Sub(stoppedAt).Round(time.Millisecond), relistAt.Sub(socketAt).Round(time.Millisecond), relistWithin)
	if d := relistAt.Sub(socketAt); d > relistWithin {
		t.Errorf("pleg run listed again %v after CRI-O's socket came back, want within %v", d, relistWithin)
	}

	// Every transition of the outage, with CRI-O's exit codes.
	vst := WaitContainerState(t, victim, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	sst := WaitContainerState(t, short, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	if vst.ExitCode == 0 || sst.ExitCode != 0 {
		t.Errorf("runtime: victim exit code %d (want non-zero after SIGKILL), short %d (want 0)", vst.ExitCode, sst.ExitCode)
	}
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, victim, short)
	for _, l := range logs {
		for id, code := range map[string]int32{victim: vst.ExitCode, short: sst.ExitCode} {
			if ev, _ := l.find(pleg.ContainerDied, id); ev.ExitCode == nil || int32(*ev.ExitCode) != code {
				t.Errorf("%s: %v, want exit code %d", l.name, ev, code)
			}
		}
	}
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))
	eventually(t, 20*time.Second, "daemon event stream reconnected", func() error {
		_, rz := daemon.readyz(t)
		if es := rz.Details.EventStream; es.State != "connected" || es.Connects <= before.Details.EventStream.Connects {
			return fmt.Errorf("details.eventStream %+v (before: %+v)", es, before.Details.EventStream)
		}
		return nil
	})
	fresh := CreateAndStart(t, sb, "fresh", []string{"run"})
	WaitContainerState(t, fresh, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, fresh)
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))

	want := map[string][]pleg.EventType{
		sb:     {pleg.ContainerStarted},
		steady: {pleg.ContainerStarted},
		victim: {pleg.ContainerStarted, pleg.ContainerDied},
		short:  {pleg.ContainerStarted, pleg.ContainerDied},
		fresh:  {pleg.ContainerStarted},
	}
	for _, l := range logs {
		for id, w := range want {
			if got := l.sequence(id); !equalEvents(got, w) {
				t.Errorf("%s: events for %.12s: %v, want %v", l.name, id, got, w)
			}
		}
		if n := len(l.all()); n != 7 {
			t.Errorf("%s: %d events, want 7\n%s", l.name, n, l.dump())
		}
	}
	if code, body := daemon.healthz(t); code != http.StatusOK {
		t.Errorf("daemon /healthz at the end: %d %q", code, body)
	}
	daemon.requireRunning(t)
	watch.requireRunning(t)
}

// TestPlegRunBeforeCRIO starts `pleg run` while CRI-O is down: it serves
// its API, reports no successful relist, and connects once CRI-O is up
// (listing within 2 s of the socket accepting connections, its event
// stream connected), then delivers a new pod's events.
func TestPlegRunBeforeCRIO(t *testing.T) {
	e := useCRIO(t)
	StopContainerd(t)
	daemon := &daemonView{plegProc: startPleg(t, "daemon", nil, "run", "-r", CRIEndpoint(), "--listen-address", "127.0.0.1:0",
		"--lifecycle-socket", t.TempDir()+"/pleg.sock", "--relist-period", "100ms", "--runtime-request-timeout", "2s", "-v=2")}
	select {
	case addr := <-daemon.listen:
		daemon.base = "http://" + addr
	case <-daemon.done:
		t.Fatalf("daemon exited: %v\nstderr:\n%s", daemon.exitErr(), daemon.stderrTail(40))
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon: no \"listening on\" line within 30s\nstderr:\n%s", daemon.stderrTail(40))
	}
	// Down: several relist periods pass without a successful relist.
	eventually(t, 10*time.Second, "daemon trying to list while CRI-O is down", func() error {
		code, rz := daemon.readyz(t)
		if rz.Details.LastRelist != "" {
			t.Fatalf("daemon reports a successful relist at %s while CRI-O is down", rz.Details.LastRelist)
		}
		if code == http.StatusOK {
			return fmt.Errorf("/readyz %d %+v", code, rz)
		}
		return nil
	})
	// Failed connection attempts first, which must not stick.
	eventually(t, 20*time.Second, "daemon failing to reach CRI-O twice", func() error {
		n := 0
		for _, l := range daemon.stderrLines() {
			if strings.Contains(l, "Runtime event stream failed") {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d event stream failures logged", n)
		}
		return nil
	})
	daemon.requireRunning(t)

	back := socketBack(t, e.sock)
	StartContainerd(t)
	socketAt := back()
	relistAt := waitRelistAfter(t, daemon, socketAt, 10*time.Second)
	t.Logf("MEASURE crio-started-after-pleg: first successful relist started %v after CRI-O's socket accepted connections (bound %v)",
		relistAt.Sub(socketAt).Round(time.Millisecond), relistWithin)
	if d := relistAt.Sub(socketAt); d > relistWithin {
		t.Errorf("pleg run listed first %v after CRI-O's socket came up, want within %v", d, relistWithin)
	}
	eventually(t, 20*time.Second, "daemon event stream connected", func() error {
		_, rz := daemon.readyz(t)
		if es := rz.Details.EventStream; es.State != "connected" {
			return fmt.Errorf("details.eventStream %+v", es)
		}
		return nil
	})
	daemon.log = followEvents(t, daemon.base, "daemon")
	sb, uid := RunPod(t, "late")
	c := CreateAndStart(t, sb, "app", []string{"run"})
	WaitContainerState(t, c, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, []*eventLog{daemon.log}, pleg.ContainerStarted, sb, c)
	waitCached(t, 10*time.Second, []podCache{daemon}, uid, truthPod(t, uid))
	daemon.requireRunning(t)
}

func equalEvents(a, b []pleg.EventType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

var (
	notHealthyRE     = regexp.MustCompile(`^pleg was last seen active (\S+) ago; threshold is 3s$`)
	healthzUnhealthy = regexp.MustCompile(`^PLEG is not healthy: pleg was last seen active (\S+) ago; threshold is 3s$`)
)

// TestPLEGContainerdKilled SIGKILLs containerd while a library generator,
// `pleg run` and `pleg watch` run against it (relist every 100 ms,
// threshold 3s), kills one container's process while containerd is down,
// and starts containerd again. It checks that health turns unhealthy only
// after the threshold, with the kubelet's exact message (library
// Healthy(), /healthz, /readyz); that the processes survive; that after
// the restart health returns, the event streams reconnect, the exit that
// happened meanwhile is reported with the runtime's exit code, a new
// container is seen, and nothing else is reported (no spurious events for
// what kept running).
//
// On every runtime (TestPLEGContainerdKilled/containerd-<version>), with
// the same health strings; on 1.6 (no event stream) the stream stays
// "unsupported" throughout and is not retried because of the restart.
// CRI-O reports the container killed while it was down as containerd 1.6
// does, exit code 137, reason Error (its conmon saw the exit and wrote it
// to the exits dir); containerd 1.7 and 2.x say 255, reason Unknown.
func TestPLEGContainerdKilled(t *testing.T) {
	forEachRuntime(t, testPLEGContainerdKilled)
}

func testPLEGContainerdKilled(t *testing.T, e *env) {
	const threshold = 3 * time.Second
	lib := startLib(t, "lib", pleg.Options{RelistPeriod: 100 * time.Millisecond, RelistThreshold: threshold}) // events auto
	daemon := startDaemon(t, "daemon", "--relist-period", "100ms", "--relist-threshold", "3s", "--runtime-request-timeout", "2s")
	watch := startWatch(t, "watch", "--relist-period", "100ms", "--runtime-request-timeout", "2s")
	lib.waitFirstRelist(t)
	if e.hasEvents() {
		lib.waitStreamConnected(t)
	} else {
		lib.waitStreamState(t, pleg.StreamUnsupported)
	}
	logs := []*eventLog{lib.log, watch.log, daemon.log}
	caches := []podCache{lib, daemon}

	sb, uid := RunPod(t, "survivor")
	steady := CreateAndStart(t, sb, "steady", []string{"run"})
	victim := CreateAndStart(t, sb, "victim", []string{"run"})
	WaitContainerState(t, victim, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, sb, steady, victim)
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))

	// Healthy, event streams consumed.
	if ok, err := lib.g.Healthy(); !ok {
		t.Fatalf("lib: unhealthy before the kill: %v", err)
	}
	if code, body := daemon.healthz(t); code != http.StatusOK || body != "ok" {
		t.Fatalf("daemon /healthz before the kill: %d %q", code, body)
	}
	var before readyzBody
	eventually(t, 10*time.Second, "daemon event stream connected with events (1.6: unsupported)", func() error {
		_, before = daemon.readyz(t)
		if es := before.Details.EventStream; e.hasEvents() && (es.State != "connected" || es.Events == 0 || es.Connects == 0) {
			return fmt.Errorf("details.eventStream %+v", es)
		} else if !e.hasEvents() && (es.State != "unsupported" || es.Connects > 1) {
			return fmt.Errorf("details.eventStream %+v, want unsupported", es)
		}
		return nil
	})
	libBefore := lib.g.EventStream()
	if e.hasEvents() && (libBefore.State != pleg.StreamConnected || libBefore.Events == 0 || libBefore.Connects == 0) {
		t.Fatalf("lib: event stream %+v, want connected with events", libBefore)
	}
	pid := containerPID(t, victim)

	// Kill containerd; while it is down, the victim's process dies too.
	killedAt := time.Now()
	KillContainerd(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the victim's process %d: %v", pid, err)
	}
	eventually(t, 10*time.Second, "victim process gone", func() error {
		if err := syscall.Kill(pid, 0); err == nil {
			return fmt.Errorf("pid %d still exists", pid)
		}
		return nil
	})

	// Unhealthy after the threshold, not before, with the exact message.
	var unhealthyAt time.Time
	var herr error
	eventually(t, threshold+5*time.Second, "lib unhealthy", func() error {
		ok, err := lib.g.Healthy()
		if ok {
			return errors.New("still healthy")
		}
		unhealthyAt, herr = time.Now(), err
		return nil
	})
	after := unhealthyAt.Sub(killedAt)
	t.Logf("lib unhealthy %v after the kill: %v", after.Round(time.Millisecond), herr)
	// The last successful relist started at most a period (plus a relist)
	// before the kill.
	if after < threshold-500*time.Millisecond || after > threshold+2*time.Second {
		t.Errorf("lib turned unhealthy %v after the kill, want about the %v threshold", after, threshold)
	}
	m := notHealthyRE.FindStringSubmatch(herr.Error())
	if m == nil {
		t.Fatalf("lib Healthy() error %q, want %q", herr, notHealthyRE)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d <= threshold {
		t.Errorf("lib Healthy(): elapsed %q, want a Go duration over %v", m[1], threshold)
	}
	var nh *pleg.NotHealthyError
	if !errors.As(herr, &nh) || nh.Threshold != threshold || nh.Elapsed <= threshold {
		t.Errorf("lib Healthy() error %#v, want a *pleg.NotHealthyError over the threshold", herr)
	}
	var healthz string
	eventually(t, 5*time.Second, "daemon /healthz unhealthy", func() error {
		code, body := daemon.healthz(t)
		healthz = body
		if code != http.StatusInternalServerError {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	if m := healthzUnhealthy.FindStringSubmatch(healthz); m == nil {
		t.Errorf("daemon /healthz body %q, want %q", healthz, healthzUnhealthy)
	} else if d, err := time.ParseDuration(m[1]); err != nil || d <= threshold {
		t.Errorf("daemon /healthz: elapsed %q, want a Go duration over %v", m[1], threshold)
	}
	code, rz := daemon.readyz(t)
	if code != http.StatusServiceUnavailable || rz.Status != "False" || rz.Reason != pleg.ReasonNotReady ||
		!slices.ContainsFunc(rz.Errors, healthzUnhealthy.MatchString) {
		t.Errorf("daemon /readyz while containerd is down: %d %+v, want 503 False KubeletNotReady with the PLEG error", code, rz)
	}
	if es := rz.Details.EventStream; es.State == "connected" || es.LastError == "" {
		t.Errorf("daemon /readyz details.eventStream while containerd is down: %+v", es)
	}
	if s := lib.g.EventStream(); s.State == pleg.StreamConnected || s.LastError == "" {
		t.Errorf("lib: event stream while containerd is down: %+v", s)
	}
	daemon.requireRunning(t)
	watch.requireRunning(t)

	StartContainerd(t)
	restartedAt := time.Now()
	t.Logf("containerd was down for %v", restartedAt.Sub(killedAt).Round(time.Millisecond))

	// Health comes back.
	eventually(t, 10*time.Second, "lib healthy again", func() error {
		if ok, err := lib.g.Healthy(); !ok {
			return err
		}
		return nil
	})
	eventually(t, 10*time.Second, "daemon /healthz ok again", func() error {
		if code, body := daemon.healthz(t); code != http.StatusOK || body != "ok" {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	t.Logf("healthy again %v after the restart", time.Since(restartedAt).Round(time.Millisecond))
	// /readyz stays 503 here only for the runtime's NetworkReady=false (no
	// CNI config in the harness); the PLEG error must be gone.
	if _, rz := daemon.readyz(t); slices.ContainsFunc(rz.Errors, func(e string) bool { return strings.HasPrefix(e, "PLEG is not healthy") }) {
		t.Errorf("daemon /readyz still reports PLEG unhealthy after /healthz recovered: %+v", rz)
	}

	// The exit that happened while containerd was down: the runtime says
	// so after its recovery, and every view reports it with its exit code.
	st := WaitContainerState(t, victim, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	fin := time.Unix(0, st.FinishedAt)
	t.Logf("runtime after recovery: victim exited with code %d, reason %q, finished %v after the kill (containerd restarted %v after it)",
		st.ExitCode, st.Reason, fin.Sub(killedAt).Round(time.Millisecond), restartedAt.Sub(killedAt).Round(time.Millisecond))
	if st.ExitCode == 0 {
		t.Errorf("runtime: victim exit code 0 after a SIGKILL")
	}
	if fin.Before(killedAt) || fin.After(restartedAt) {
		t.Errorf("runtime: victim finished at %v, not between the kill (%v) and the end of the restart (%v)", fin, killedAt, restartedAt)
	}
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, victim)
	for _, l := range logs {
		if e, _ := l.find(pleg.ContainerDied, victim); e.ExitCode == nil || *e.ExitCode != st.ExitCode {
			t.Errorf("%s: %v, want exit code %d", l.name, e, st.ExitCode)
		}
	}
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))

	if !e.hasEvents() {
		// No stream to reconnect: still unsupported, never probed again
		// because of the restart (the next probe is 10 minutes away).
		if s := lib.g.EventStream(); s.State != pleg.StreamUnsupported || s.Connects != libBefore.Connects || s.Events != 0 {
			t.Errorf("lib: event stream after the restart %+v, want unsupported as before", s)
		}
		fresh := CreateAndStart(t, sb, "fresh", []string{"run"})
		WaitContainerState(t, fresh, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
		waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, fresh)
		waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))
		checkKilledHistory(t, logs, sb, steady, victim, fresh)
		if ok, err := lib.g.Healthy(); !ok {
			t.Errorf("lib: unhealthy at the end: %v", err)
		}
		daemon.requireRunning(t)
		watch.requireRunning(t)
		return
	}

	// The event streams reconnect.
	var libAfter pleg.EventStreamStatus
	eventually(t, 20*time.Second, "lib event stream reconnected", func() error {
		libAfter = lib.g.EventStream()
		if libAfter.State != pleg.StreamConnected || libAfter.Connects <= libBefore.Connects {
			return fmt.Errorf("%+v", libAfter)
		}
		return nil
	})
	eventually(t, 20*time.Second, "daemon event stream reconnected", func() error {
		_, rz := daemon.readyz(t)
		if es := rz.Details.EventStream; es.State != "connected" || es.Connects <= before.Details.EventStream.Connects {
			return fmt.Errorf("details.eventStream %+v (before the kill: %+v)", es, before.Details.EventStream)
		}
		return nil
	})
	t.Logf("event streams reconnected %v after the restart", time.Since(restartedAt).Round(time.Millisecond))

	// A container run after the restart: its event and cache entry, and
	// runtime events flowing on the new stream.
	fresh := CreateAndStart(t, sb, "fresh", []string{"run"})
	WaitContainerState(t, fresh, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, fresh)
	waitCached(t, 10*time.Second, caches, uid, truthPod(t, uid))
	eventually(t, 5*time.Second, "lib runtime events on the new stream", func() error {
		if e.sharedEvents() {
			// 1.7 gives each event to one of the three subscribers.
			return nil
		}
		if s := lib.g.EventStream(); s.Events <= libAfter.Events || s.State != pleg.StreamConnected {
			return fmt.Errorf("%+v (at reconnection: %d events)", s, libAfter.Events)
		}
		return nil
	})

	checkKilledHistory(t, logs, sb, steady, victim, fresh)
	if ok, err := lib.g.Healthy(); !ok {
		t.Errorf("lib: unhealthy at the end: %v", err)
	}
	if e.hasEvents() {
		measureUnannounced(t, "runtime-restart", "lib(100ms)", lib.unannounced(t))
	}
	daemon.requireRunning(t)
	watch.requireRunning(t)
}

// checkKilledHistory: nothing else than the kill's history; what kept
// running got no event from the restart.
func checkKilledHistory(t *testing.T, logs []*eventLog, sb, steady, victim, fresh string) {
	t.Helper()
	want := map[string][]pleg.EventType{
		sb:     {pleg.ContainerStarted},
		steady: {pleg.ContainerStarted},
		victim: {pleg.ContainerStarted, pleg.ContainerDied},
		fresh:  {pleg.ContainerStarted},
	}
	for _, l := range logs {
		for id, w := range want {
			if got := l.sequence(id); !slices.Equal(got, w) {
				t.Errorf("%s: events for %.12s: %v, want %v", l.name, id, got, w)
			}
		}
		if n := len(l.all()); n != 5 {
			t.Errorf("%s: %d events, want 5", l.name, n)
		}
	}
}

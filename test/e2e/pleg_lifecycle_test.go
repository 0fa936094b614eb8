package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// TestPLEGLifecycle follows one pod through its life on the real
// containerd and checks after every step that four views delivered the
// events the runtime's changes call for, and that the caches hold what
// containerd reports:
//
//   - lib(events): a generator that relists once a minute, so after its
//     first relist everything reaches it through the runtime's event stream
//     and single-pod relists;
//   - lib(relist): a generator with the event stream off, relisting every
//     100 ms;
//   - watch(events): `pleg watch --output json --events on --relist-period 1m`;
//   - daemon: `pleg run --relist-period 100ms --max-relist-period 2s`
//     (events auto, the adaptive relist on: while its stream is connected
//     and its relists find nothing no event announced, they stretch to
//     every 2 s): its SSE stream and /api/v1/pods.
//
// On every runtime (TestPLEGLifecycle/containerd-<version>). containerd
// 1.6 has no event stream: there lib(events) and watch(events) ask for it
// (--events on), are told it is unsupported, and relist every 100 ms
// instead, so the same events must come from relists alone. containerd
// 1.7 splits its events between subscribers (four here): there the event
// views relist every second, as hints lost to the other subscribers cost
// latency, never events.
//
// CRI-O runs it twice, with enable_pod_events = true and false
// (TestPLEGLifecycle/crio-1.36.3/enable_pod_events=true). With false its
// GetContainerEvents ends at once with OK: pleg must call that
// unsupported, as containerd 1.6's Unimplemented, and relist every
// 100 ms. With true, a sandbox without an infra container (drop_infra_ctr,
// the pods here) gets STARTED and STOPPED events but never DELETED: its
// removal comes from a relist, so the event views relist every second.
func TestPLEGLifecycle(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, e *env) {
		if e.kind != kindCRIO {
			testPLEGLifecycle(t, e)
			return
		}
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("enable_pod_events=%v", on), func(t *testing.T) {
				setPodEvents(t, on)
				testPLEGLifecycle(t, e)
			})
		}
	})
}

func testPLEGLifecycle(t *testing.T, e *env) {
	start := time.Now()
	evPeriod := time.Minute
	switch {
	case !e.hasEvents():
		evPeriod = 100 * time.Millisecond
	case e.sharedEvents(), e.kind == kindCRIO:
		evPeriod = time.Second
	}
	// lib(events) proves that events alone deliver every change: no hint
	// budget, which folds hints that wait for it into early global
	// relists.
	libEv := startLib(t, "lib(events)", pleg.Options{RelistPeriod: evPeriod, Events: pleg.EventsOn,
		PodRelistRate: -1, EarlyRelistGap: -1})
	libRl := startLib(t, "lib(relist)", pleg.Options{RelistPeriod: 100 * time.Millisecond, Events: pleg.EventsOff})
	watch := startWatch(t, "watch(events)", "--events", "on", "--relist-period", evPeriod.String(), "-v=2")
	daemon := startDaemon(t, "daemon", "--relist-period", "100ms", "--max-relist-period", "2s", "-v=2")
	libEv.waitFirstRelist(t)
	libRl.waitFirstRelist(t)
	if e.hasEvents() {
		libEv.waitStreamConnected(t)
		watch.waitStderr(t, "Connected to the runtime's container event stream", 10*time.Second)
	} else {
		libEv.waitStreamState(t, pleg.StreamUnsupported)
		watch.waitStderr(t, "The runtime has no container event stream", 10*time.Second)
	}
	logs := []*eventLog{libEv.log, libRl.log, watch.log, daemon.log}
	caches := []podCache{libEv, libRl, daemon}
	t.Logf("views up after %v", time.Since(start).Round(time.Millisecond))

	const podName = "lifecycle"
	names := map[string]string{} // container ID -> container name (sandbox: "")
	step := func(name string) func() {
		s := time.Now()
		return func() { t.Logf("step %q took %v", name, time.Since(s).Round(time.Millisecond)) }
	}

	// 1. The pod starts: ContainerStarted for the sandbox and each
	// container; the caches hold them running.
	done := step("pod starts")
	sb, uid := RunPod(t, podName)
	names[sb] = ""
	web0 := CreateAndStart(t, sb, "web", []string{"run"})
	side := CreateAndStart(t, sb, "sidecar", []string{"run"})
	names[web0], names[side] = "web", "sidecar"
	WaitContainerState(t, web0, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	WaitContainerState(t, side, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, sb, web0, side)
	truth := truthPod(t, uid)
	if truth.Sandboxes[sb] != "running" || truth.Containers[web0].State != "running" || truth.Containers[side].State != "running" {
		t.Fatalf("runtime: %+v, want the sandbox and both containers running", truth)
	}
	waitCached(t, 10*time.Second, caches, uid, truth)
	done()

	// 2. A container exits with code 3: ContainerDied carrying exit code 3;
	// the caches hold it exited with code 3.
	done = step("exit code 3")
	exiter := CreateAndStart(t, sb, "exiter", []string{"exit", "3"})
	names[exiter] = "exiter"
	if st := WaitContainerState(t, exiter, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second); st.ExitCode != 3 {
		t.Fatalf("runtime: exiter exit code %d, want 3", st.ExitCode)
	}
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, exiter)
	for _, l := range logs {
		if e, _ := l.find(pleg.ContainerDied, exiter); e.ExitCode == nil || *e.ExitCode != 3 {
			t.Errorf("%s: %v, want exit code 3", l.name, e)
		}
	}
	truth = truthPod(t, uid)
	if c := truth.Containers[exiter]; c.State != "exited" || *c.ExitCode != 3 {
		t.Fatalf("runtime: exiter %v", c)
	}
	waitCached(t, 10*time.Second, caches, uid, truth)
	done()

	// 3. A container is restarted, as the kubelet does: the old attempt
	// stops and a new one of the same name starts at once. ContainerDied
	// of the old ID comes before ContainerStarted of the new one.
	done = step("restart")
	StopContainer(t, web0, 10)
	web1 := CreateAndStart(t, sb, "web", []string{"run"})
	names[web1] = "web"
	WaitContainerState(t, web1, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	truth = truthPod(t, uid)
	if c := truth.Containers[web0]; c.State != "exited" || *c.ExitCode != 0 {
		t.Fatalf("runtime: web attempt 0 is %v, want exited 0", c)
	}
	if c := truth.Containers[web1]; c.State != "running" || c.Attempt != 1 {
		t.Fatalf("runtime: web attempt 1 is %v, want running attempt 1", c)
	}
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, web0)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, web1)
	for _, l := range logs {
		died, started := l.index(pleg.ContainerDied, web0), l.index(pleg.ContainerStarted, web1)
		if died > started {
			t.Errorf("%s: ContainerStarted of the new attempt (#%d) before ContainerDied of the old one (#%d)", l.name, started, died)
		}
		if e, _ := l.find(pleg.ContainerDied, web0); e.ExitCode == nil || *e.ExitCode != 0 {
			t.Errorf("%s: %v, want exit code 0", l.name, e)
		}
	}
	waitCached(t, 10*time.Second, caches, uid, truth)
	done()

	// 4. Exited containers are removed: ContainerRemoved, and they leave
	// the caches.
	done = step("remove containers")
	RemoveContainer(t, exiter)
	RemoveContainer(t, web0)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerRemoved, exiter, web0)
	truth = truthPod(t, uid)
	if len(truth.Containers) != 2 {
		t.Fatalf("runtime: %d containers after removing two of four", len(truth.Containers))
	}
	waitCached(t, 10*time.Second, caches, uid, truth)
	done()

	// 5. The pod is stopped (ContainerDied for the sandbox and its
	// running containers, with the exit codes the runtime reports), then
	// removed (ContainerRemoved for each; the cache entry goes).
	done = step("stop pod")
	StopPod(t, sb)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, sb, web1, side)
	truth = truthPod(t, uid)
	if truth.Sandboxes[sb] != "exited" || truth.Containers[web1].State != "exited" || truth.Containers[side].State != "exited" {
		t.Fatalf("runtime after StopPodSandbox: %+v", truth)
	}
	for _, l := range logs {
		for _, id := range []string{web1, side} {
			e, _ := l.find(pleg.ContainerDied, id)
			if want := truth.Containers[id].ExitCode; e.ExitCode == nil || *e.ExitCode != *want {
				t.Errorf("%s: %v, want exit code %d as the runtime reports", l.name, e, *want)
			}
		}
	}
	waitCached(t, 10*time.Second, caches, uid, truth)
	done()

	done = step("remove pod")
	RemovePod(t, sb)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerRemoved, sb, web1, side)
	waitUncached(t, 10*time.Second, caches, uid)
	done()

	// Every view delivered exactly the runtime's history: per ID the
	// exact sequence, nothing for other IDs, every event naming the pod.
	want := map[string][]pleg.EventType{}
	for _, id := range []string{sb, web0, side, web1} {
		want[id] = []pleg.EventType{pleg.ContainerStarted, pleg.ContainerDied, pleg.ContainerRemoved}
	}
	for _, l := range logs {
		for id, w := range want {
			if got := l.sequence(id); !slices.Equal(got, w) {
				t.Errorf("%s: events for %s %.12s: %v, want %v", l.name, nameOr(names[id]), id, got, w)
			}
		}
		// The exiter lives for milliseconds: a view sees it running
		// only if it happens to look at that moment.
		if got := l.sequence(exiter); !slices.Equal(got, []pleg.EventType{pleg.ContainerDied, pleg.ContainerRemoved}) &&
			!slices.Equal(got, []pleg.EventType{pleg.ContainerStarted, pleg.ContainerDied, pleg.ContainerRemoved}) {
			t.Errorf("%s: events for exiter: %v, want [(ContainerStarted) ContainerDied ContainerRemoved]", l.name, got)
		}
		for _, e := range l.all() {
			name, ours := names[e.ContainerID]
			switch {
			case !ours:
				t.Errorf("%s: event for an ID the test did not create: %v", l.name, e)
			case e.PodUID != types.UID(uid) || e.PodName != podName || e.PodNamespace != podNamespace:
				t.Errorf("%s: %v names pod %s %s/%s, want %s %s/%s", l.name, e, e.PodUID, e.PodNamespace, e.PodName, uid, podNamespace, podName)
			case name != "" && e.ContainerName != name:
				t.Errorf("%s: %v has container name %q, want %q", l.name, e, e.ContainerName, name)
			}
		}
		if bad := l.badLines(); len(bad) > 0 {
			t.Errorf("%s: unparsable output: %q", l.name, bad)
		}
	}
	for _, l := range []*eventLog{libEv.log, libRl.log, daemon.log} {
		if n := l.resyncCount(); n != 1 {
			t.Errorf("%s: %d resyncs, want only the initial one", l.name, n)
		}
	}

	// The events-only generator got there through the event stream: one
	// global relist in all, a connected stream, runtime events counted and
	// the event-to-delivery latency observed.
	switch {
	case !e.hasEvents():
		// No stream: told once (the call opens, then answers
		// Unimplemented: at most one connect), no runtime event.
		if s := libEv.g.EventStream(); s.State != pleg.StreamUnsupported || s.Connects > 1 || s.Events != 0 {
			t.Errorf("lib(events): event stream %+v, want unsupported, no events", s)
		}
		// It relists every 100 ms instead. The steps above can take
		// under a second on a quiet machine, so wait for the tenth
		// relist rather than expect it already: a generator stuck on
		// its one-minute period never gets there.
		eventually(t, 5*time.Second, "lib(events) relisting every 100 ms", func() error {
			if n := len(libEv.g.RecentRelists()); n < 10 {
				return fmt.Errorf("%d global relists", n)
			}
			return nil
		})
	case e.sharedEvents():
		// Four subscribers share containerd 1.7's events: this one may
		// have got none of them; the relists delivered the rest.
		if s := libEv.g.EventStream(); s.State != pleg.StreamConnected || s.Connects != 1 {
			t.Errorf("lib(events): event stream %+v, want connected once", s)
		}
	case e.kind == kindCRIO:
		if s := libEv.g.EventStream(); s.State != pleg.StreamConnected || s.Connects != 1 || s.Events == 0 {
			t.Errorf("lib(events): event stream %+v, want connected once with events", s)
		}
		if n, _ := libEv.histogramCount(t, "pleg_runtime_event_to_delivery_seconds"); n == 0 {
			t.Errorf("lib(events): pleg_runtime_event_to_delivery_seconds has no observations")
		}
	default:
		if n := len(libEv.g.RecentRelists()); n != 1 {
			t.Errorf("lib(events): %d global relists, want only the first (the test must take under a minute)", n)
		}
		if s := libEv.g.EventStream(); s.State != pleg.StreamConnected || s.Connects != 1 || s.Events == 0 {
			t.Errorf("lib(events): event stream %+v, want connected once with events", s)
		}
		if n, _ := libEv.histogramCount(t, "pleg_runtime_event_to_delivery_seconds"); n == 0 {
			t.Errorf("lib(events): pleg_runtime_event_to_delivery_seconds has no observations")
		}
	}
	if s := libRl.g.EventStream(); s.State != pleg.StreamOff || s.Events != 0 {
		t.Errorf("lib(relist): event stream %+v, want off", s)
	}
	_, rz := daemon.readyz(t)
	if es := rz.Details.EventStream; e.hasEvents() && (es.Mode != "auto" || es.State != "connected" || (es.Events == 0 && !e.sharedEvents())) {
		t.Errorf("daemon /readyz details.eventStream = %+v, want mode auto, connected, events > 0", es)
	} else if !e.hasEvents() && (es.Mode != "auto" || es.State != "unsupported" || es.Events != 0) {
		t.Errorf("daemon /readyz details.eventStream = %+v, want mode auto, unsupported, no events", es)
	}
	watch.requireRunning(t)
	daemon.requireRunning(t)
	if e.hasEvents() {
		// The daemon relists every 100 ms to 2 s with events auto: each
		// change its relists found first, with its stream connected, is one
		// no event announced in time (containerd 1.7: the events it gave
		// the other subscribers; CRI-O: a sandbox's removal, no DELETED).
		measureUnannounced(t, "lifecycle", "daemon(100ms-2s)", daemon.unannounced(t))
	}
	t.Logf("events delivered: lib(events) %d, lib(relist) %d, watch %d, daemon SSE %d; lib(events) stream %+v",
		len(libEv.log.all()), len(libRl.log.all()), len(watch.log.all()), len(daemon.log.all()), libEv.g.EventStream())
}

func nameOr(name string) string {
	if name == "" {
		return "sandbox"
	}
	return fmt.Sprintf("container %q", name)
}

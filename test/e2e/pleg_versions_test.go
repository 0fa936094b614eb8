package e2e

// What differs between containerd versions exactly where pleg uses the
// runtime's event stream, one test per behaviour (see README.md,
// "Runtimes"):
//
//   - 1.6 has no GetContainerEvents (Unimplemented): reported once, not
//     retried in a loop, relists deliver everything
//     (TestEventStreamUnsupported16);
//   - 1.7 feeds every subscriber from one channel, so a second subscriber
//     takes events away (containerd#7318): TestMeasurePodStartLatency's
//     1.7 subtest (the harness's stream is the second subscriber) proves
//     delivery and measures the latency with the stolen part;
//   - 2.x keeps events for 5 minutes while nobody subscribes and replays
//     them to the next subscriber: the replay after a reconnect costs no
//     runtime call (TestEventStreamReplay22).
//
// TestDiagnose checks `pleg diagnose` on every version.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// TestEventStreamUnsupported16: containerd 1.6.20 answers
// GetContainerEvents with Unimplemented. A library generator and `pleg
// watch` (events auto) each make one GetContainerEvents call and log the
// fact once, over 3 s of relisting every 100 ms (no hot loop: the next
// probe is 10 minutes away), stay healthy, and deliver a pod's events
// through relists alone.
func TestEventStreamUnsupported16(t *testing.T) {
	useRuntime(t, "1.6.")
	lib := startLib(t, "lib", pleg.Options{RelistPeriod: 100 * time.Millisecond})
	watch := startWatch(t, "watch", "--relist-period", "100ms", "-v=2")
	lib.waitFirstRelist(t)
	lib.waitStreamState(t, pleg.StreamUnsupported)
	watch.waitStderr(t, "The runtime has no container event stream", 10*time.Second)

	sb, _ := RunPod(t, "no-events")
	c := CreateAndStart(t, sb, "app", []string{"run"})
	waitEvents(t, 5*time.Second, []*eventLog{lib.log, watch.log}, pleg.ContainerStarted, sb, c)
	time.Sleep(3 * time.Second)

	if n := lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "get_container_events"); n != 1 {
		t.Errorf("lib: %v GetContainerEvents calls in 3+ s, want 1", n)
	}
	if s := lib.g.EventStream(); s.State != pleg.StreamUnsupported || s.Events != 0 || !strings.Contains(s.LastError, "Unimplemented") ||
		time.Until(s.RetryAt) < 9*time.Minute {
		t.Errorf("lib: event stream %+v, want unsupported (Unimplemented), next probe in about 10 minutes", s)
	}
	var unsupported int
	for _, l := range watch.stderrLines() {
		if strings.Contains(l, "The runtime has no container event stream") {
			unsupported++
		}
		if strings.Contains(l, "GetContainerEvents") && !strings.Contains(l, "The runtime has no container event stream") {
			t.Errorf("watch: another line about the event stream: %s", l)
		}
	}
	if unsupported != 1 {
		t.Errorf("watch: %d lines saying the runtime has no event stream, want 1", unsupported)
	}
	if n := lib.metric(t, "kubelet_evented_pleg_connection_error_count"); n != 0 {
		t.Errorf("lib: kubelet_evented_pleg_connection_error_count %v, want 0 (unsupported is not a connection error)", n)
	}
	if ok, err := lib.g.Healthy(); !ok {
		t.Errorf("lib: unhealthy: %v", err)
	}
	relists := len(lib.g.RecentRelists())
	measure(t, "event_stream_unsupported get_container_events_calls=%v log_lines=%d relists=%d seconds=3", lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "get_container_events"), unsupported, relists)
	watch.requireRunning(t)
}

// TestEventStreamReplay22: containerd 2.2.9 keeps the events of the time
// nobody subscribed and replays them to the next subscriber. A library
// generator's stream is cut; a pod is run, a container of it exits and
// another is removed meanwhile (delivered by the relist); after a global
// relist has listed all that, the stream reconnects and containerd
// replays those events: every one of them is dropped as stale
// (pleg_pod_relist_requests_skipped_total{reason="stale_event"}), no
// single-pod relist runs, and the list calls made meanwhile are exactly
// the global relists' (no ListPodSandbox/ListContainers filtered to a
// pod) with no status call at all; no event is delivered twice.
func TestEventStreamReplay22(t *testing.T) {
	useRuntime(t, "2.")
	gate := newGatedSource()
	lib := startLib(t, "lib", pleg.Options{RelistPeriod: time.Second, Events: pleg.EventsOn, EventSource: gate})
	lib.waitFirstRelist(t)
	lib.waitStreamConnected(t)
	// A stream that closes without having carried an event looks like a
	// runtime without one: let one through first.
	warm, _ := RunPod(t, "replay-warmup")
	eventually(t, 5*time.Second, "an event on the stream", func() error {
		if s := lib.g.EventStream(); s.Events == 0 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	waitEvents(t, 5*time.Second, []*eventLog{lib.log}, pleg.ContainerStarted, warm)
	connects := lib.g.EventStream().Connects

	gate.cut()
	eventually(t, 5*time.Second, "stream cut", func() error {
		if s := lib.g.EventStream(); s.State == pleg.StreamConnected {
			return fmt.Errorf("still connected: %+v", s)
		}
		return nil
	})
	// containerd's handler of the cut stream stays subscribed until it
	// takes one more event and fails to send it, and it fails only once
	// containerd has read the stream's reset: until then every event it
	// takes is lost, not kept for the replay (under load that was most of
	// them). A global relist that started after the cut sent its calls on
	// the same connection after the reset, so once one has succeeded,
	// containerd has read it and exactly one event is lost.
	cutAt := time.Now()
	eventually(t, 10*time.Second, "a global relist after the cut", func() error {
		if last := lib.g.LastRelist(); !last.After(cutAt) {
			return fmt.Errorf("last relist started %v", last)
		}
		return nil
	})
	// Under load more are lost (a fresh-machine run replayed 4 of 11):
	// the cut stream's handler, and any handler of a stream cancelled
	// earlier in the suite (containerd's ignore their context), keeps
	// taking events until a send fails. Give them events to fail on (a
	// pod of 8 containers that exit: 26 events) and a few seconds to do
	// so before the changes whose replay is checked; what is left of these
	// events is replayed too, and is as stale.
	flush, _ := RunPod(t, "replay-flush")
	for i := range 8 {
		CreateAndStart(t, flush, fmt.Sprintf("flush-%d", i), []string{"exit", "0"})
	}
	time.Sleep(3 * time.Second)

	// Changes while the stream is cut: delivered by the relists.
	sb, _ := RunPod(t, "replay")
	app := CreateAndStart(t, sb, "app", []string{"run"})
	exiter := CreateAndStart(t, sb, "exiter", []string{"exit", "3"})
	gone := CreateAndStart(t, sb, "gone", []string{"exit", "0"})
	WaitContainerState(t, exiter, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	WaitContainerState(t, gone, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	RemoveContainer(t, gone)
	changed := time.Now()
	logs := []*eventLog{lib.log}
	waitEvents(t, 10*time.Second, logs, pleg.ContainerStarted, sb, app)
	waitEvents(t, 10*time.Second, logs, pleg.ContainerDied, exiter)
	eventually(t, 10*time.Second, "a global relist started after the changes", func() error {
		if last := lib.g.LastRelist(); !last.After(changed) {
			return fmt.Errorf("last relist started %v", last)
		}
		return nil
	})

	// Reconnect: containerd replays what happened meanwhile.
	type counts struct{ stale, podRelists, lists, relists, status, events float64 }
	snap := func() counts {
		return counts{
			stale:      lib.labelled(t, "pleg_pod_relist_requests_skipped_total", "reason", "stale_event"),
			podRelists: lib.labelled(t, "kubelet_pleg_pod_relist_duration_seconds", "", ""),
			lists: lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "list_podsandbox") +
				lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "list_containers"),
			relists: lib.labelled(t, "kubelet_pleg_relist_duration_seconds", "", ""),
			status: lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "container_status") +
				lib.labelled(t, "kubelet_runtime_operations_total", "operation_type", "podsandbox_status"),
			events: float64(len(lib.log.all())),
		}
	}
	// A relist may be running: let the counters settle on a whole one.
	before := snap()
	eventsBefore := lib.g.EventStream().Events
	gate.reopen()
	eventually(t, 10*time.Second, "stream reconnected with the replay", func() error {
		s := lib.g.EventStream()
		if s.State != pleg.StreamConnected || s.Connects <= connects {
			return fmt.Errorf("%+v", s)
		}
		if s.Events-eventsBefore < 5 {
			return fmt.Errorf("%d events replayed so far", s.Events-eventsBefore)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the rest of the replay, if any
	after := snap()
	replayed := lib.g.EventStream().Events - eventsBefore
	d := counts{after.stale - before.stale, after.podRelists - before.podRelists, after.lists - before.lists,
		after.relists - before.relists, after.status - before.status, after.events - before.events}
	t.Logf("replay: %d runtime events; delta: %+v", replayed, d)
	measure(t, "replay_after_reconnect runtime_events=%d stale_skipped=%v pod_relists=%v filtered_list_calls=%v status_calls=%v global_relists=%v",
		replayed, d.stale, d.podRelists, d.lists-2*d.relists, d.status, d.relists)
	if d.stale < 5 || d.stale > float64(replayed) {
		t.Errorf("stale_event skips %v for %d replayed events, want the replay's (at least CREATED/STARTED of the sandbox and app)", d.stale, replayed)
	}
	if d.podRelists != 0 {
		t.Errorf("%v single-pod relists ran during the replay, want none", d.podRelists)
	}
	// Each global relist makes one unfiltered ListPodSandbox and one
	// ListContainers; anything more is a single-pod relist's filtered
	// call. (A relist running at the snapshot may count its list calls on
	// one side and its duration on the other: allow that one.)
	if extra := d.lists - 2*d.relists; extra > 2 || extra < -2 {
		t.Errorf("%v list calls for %v global relists during the replay: filtered list calls were made", d.lists, d.relists)
	}
	if d.status != 0 {
		t.Errorf("%v status calls during the replay, want none (nothing changed)", d.status)
	}
	if d.events != 0 {
		t.Errorf("%v lifecycle events during the replay, want none (all delivered before)", d.events)
	}
	seq := lib.log.sequence(exiter)
	if len(seq) > 2 {
		t.Errorf("exiter: %v, want each event once", seq)
	}
}

// TestDiagnose runs `pleg diagnose` (JSON and text) against every runtime
// with two running pods and a pod whose container exited: exit 0, the
// listing's two calls, every pod inspected ok, the same healthy verdict
// on every version.
func TestDiagnose(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, e *env) {
		var sbs []string
		for i := 0; i < 2; i++ {
			sb, _ := RunPod(t, fmt.Sprintf("diag-%d", i))
			CreateAndStart(t, sb, "app", []string{"run"})
			sbs = append(sbs, sb)
		}
		sb, _ := RunPod(t, "diag-exited")
		ex := CreateAndStart(t, sb, "done", []string{"exit", "3"})
		WaitContainerState(t, ex, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)

		rep, text, took := runDiagnose(t, 0)
		t.Logf("diagnose took %v: %s", took.Round(time.Millisecond), rep.Verdict)
		if !rep.Healthy || rep.Cause != nil || rep.Estimate.ListFails || rep.Estimate.HungCalls != 0 || rep.ShimProbe != nil {
			t.Errorf("diagnose healthy=%v cause=%+v estimate=%+v shimProbe=%+v, want healthy, no cause, no probe", rep.Healthy, rep.Cause, rep.Estimate, rep.ShimProbe)
		}
		if rep.List.Error != "" || len(rep.List.Calls) != 2 {
			t.Errorf("diagnose list: %+v, want two calls without error", rep.List)
		}
		if len(rep.Pods) != 3 {
			t.Errorf("diagnose reports %d pods, want 3", len(rep.Pods))
		}
		for _, p := range rep.Pods {
			if p.Result != "ok" || p.Namespace != podNamespace || !strings.HasPrefix(p.Name, "diag-") {
				t.Errorf("diagnose: pod %s/%s result %q (%s), want ok", p.Namespace, p.Name, p.Result, p.Error)
			}
		}
		for _, v := range []string{rep.Verdict, lastLine(text)} {
			if !strings.HasPrefix(v, "relist would take ~") || !strings.HasSuffix(v, " (threshold 3m0s): healthy") {
				t.Errorf("verdict %q, want \"relist would take ~... (threshold 3m0s): healthy\" (JSON and the text's last line)", v)
			}
		}
		// ~20 ms on a quiet machine; the bound only proves diagnose
		// waits for no timeout, with room for a loaded machine.
		if took > 10*time.Second {
			t.Errorf("diagnose took %v, want well under 10s", took)
		}
	})
}

package e2e

// Measurements for the closing note. Each test logs its figures
// with t.Logf and prints one "MEASURE ..." line per figure on stdout (shown
// with -v). race=true in a line means the figures were taken with the race
// detector on, which slows the in-process generators (not containerd or
// the pleg binary).

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/stats"
)

// TestMeasurePodStartLatency measures, on the real containerd, the time
// from a sandbox or container starting to a library subscription
// receiving its ContainerStarted, for two generators of the same run: one
// using the runtime's event stream (events auto) and one relisting only
// (events off), both with the kubelet's 1 s relist period. 10 pods of 2
// containers are started one after another (30 IDs). Two bases:
//
//   - from the harness's RunPodSandbox/StartContainer call returning (with
//     the event stream the event can arrive before the call returns:
//     negative values);
//   - from the runtime's own CONTAINER_STARTED_EVENT (its created_at, read
//     from a separate GetContainerEvents stream): the issue's "container
//     state change in the runtime to pleg event delivered".
//
// On every runtime (TestMeasurePodStartLatency/containerd-<version>):
//
//   - 1.6 has no event stream: events-on is relist-only too, and the
//     runtime's basis is its own status (container StartedAt, sandbox
//     CreatedAt: basis=runtime_status);
//   - 1.7 shares its events between subscribers (containerd#7318): the
//     harness's stream is a second subscriber that takes part of the
//     events away from events-on, as another agent or the kubelet's
//     Evented PLEG would. The test proves that events-on still delivers
//     every event and measures its latency with the stolen part (basis
//     runtime_status, as the harness's stream misses events too).
func TestMeasurePodStartLatency(t *testing.T) {
	forEachRuntime(t, testMeasurePodStartLatency)
}

func testMeasurePodStartLatency(t *testing.T, e *env) {
	const nPods, perPod = 10, 2
	on := startLib(t, "events-on", pleg.Options{RelistPeriod: time.Second, Events: pleg.EventsAuto})
	off := startLib(t, "events-off", pleg.Options{RelistPeriod: time.Second, Events: pleg.EventsOff})
	on.waitFirstRelist(t)
	if e.hasEvents() {
		on.waitStreamConnected(t)
	} else {
		on.waitStreamState(t, pleg.StreamUnsupported)
	}
	off.waitFirstRelist(t)

	// When the runtime says each container started: its STARTED events
	// (2.x), or its status (1.6, 1.7).
	var mu sync.Mutex
	runtimeStarted := map[string]time.Time{}
	var harnessStarted, harnessEvents int // STARTED / all events the harness's subscriber got
	basisName := "runtime_started_event"
	if !e.hasEvents() || e.sharedEvents() {
		basisName = "runtime_status"
	}
	if e.hasEvents() {
		events := ContainerEvents(t)
		go func() {
			for ev := range events {
				mu.Lock()
				harnessEvents++
				mu.Unlock()
				if ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT {
					continue
				}
				mu.Lock()
				harnessStarted++
				if _, ok := runtimeStarted[ev.ContainerId]; !ok && !e.sharedEvents() {
					runtimeStarted[ev.ContainerId] = time.Unix(0, ev.CreatedAt)
				}
				mu.Unlock()
			}
		}()
	}
	eventsBefore := on.g.EventStream().Events

	returned := map[string]time.Time{}
	var ids []string
	for i := 0; i < nPods; i++ {
		sb, _ := RunPod(t, fmt.Sprintf("latency-%02d", i))
		returned[sb] = time.Now()
		ids = append(ids, sb)
		for j := 0; j < perPod; j++ {
			id := CreateContainer(t, sb, fmt.Sprintf("c%d", j), []string{"run"})
			StartContainer(t, id)
			returned[id] = time.Now()
			ids = append(ids, id)
		}
	}
	waitEvents(t, 15*time.Second, []*eventLog{on.log, off.log}, pleg.ContainerStarted, ids...)
	// statusStarted is when the runtime's status says id started (a
	// sandbox: was created).
	statusStarted := func(id string) time.Time {
		var at int64
		if cs, err := RuntimeClient().ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id}); err == nil {
			at = cs.Status.StartedAt
		} else {
			ps, err := RuntimeClient().PodSandboxStatus(criCtx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
			if err != nil {
				t.Fatalf("no container or sandbox status for %.12s: %v", id, err)
			}
			at = ps.Status.CreatedAt
		}
		return time.Unix(0, at)
	}
	if basisName == "runtime_status" {
		for _, id := range ids {
			at := statusStarted(id)
			mu.Lock()
			runtimeStarted[id] = at
			mu.Unlock()
		}
	}
	// The harness's own subscriber may miss a STARTED event: CRI-O drops
	// what its event channel cannot take (seen under the load harness: a
	// sandbox's). pleg's delivery is asserted above, by waitEvents; for
	// an ID whose event the harness missed within 5 s, the basis is the
	// runtime's status, and the MEASURE line counts them.
	missed := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		var missing []string
		for _, id := range ids {
			if _, ok := runtimeStarted[id]; !ok {
				missing = append(missing, id)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, id := range missing {
				at := statusStarted(id)
				mu.Lock()
				runtimeStarted[id] = at
				mu.Unlock()
			}
			missed = len(missing)
			t.Logf("the harness's subscriber got no STARTED event for %d of %d IDs in 5s; their basis is the runtime's status", missed, len(ids))
			break
		}
	}

	type result struct{ fromReturn, fromRuntime []time.Duration }
	results := map[string]*result{}
	for _, v := range []*libView{on, off} {
		r := &result{}
		for _, id := range ids {
			e, _ := v.log.find(pleg.ContainerStarted, id)
			mu.Lock()
			rs := runtimeStarted[id]
			mu.Unlock()
			r.fromReturn = append(r.fromReturn, e.At.Sub(returned[id]))
			r.fromRuntime = append(r.fromRuntime, e.At.Sub(rs))
		}
		results[v.name] = r
		for _, basis := range []struct {
			name string
			ds   []time.Duration
		}{{"cri_call_return", r.fromReturn}, {basisName, r.fromRuntime}} {
			measure(t, "pod_start_to_started_p50=%s p99=%s max=%s min=%s n=%d generator=%s relist_period=1s basis=%s basis_from_status_for=%d",
				ms(stats.Percentile(basis.ds, 0.50)), ms(stats.Percentile(basis.ds, 0.99)), ms(stats.Percentile(basis.ds, 1)), ms(stats.Percentile(basis.ds, 0)),
				len(basis.ds), v.name, basis.name, missed)
		}
	}

	if !e.hasEvents() {
		// Relists alone delivered everything (waitEvents above); the
		// stream was reported unsupported, not retried.
		if s := on.g.EventStream(); s.State != pleg.StreamUnsupported || s.Connects > 1 || s.Events != 0 {
			t.Errorf("events-on: event stream %+v, want unsupported once", s)
		}
		return
	}
	if e.sharedEvents() {
		// The harness's subscriber and events-on split the STARTED
		// events; both together got about what the runtime emitted.
		// Every ID had a CREATED and a STARTED event: 2 per ID in all,
		// which a broadcast would give to each subscriber.
		mu.Lock()
		h, hs := harnessEvents, harnessStarted
		mu.Unlock()
		got := on.g.EventStream().Events - eventsBefore
		measure(t, "shared_event_stream events_to_events_on=%d events_to_second_subscriber=%d (started %d) runtime_events=%d",
			got, h, hs, 2*len(ids))
		if h == 0 || got >= int64(2*len(ids)) {
			t.Errorf("events-on got %d of the %d events, the second subscriber %d: the events were not shared", got, 2*len(ids), h)
		}
	}

	// The event path was used, and is the faster one.
	count, sum := on.histogramCount(t, "pleg_runtime_event_to_delivery_seconds")
	if count == 0 {
		t.Errorf("events-on: pleg_runtime_event_to_delivery_seconds has no observations")
	} else {
		measure(t, "runtime_event_to_delivery_histogram count=%d mean=%s generator=events-on", count,
			ms(time.Duration(sum/float64(count)*float64(time.Second))))
	}
	if n, _ := off.histogramCount(t, "pleg_runtime_event_to_delivery_seconds"); n != 0 {
		t.Errorf("events-off: pleg_runtime_event_to_delivery_seconds has %d observations, want none", n)
	}
	if s := on.g.EventStream(); s.State != pleg.StreamConnected || s.Events == 0 {
		t.Errorf("events-on: event stream %+v", s)
	}
	onP50, offP50 := stats.Percentile(results["events-on"].fromRuntime, 0.50), stats.Percentile(results["events-off"].fromRuntime, 0.50)
	if onP50 >= offP50 {
		t.Errorf("events-on p50 %v is not below events-off p50 %v: the event path did not speed delivery up", onP50, offP50)
	}
	p99 := stats.Percentile(results["events-on"].fromRuntime, 0.99)
	if e.sharedEvents() {
		return // the 50 ms target is for a stream of our own
	}
	verdict := "met"
	if p99 > 50*time.Millisecond {
		verdict = "NOT met"
	}
	t.Logf("issue target (events on: p99 <= 50ms from the runtime's state change to delivery): %s (p99 %s)", verdict, ms(p99))
	measure(t, "target_events_on_p99_le_50ms=%s p99=%s", strings.ReplaceAll(verdict, " ", "_"), ms(p99))
}

// relistsBody is the daemon's /api/v1/relists.
type relistsBody struct {
	Relists []struct {
		DurationSeconds float64 `json:"durationSeconds"`
		Pods            int     `json:"pods"`
		Containers      int     `json:"containers"`
		Inspected       int     `json:"inspected"`
		Failed          int     `json:"failed"`
		Events          int     `json:"events"`
		Error           string  `json:"error"`
	} `json:"relists"`
}

// TestMeasureRelist50Pods measures global relist durations with 50 pods of
// 3 running containers (200 IDs with the sandboxes): the relist that
// inspects all 50 pods (a fresh generator's first relist: every pod is
// new to it) and 20 steady relists after it (nothing changed), with the
// default 8 parallel inspections and with 1 (the kubelet's serial
// algorithm). Each configuration runs alone, one after another, as a
// library generator in this process and as the pleg binary
// (/api/v1/relists), events off, relist period 100 ms. On every runtime
// (TestMeasureRelist50Pods/containerd-<version>).
func TestMeasureRelist50Pods(t *testing.T) {
	forEachRuntime(t, testMeasureRelist50Pods)
}

func testMeasureRelist50Pods(t *testing.T, _ *env) {
	const nPods, nContainers, steadyN = 50, 3, 20
	start := time.Now()
	runLoad(t, "relist", nPods, nContainers)
	t.Logf("created %d pods × %d containers in %v", nPods, nContainers, time.Since(start).Round(time.Millisecond))
	ctrs, err := RuntimeClient().ListContainers(criCtx(t), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ctrs.Containers) != nPods*nContainers {
		t.Fatalf("runtime: %d containers running, want %d", len(ctrs.Containers), nPods*nContainers)
	}

	type stat struct {
		d                                   time.Duration
		pods, containers, inspected, events int
		failed                              int
		err                                 string
	}
	report := func(view string, parallel int, recent []stat) {
		t.Helper()
		if len(recent) < 1+steadyN {
			t.Fatalf("%s: %d relists", view, len(recent))
		}
		first := recent[0]
		if first.err != "" || first.pods != nPods || first.containers != nPods*(1+nContainers) ||
			first.inspected != nPods || first.failed != 0 || first.events != nPods*(1+nContainers) {
			t.Errorf("%s parallel=%d: first relist %+v, want %d pods, %d containers, %d inspected, %d events",
				view, parallel, first, nPods, nPods*(1+nContainers), nPods, nPods*(1+nContainers))
		}
		var steady []time.Duration
		for _, s := range recent[1 : 1+steadyN] {
			if s.err != "" || s.inspected != 0 || s.pods != nPods {
				t.Errorf("%s parallel=%d: steady relist %+v, want %d pods and nothing inspected", view, parallel, s, nPods)
			}
			steady = append(steady, s.d)
		}
		var all []string
		for _, s := range recent[:1+steadyN] {
			all = append(all, ms(s.d))
		}
		t.Logf("%s parallel=%d: relist durations %v", view, parallel, all)
		measure(t, "relist_50pods_first=%s steady_p50=%s steady_p99=%s n=%d max_parallel_inspections=%d view=%s",
			ms(first.d), ms(stats.Percentile(steady, 0.50)), ms(stats.Percentile(steady, 0.99)), len(steady), parallel, view)
	}

	for _, parallel := range []int{8, 1} {
		v := startLib(t, fmt.Sprintf("lib-parallel-%d", parallel), pleg.Options{
			RelistPeriod: 100 * time.Millisecond, Events: pleg.EventsOff, MaxParallelInspections: parallel})
		eventually(t, 30*time.Second, v.name+": relists", func() error {
			if n := len(v.g.RecentRelists()); n < 1+steadyN {
				return fmt.Errorf("%d relists", n)
			}
			return nil
		})
		v.g.Stop()
		var recent []stat
		for _, s := range v.g.RecentRelists() {
			recent = append(recent, stat{d: s.Duration, pods: s.Pods, containers: s.Containers,
				inspected: s.Inspected, events: s.Events, failed: s.Failed, err: s.Err})
		}
		report("library", parallel, recent)
		if n := len(v.log.counts(pleg.ContainerStarted)); n != nPods*(1+nContainers) {
			t.Errorf("%s: ContainerStarted for %d IDs, want %d", v.name, n, nPods*(1+nContainers))
		}
	}

	for _, parallel := range []int{8, 1} {
		d := startDaemon(t, fmt.Sprintf("daemon-parallel-%d", parallel), "--events", "off",
			"--relist-period", "100ms", "--max-parallel-inspections", fmt.Sprint(parallel))
		var body relistsBody
		eventually(t, 30*time.Second, d.name+": relists", func() error {
			if _, err := d.getJSON("/api/v1/relists", &body); err != nil {
				return err
			}
			if n := len(body.Relists); n < 1+steadyN {
				return fmt.Errorf("%d relists", n)
			}
			return nil
		})
		d.stop(t)
		var recent []stat
		for _, s := range body.Relists {
			recent = append(recent, stat{d: time.Duration(s.DurationSeconds * float64(time.Second)), pods: s.Pods,
				containers: s.Containers, inspected: s.Inspected, events: s.Events, failed: s.Failed, err: s.Error})
		}
		report("pleg-run", parallel, recent)
	}
}

package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// TestPLEG50Pods creates 50 pods of 3 containers at once, then stops and
// removes them all at once, and checks that every view delivered every
// event exactly once: one ContainerStarted, one ContainerDied and one
// ContainerRemoved per sandbox and container ID, nothing else, no resync
// (which would mean events were skipped), and caches equal to the runtime.
//
// On every runtime (TestPLEG50Pods/containerd-<version>).
func TestPLEG50Pods(t *testing.T) {
	forEachRuntime(t, testPLEG50Pods)
}

func testPLEG50Pods(t *testing.T, e *env) {
	const nPods, nContainers = 50, 3
	lib := startLib(t, "lib", pleg.Options{RelistPeriod: time.Second}) // the kubelet's period, events auto
	watch := startWatch(t, "watch", "--relist-period", "100ms")
	daemon := startDaemon(t, "daemon", "--relist-period", "100ms")
	// A busy, healthy node raises no forecast (docs/forecast.md).
	fw := watchForecast(t, daemon, 200*time.Millisecond)
	t.Cleanup(func() {
		if bad := fw.atRisk(); len(bad) > 0 {
			t.Errorf("the forecast was at risk (or unreadable) on a busy, healthy node, %d times; first: %+v", len(bad), bad[0])
		}
	})
	lib.waitFirstRelist(t)
	if e.hasEvents() {
		lib.waitStreamConnected(t)
	} else {
		lib.waitStreamState(t, pleg.StreamUnsupported)
	}
	logs := []*eventLog{lib.log, watch.log, daemon.log}

	start := time.Now()
	pods := runLoad(t, "load", nPods, nContainers)
	created := time.Now()
	t.Logf("created %d pods × %d containers in %v", nPods, nContainers, time.Since(start).Round(time.Millisecond))

	owner := map[string]string{} // container or sandbox ID -> pod UID
	var ids []string
	for _, p := range pods {
		owner[p.sandbox] = p.uid
		ids = append(ids, p.sandbox)
		for _, c := range p.containers {
			owner[c] = p.uid
			ids = append(ids, c)
		}
	}
	if len(owner) != nPods*(1+nContainers) {
		t.Fatalf("%d distinct IDs, want %d", len(owner), nPods*(1+nContainers))
	}

	// The runtime's truth: everything running.
	ctx := criCtx(t)
	ctrs, err := RuntimeClient().ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, c := range ctrs.Containers {
		if _, ok := owner[c.Id]; ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running++
		}
	}
	if running != nPods*nContainers {
		t.Fatalf("runtime: %d of our %d containers running", running, nPods*nContainers)
	}

	waitEvents(t, 30*time.Second, logs, pleg.ContainerStarted, ids...)
	t.Logf("every view had all %d ContainerStarted %v after the last StartContainer returned", len(ids), time.Since(created).Round(time.Millisecond))
	caches := []podCache{lib, daemon}
	for _, p := range pods {
		waitCached(t, 10*time.Second, caches, p.uid, truthPod(t, p.uid))
	}
	if n := lib.g.Cache().Len(); n != nPods {
		t.Errorf("lib: cache holds %d pods, want %d", n, nPods)
	}
	if body, err := daemon.allPods(); err != nil || len(body.Pods) != nPods {
		t.Errorf("daemon: /api/v1/pods holds %d pods (err %v), want %d", len(body.Pods), err, nPods)
	}

	// Stop and remove every pod at once.
	start = time.Now()
	inParallel(t, len(pods), 8, func(tb testing.TB, i int) {
		StopPod(tb, pods[i].sandbox)
		RemovePod(tb, pods[i].sandbox)
	})
	t.Logf("stopped and removed %d pods in %v", nPods, time.Since(start).Round(time.Millisecond))
	waitEvents(t, 30*time.Second, logs, pleg.ContainerRemoved, ids...)
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waitUncached(goroutineTB{t}, 10*time.Second, caches, p.uid)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Exactly once each, nothing else.
	for _, l := range logs {
		for _, typ := range []pleg.EventType{pleg.ContainerStarted, pleg.ContainerDied, pleg.ContainerRemoved} {
			counts := l.counts(typ)
			var wrong []string
			for _, id := range ids {
				if counts[id] != 1 {
					wrong = append(wrong, fmt.Sprintf("%.12s×%d", id, counts[id]))
				}
			}
			sort.Strings(wrong)
			if len(wrong) > 0 {
				t.Errorf("%s: %s not exactly once for %d IDs: %v", l.name, typ, len(wrong), wrong[:min(len(wrong), 10)])
			}
		}
		for _, ev := range l.all() {
			if uid, ok := owner[ev.ContainerID]; !ok || ev.PodUID != types.UID(uid) {
				t.Errorf("%s: unexpected event %v for pod %s", l.name, ev, ev.PodUID)
			}
		}
		if n := len(l.all()); n != 3*len(ids) {
			t.Errorf("%s: %d events, want %d", l.name, n, 3*len(ids))
		}
		if bad := l.badLines(); len(bad) > 0 {
			t.Errorf("%s: unparsable output: %q", l.name, bad)
		}
	}
	for _, l := range []*eventLog{lib.log, daemon.log} {
		if n := l.resyncCount(); n != 1 {
			t.Errorf("%s: %d resyncs, want only the initial one (a second means events were skipped)", l.name, n)
		}
	}
	if n := lib.metric(t, "pleg_subscriber_resyncs_total"); n != 0 {
		t.Errorf("lib: pleg_subscriber_resyncs_total %v", n)
	}
	for _, l := range watch.stderrLines() {
		if strings.Contains(l, "Fell behind") || strings.Contains(l, "discard") {
			t.Errorf("watch: %s", l)
		}
	}
	watch.requireRunning(t)
	daemon.requireRunning(t)
	s := lib.g.EventStream()
	t.Logf("lib: %d global relists, event stream %s with %d runtime events", len(lib.g.RecentRelists()), s.State, s.Events)
}

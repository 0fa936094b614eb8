package e2e

// pleg beside the kubelet v1.37.2 with its EventedPLEG gate on. In v1.37
// the evented PLEG is only a container-termination fast path: on a
// CONTAINER_STOPPED_EVENT from the runtime's event stream it asks its
// GenericPLEG for a single-pod relist, and the GenericPLEG emits the
// events. pleg uses the same stream as hints for a single-pod relist of
// every event type. Both are measured on the same exits, in the same run.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/stats"
)

// kubeletFastPathLine is the kubelet's log line (V(4)) for a single-pod
// relist its evented PLEG requested on a container's termination.
const kubeletFastPathLine = `"Evented PLEG: requested pod relist after container termination"`

// fastPathRequests returns the container IDs the kubelet's evented PLEG
// requested a relist for, from its log.
func (k *kubelet) fastPathRequests() map[string]bool {
	out := map[string]bool{}
	b, _ := os.ReadFile(k.logPath) // a missing log is no request
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, kubeletFastPathLine) {
			continue
		}
		for _, kv := range kvRE.FindAllStringSubmatch(l, -1) {
			if kv[1] == "containerID" {
				out[kv[2]] = true
			}
		}
	}
	return out
}

// TestKubeletEventedSideBySide runs pleg run beside the kubelet v1.37.2
// with EventedPLEG on, on the kubelet's containerd. Six pods (restart
// policy Never) each run one container that exits on its own, 2 s plus
// 170 ms per pod after it starts, so that the exits fall at different
// points of both PLEGs' 1 s relist periods. For each exit it checks that
// the kubelet's fast path requested a relist for the container and that
// pleg delivered the kubelet's ContainerDied, and measures, from the
// container's finish time in the runtime (FinishedAt): the kubelet's
// delivery (its "SyncLoop (PLEG)" line), pleg's (the event's time), and
// their difference. pleg's p50 must not be more than 100 ms after the
// kubelet's (its hints are on by default).
func TestKubeletEventedSideBySide(t *testing.T) {
	PlegBinary(t) // into the suite's dir, which outlives this test's env
	k := startKubelet(t, "EventedPLEG")
	useEnv(t, k.Env())
	d := startDaemon(t, "pleg run")
	d.waitStderr(t, "listening on", 10*time.Second)
	s := &sideBySide{k: k, d: d, uids: map[string]string{}}

	eventually(t, 15*time.Second, "the kubelet's evented PLEG connected to the event stream", func() error {
		mfs, err := k.Metrics()
		if err != nil {
			return err
		}
		mf := mfs["kubelet_evented_pleg_connection_success_count"]
		if mf == nil || len(mf.GetMetric()) == 0 || mf.GetMetric()[0].GetCounter().GetValue() < 1 {
			return fmt.Errorf("kubelet_evented_pleg_connection_success_count: %v", mf)
		}
		return nil
	})

	const pods = 6
	var names []string
	for i := range pods {
		names = append(names, k.AddPod(t, StaticPod{Name: fmt.Sprintf("exit-%d", i), RestartPolicy: "Never",
			Containers: []StaticContainer{{Name: "job", Args: []string{"sleep", (2*time.Second + time.Duration(i)*170*time.Millisecond).String()}}}}))
	}
	type exit struct {
		name, id          string
		finished          time.Time
		kubelet, plegTime time.Time
	}
	var exits []exit
	for _, name := range names {
		p := k.WaitPod(t, name, 90*time.Second, func(p kubePod) error {
			c, ok := p.container("job")
			if !ok || c.State.Terminated == nil || c.State.Terminated.ContainerID == "" {
				return fmt.Errorf("job not terminated: %+v", c)
			}
			return nil
		})
		c, _ := p.container("job")
		id := runtimeID(c.State.Terminated.ContainerID)
		st := ContainerStatus(t, id)
		exits = append(exits, exit{name: name, id: id, finished: time.Unix(0, st.GetFinishedAt())})
	}
	n := s.checkEvents(t, names...)

	// The kubelet's fast path asked for a relist for every exit (it logs
	// the request before its GenericPLEG serves it).
	eventually(t, 15*time.Second, "the kubelet's evented PLEG requested a relist for every exit", func() error {
		req := k.fastPathRequests()
		var missing []string
		for _, e := range exits {
			if !req[e.id] {
				missing = append(missing, fmt.Sprintf("%.12s (%s)", e.id, e.name))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no %s line for %s", kubeletFastPathLine, strings.Join(missing, ", "))
		}
		return nil
	})

	var kubeLat, plegLat, diff []time.Duration
	for i, e := range exits {
		uid := s.podUID(t, e.name)
		key := eventKey{uid, e.id, string(pleg.ContainerDied)}
		var kev *kubeletEvent
		for _, ke := range kubeletEvents(k.PLEGLines(), map[string]bool{uid: true}) {
			if ke.key == key && ke.delivered {
				kev = &ke
				break
			}
		}
		if kev == nil {
			t.Fatalf("the kubelet did not deliver %s", key)
		}
		pe, ok := s.plegEvent(key)
		if !ok {
			t.Fatalf("pleg did not deliver %s", key)
		}
		exits[i].kubelet, exits[i].plegTime = kev.at, pe.Time
		kubeLat = append(kubeLat, kev.at.Sub(e.finished))
		plegLat = append(plegLat, pe.Time.Sub(e.finished))
		diff = append(diff, pe.Time.Sub(kev.at))
		t.Logf("%s %.12s: finished %s, kubelet +%s, pleg +%s", e.name, e.id, e.finished.Format("15:04:05.000"),
			ms(kev.at.Sub(e.finished)), ms(pe.Time.Sub(e.finished)))
	}
	s.checkCache(t, names[0])
	s.checkHealth(t)
	measure(t, "kubelet-evented-side-by-side: ContainerDied after the container finished, %d exits (%d kubelet events checked): kubelet v1.37.2 EventedPLEG p50=%s max=%s, pleg p50=%s max=%s, pleg minus kubelet p50=%s min=%s max=%s (negative: pleg first)",
		len(exits), n, ms(stats.Percentile(kubeLat, 0.50)), ms(slices.Max(kubeLat)), ms(stats.Percentile(plegLat, 0.50)), ms(slices.Max(plegLat)),
		ms(stats.Percentile(diff, 0.50)), ms(slices.Min(diff)), ms(slices.Max(diff)))
	// Both follow the same event from the same containerd: what the
	// runtime and the machine's load add (tens to hundreds of ms) is in
	// both. pleg's hints must not be slower than the kubelet's fast path.
	if p := stats.Percentile(diff, 0.50); p > 100*time.Millisecond {
		t.Errorf("pleg delivered ContainerDied %s (p50) after the kubelet's evented PLEG, want at most 100 ms", ms(p))
	}
}

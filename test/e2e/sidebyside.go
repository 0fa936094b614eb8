package e2e

// pleg beside the real kubelet: the events the kubelet's PLEG produced
// (read from its log) and sideBySide, which checks a `pleg run` on the
// kubelet's containerd against them and against the kubelet's /pods
// (TestKubeletSideBySide, TestKubeletEventedSideBySide).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// kubeletEvent is a lifecycle event the kubelet's PLEG produced: from a
// "SyncLoop (PLEG)" line (its delivery), or derived from a "GenericPLEG"
// transition line (its relist's diff) for what the SyncLoop does not log
// (ContainerRemoved, events of pods it no longer knows).
type kubeletEvent struct {
	key       eventKey
	at        time.Time // the SyncLoop line when there is one, else the GenericPLEG line
	delivered bool      // at is a SyncLoop line's
}

// eventKey identifies an event: pod, container (or sandbox), type.
type eventKey struct {
	PodUID, ContainerID, Type string
}

func (k eventKey) String() string {
	return fmt.Sprintf("%s %.12s (pod %.8s)", k.Type, k.ContainerID, k.PodUID)
}

// transitionEvents are the events a GenericPLEG transition yields, as the
// kubelet's generateEvents makes them (ContainerChanged is never
// delivered, so it is left out).
func transitionEvents(oldState, newState string) []string {
	switch newState {
	case "running":
		return []string{string(pleg.ContainerStarted)}
	case "exited":
		return []string{string(pleg.ContainerDied)}
	case "non-existent":
		if oldState == "exited" {
			return []string{string(pleg.ContainerRemoved)}
		}
		return []string{string(pleg.ContainerDied), string(pleg.ContainerRemoved)}
	}
	return nil
}

// kubeletEvents returns the events the kubelet's PLEG produced for the
// pods uids, the first occurrence of each key, in log order. PodSync is
// left out (its timing is each PLEG's own business).
func kubeletEvents(lines []kubeletLine, uids map[string]bool) []kubeletEvent {
	idx := map[eventKey]int{}
	var out []kubeletEvent
	add := func(k eventKey, at time.Time, delivery bool) {
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, kubeletEvent{key: k, at: at, delivered: delivery})
			return
		}
		// A SyncLoop line follows the GenericPLEG line of its
		// transition: the first delivery's time is the kubelet's.
		if delivery && !out[i].delivered {
			out[i].at, out[i].delivered = at, true
		}
	}
	for _, l := range lines {
		if !uids[l.PodUID] {
			continue
		}
		switch l.Kind {
		case "event":
			if l.Type == string(pleg.PodSync) || l.ContainerID == "" {
				continue
			}
			add(eventKey{l.PodUID, l.ContainerID, l.Type}, l.At, true)
		case "generic":
			for _, typ := range transitionEvents(l.Old, l.New) {
				add(eventKey{l.PodUID, l.ContainerID, typ}, l.At, false)
			}
		}
	}
	return out
}

// sideBySide is pleg running beside a kubelet, on its containerd.
type sideBySide struct {
	k *kubelet
	d *daemonView
	// uids of every static pod of the scenarios, by full name.
	uids map[string]string
	// latencies: pleg's delivery minus the kubelet's, per event.
	latencies []time.Duration
}

// podUID returns the UID of the kubelet's pod name (it must be listed).
func (s *sideBySide) podUID(t testing.TB, name string) string {
	t.Helper()
	if uid, ok := s.uids[name]; ok {
		return uid
	}
	p := s.k.WaitPod(t, name, 30*time.Second, nil)
	s.uids[name] = p.Metadata.UID
	return p.Metadata.UID
}

// checkEvents waits until pleg delivered every event the kubelet's PLEG
// produced for the pods names (same pod, container, type), records
// pleg's latency relative to the kubelet for each, and returns how many
// it checked.
func (s *sideBySide) checkEvents(t testing.TB, names ...string) int {
	t.Helper()
	uids := map[string]bool{}
	for _, n := range names {
		uids[s.podUID(t, n)] = true
	}
	var want []kubeletEvent
	var missing []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		want = kubeletEvents(s.k.PLEGLines(), uids)
		missing = missing[:0]
		for _, w := range want {
			if _, ok := s.plegEvent(w.key); !ok {
				missing = append(missing, w.key.String())
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Fatalf("pleg did not deliver %d of the kubelet's %d events: %s\npleg delivered:\n%s", len(missing), len(want), strings.Join(missing, ", "), s.d.log.dump())
	}
	if len(want) == 0 {
		t.Fatalf("the kubelet's PLEG logged no event for %v", names)
	}
	for _, w := range want {
		p, _ := s.plegEvent(w.key)
		d := p.Time.Sub(w.at)
		s.latencies = append(s.latencies, d)
		if d > 0 {
			basis := "its GenericPLEG line"
			if w.delivered {
				basis = "its SyncLoop line"
			}
			t.Logf("pleg delivered %s %s after the kubelet (%s)", w.key, ms(d), basis)
		}
	}
	return len(want)
}

// plegEvent returns pleg's first event with key k.
func (s *sideBySide) plegEvent(k eventKey) (seenEvent, bool) {
	for _, e := range s.d.log.all() {
		if string(e.PodUID) == k.PodUID && e.ContainerID == k.ContainerID && string(e.Type) == k.Type {
			return e, true
		}
	}
	return seenEvent{}, false
}

// checkCache waits until pleg's cache agrees with the kubelet's /pods on
// every container the kubelet reports for pod name (its current and last
// container: ID, state, exit code), and returns the agreement.
func (s *sideBySide) checkCache(t testing.TB, name string) {
	t.Helper()
	uid := s.podUID(t, name)
	eventually(t, 15*time.Second, "pleg's cache agrees with the kubelet's /pods on "+name, func() error {
		kp, ok := s.k.Pod(t, name)
		if !ok {
			return errors.New("not in the kubelet's /pods")
		}
		pv, ok, err := s.d.cachedPod(uid)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("not in pleg's cache")
		}
		return agree(kp, pv, s.k.inRuntime)
	})
}

// inRuntime reports whether the kubelet's containerd still has container
// id.
func (k *kubelet) inRuntime(id string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := k.env.cri.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if status.Code(err) == codes.NotFound {
		return false, nil
	}
	return err == nil, err
}

// agree compares a pod of the kubelet's /pods with pleg's cached pod:
// every container ID the kubelet reports (current state and last
// termination) must be in pleg's cache with the same state and exit code.
// The kubelet's status can name a container it has already removed from
// the runtime (in a crash loop it removes the older dead containers while
// its status still shows one as the last termination); pleg, which reports
// the runtime, rightly no longer has it: such an ID, gone from the runtime
// (inRuntime), is not a difference.
func agree(kp kubePod, pv podView, inRuntime func(id string) (bool, error)) error {
	var diffs []string
	compared := 0
	check := func(cname string, id string, running bool, exit *int32) {
		compared++
		g, ok := pv.Containers[id]
		want := "exited"
		if running {
			want = "running"
		}
		switch {
		case !ok:
			if there, err := inRuntime(id); err == nil && !there && !running {
				compared--
				return
			}
			diffs = append(diffs, fmt.Sprintf("%s %.12s: not in pleg's cache", cname, id))
		case g.State != want:
			diffs = append(diffs, fmt.Sprintf("%s %.12s: pleg %s, kubelet %s", cname, id, g, want))
		case exit != nil && (g.ExitCode == nil || *g.ExitCode != *exit):
			diffs = append(diffs, fmt.Sprintf("%s %.12s: pleg %s, kubelet exit code %d", cname, id, g, *exit))
		case g.Name != cname:
			diffs = append(diffs, fmt.Sprintf("%s %.12s: pleg names it %q", cname, id, g.Name))
		}
	}
	if len(kp.Status.ContainerStatuses) == 0 {
		return errors.New("the kubelet reports no container status yet")
	}
	for _, c := range kp.Status.ContainerStatuses {
		switch {
		case c.State.Running != nil:
			check(c.Name, runtimeID(c.ContainerID), true, nil)
		case c.State.Terminated != nil:
			code := c.State.Terminated.ExitCode
			check(c.Name, runtimeID(c.ContainerID), false, &code)
		}
		if lt := c.LastState.Terminated; lt != nil && lt.ContainerID != "" {
			code := lt.ExitCode
			check(c.Name, runtimeID(lt.ContainerID), false, &code)
		}
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "; "))
	}
	if compared == 0 {
		return errors.New("none of the containers the kubelet reports is in the runtime any more")
	}
	return nil
}

// checkHealth checks that the kubelet and pleg both report a healthy
// PLEG: the kubelet's /healthz is ok and its kubelet_pleg_last_seen_seconds
// is within the 3 m threshold; pleg's /healthz is ok and its
// kubelet_pleg_last_seen_seconds is too.
func (s *sideBySide) checkHealth(t testing.TB) {
	t.Helper()
	eventually(t, 15*time.Second, "the kubelet and pleg both healthy", func() error {
		if code, body, err := s.k.healthz(); err != nil || code != http.StatusOK {
			return fmt.Errorf("kubelet /healthz: %d %q %v", code, body, err)
		}
		if code, b, err := s.d.get("/healthz"); err != nil || code != http.StatusOK {
			return fmt.Errorf("pleg /healthz: %d %q %v", code, b, err)
		}
		for _, src := range []struct {
			who string
			get func() (map[string]*dto.MetricFamily, error)
		}{{"kubelet", s.k.Metrics}, {"pleg", s.plegMetrics}} {
			mfs, err := src.get()
			if err != nil {
				return err
			}
			seen, ok := lastSeen(mfs)
			if !ok {
				return fmt.Errorf("%s: no kubelet_pleg_last_seen_seconds", src.who)
			}
			if age := time.Since(seen); age > 3*time.Minute || age < -time.Second {
				return fmt.Errorf("%s: PLEG last seen %v ago", src.who, age.Round(time.Second))
			}
		}
		return nil
	})
}

// plegMetrics returns pleg's /metrics, parsed.
func (s *sideBySide) plegMetrics() (map[string]*dto.MetricFamily, error) {
	code, b, err := s.d.get("/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("pleg /metrics: HTTP %d", code)
	}
	if err != nil {
		return nil, err
	}
	return parseMetrics(b)
}

// lastSeen returns kubelet_pleg_last_seen_seconds (the start of the last
// successful relist, to the second).
func lastSeen(mfs map[string]*dto.MetricFamily) (time.Time, bool) {
	mf := mfs["kubelet_pleg_last_seen_seconds"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		return time.Time{}, false
	}
	return time.Unix(int64(mf.GetMetric()[0].GetGauge().GetValue()), 0), true
}

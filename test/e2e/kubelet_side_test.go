package e2e

// pleg beside the real kubelet, on the kubelet's own containerd: the
// kubelet's PLEG (its log) and its view of the pods (/pods) are the
// reference pleg is compared with.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/stats"
)

// relistWindow is the kubelet's own relist duration histogram over a
// window, and the static pod start times measured in it.
type relistWindow struct {
	count  uint64
	sum    float64
	starts []time.Duration
}

func (w relistWindow) mean() time.Duration {
	if w.count == 0 {
		return 0
	}
	return time.Duration(w.sum / float64(w.count) * float64(time.Second))
}

// harmWindow starts n static pods one after another (manifest written to
// /pods showing it Running), removes them, and returns the kubelet's
// relist duration histogram's count and sum over a window that lasts
// until the kubelet has relisted at least relists times, with the start
// times.
func harmWindow(t testing.TB, k *kubelet, label string, n int, relists uint64) relistWindow {
	t.Helper()
	before, err := k.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var w relistWindow
	var names []string
	for i := range n {
		manifest := fmt.Sprintf("start-%s-%d", label, i)
		t0 := time.Now()
		name := k.AddPod(t, StaticPod{Name: manifest, Containers: []StaticContainer{{Name: "app", Args: []string{"run"}}}})
		k.WaitPod(t, name, 60*time.Second, podRunning)
		w.starts = append(w.starts, time.Since(t0))
		names = append(names, manifest)
	}
	for _, m := range names {
		k.RemoveManifest(t, m)
		k.WaitPodGone(t, m+"-"+kubeletNode, 60*time.Second)
	}
	c0, s0 := histogramTotals(before, "kubelet_pleg_relist_duration_seconds")
	var after map[string]*dto.MetricFamily
	eventually(t, time.Minute, fmt.Sprintf("%d relists of the kubelet in the window", relists), func() error {
		var err error
		if after, err = k.Metrics(); err != nil {
			return err
		}
		if c, _ := histogramTotals(after, "kubelet_pleg_relist_duration_seconds"); c < c0+relists {
			return fmt.Errorf("%d so far", c-c0)
		}
		return nil
	})
	c1, s1 := histogramTotals(after, "kubelet_pleg_relist_duration_seconds")
	w.count, w.sum = c1-c0, s1-s0
	return w
}

// TestKubeletSideBySide runs pleg (`pleg run`, default settings: relist
// every second and the runtime's event stream) beside the real kubelet on
// the kubelet's containerd 2.2.9, and checks pleg against the kubelet's
// own PLEG and pod view in five scenarios on the same kubelet: a batch
// pod completing, a static pod removed, a container killed from outside
// the kubelet, a crash loop (a container exiting 3; its pod is started
// first, so that the kubelet's 10 s back-off passes during the others),
// and containerd restarted (down until both PLEGs failed a relist) under
// both. In each: every event the kubelet's PLEG produced
// for the scenario's pods (its "SyncLoop (PLEG)" lines, and its
// "GenericPLEG" transitions for ContainerRemoved and pods it no longer
// knows), pleg delivered with the same pod, container and type; pleg's
// cache agrees with /pods on each container's ID, state and exit code; both
// report a healthy PLEG. pleg's delivery time minus the kubelet's (its log
// timestamps; same clock) is reported as a MEASURE line.
//
// Before the scenarios, it measures whether pleg harms the kubelet: the
// kubelet's own kubelet_pleg_relist_duration_seconds over a window of at
// least 6 of its relists and the start times of three static pods in it,
// without pleg and then with it, in the same run. The bounds asserted are
// generous (they catch real harm, not noise; the other suites running
// meanwhile move the relist mean by tens of ms): relist mean with pleg <
// 2x without + 100 ms, pod start max with pleg < 2x without + 2 s.
func TestKubeletSideBySide(t *testing.T) {
	testKubeletSideBySide(t, kubeletRuntime)
}

// TestKubeletSideBySideCRIO is TestKubeletSideBySide with the kubelet on a
// CRI-O 1.36.3 of its own (enable_pod_events = true): the same scenarios
// and assertions, CRI-O restarted (SIGKILL) in the last one.
func TestKubeletSideBySideCRIO(t *testing.T) {
	testKubeletSideBySide(t, crioKubeletRuntime)
}

func testKubeletSideBySide(t *testing.T, runtimeItem string) {
	PlegBinary(t) // into the suite's dir, which outlives this test's env
	k := startKubeletOn(t, runtimeItem)
	useEnv(t, k.Env())

	const window = 6 // relists
	without := harmWindow(t, k, "without", 3, window)
	d := startDaemon(t, "pleg run")
	d.waitStderr(t, "listening on", 10*time.Second)
	with := harmWindow(t, k, "with", 3, window)
	harm(t, without, with)

	s := &sideBySide{k: k, d: d, uids: map[string]string{}}

	// The crash loop's pod first: the kubelet's back-off between its
	// restarts (10 s) passes while the other scenarios run. Its container
	// runs 300 ms before it exits 3: one that exited at once could be
	// caught running by one PLEG's relist and never by the other's, a
	// difference of luck, not of behaviour.
	crash := k.AddPod(t, StaticPod{Name: "crash", Containers: []StaticContainer{{Name: "crasher", Args: []string{"exit", "3", "300ms"}}}})

	t.Run("batch completion", func(t *testing.T) {
		name := k.AddPod(t, StaticPod{Name: "batch", RestartPolicy: "Never", Containers: []StaticContainer{{Name: "job", Args: []string{"sleep", "1s"}}}})
		k.WaitPod(t, name, 60*time.Second, func(p kubePod) error {
			c, ok := p.container("job")
			if p.Status.Phase != "Succeeded" || !ok || c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 {
				return fmt.Errorf("phase %s, job %+v", p.Status.Phase, c)
			}
			return nil
		})
		n := s.checkEvents(t, name)
		s.checkCache(t, name)
		s.checkHealth(t)
		diedWithCode(t, s, name, "job", 0)
		t.Logf("%d kubelet events delivered by pleg", n)
	})

	t.Run("static pod removed", func(t *testing.T) {
		name := k.AddPod(t, StaticPod{Name: "two", Containers: []StaticContainer{{Name: "a", Args: []string{"run"}}, {Name: "b", Args: []string{"run"}}}})
		k.WaitPod(t, name, 60*time.Second, podRunning)
		s.checkCache(t, name)
		uid := s.podUID(t, name)
		k.RemoveManifest(t, "two")
		k.WaitPodGone(t, name, 60*time.Second)
		// The kubelet stops the sandbox after its containers: wait for its
		// PLEG to see the sandbox exit too.
		eventually(t, 30*time.Second, "the kubelet's PLEG sees every container of "+name+" exit", func() error {
			exited := map[string]bool{}
			for _, l := range k.PLEGLines() {
				if l.PodUID == uid && l.Kind == "generic" && l.New == "exited" {
					exited[l.ContainerID] = true
				}
			}
			if len(exited) < 3 {
				return fmt.Errorf("%d of 3 (2 containers, the sandbox)", len(exited))
			}
			return nil
		})
		n := s.checkEvents(t, name)
		// The kubelet no longer lists the pod; what is left of it in the
		// runtime (the kubelet removes its containers, later its sandbox)
		// is all stopped, and pleg's cache shows exactly that.
		eventually(t, 15*time.Second, "pleg's cache shows what is left of "+name+" in the runtime, stopped", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			truth, err := runtimePodView(ctx, k.env.cri.rt, uid)
			if err != nil {
				return err
			}
			pv, ok, err := s.d.cachedPod(uid)
			if err != nil {
				return err
			}
			if len(truth.Sandboxes) == 0 && len(truth.Containers) == 0 {
				if ok {
					return errors.New("pleg still caches a pod the runtime no longer has")
				}
				return nil
			}
			if !ok {
				return errors.New("not in pleg's cache")
			}
			if d := diffPods(truth, pv); d != "" {
				return errors.New(d)
			}
			for id, st := range truth.Sandboxes {
				if st != "exited" {
					return fmt.Errorf("sandbox %.12s %s in the runtime", id, st)
				}
			}
			for id, c := range truth.Containers {
				if c.State != "exited" {
					return fmt.Errorf("container %.12s %s in the runtime", id, c)
				}
			}
			return nil
		})
		s.checkHealth(t)
		t.Logf("%d kubelet events delivered by pleg", n)
	})

	victim := ""
	t.Run("container killed from outside", func(t *testing.T) {
		victim = k.AddPod(t, StaticPod{Name: "victim", Containers: []StaticContainer{{Name: "app", Args: []string{"run"}}}})
		p := k.WaitPod(t, victim, 60*time.Second, podRunning)
		c, _ := p.container("app")
		first := runtimeID(c.ContainerID)
		pid := containerPID(t, first)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", pid, err)
		}
		k.WaitPod(t, victim, 60*time.Second, func(p kubePod) error {
			c, _ := p.container("app")
			if c.State.Running == nil || c.RestartCount < 1 || c.LastState.Terminated == nil || runtimeID(c.LastState.Terminated.ContainerID) != first {
				return fmt.Errorf("app not restarted after the kill: %+v", c)
			}
			if c.LastState.Terminated.ExitCode != 137 {
				return fmt.Errorf("the kubelet reports exit code %d for the killed container, want 137", c.LastState.Terminated.ExitCode)
			}
			return nil
		})
		n := s.checkEvents(t, victim)
		s.checkCache(t, victim)
		s.checkHealth(t)
		diedWithCode(t, s, victim, "app", 137)
		t.Logf("%d kubelet events delivered by pleg", n)
	})

	t.Run("crash loop", func(t *testing.T) {
		name := crash
		k.WaitPod(t, name, 60*time.Second, func(p kubePod) error {
			c, ok := p.container("crasher")
			if !ok || c.RestartCount < 1 || c.State.Waiting == nil || c.State.Waiting.Reason != "CrashLoopBackOff" ||
				c.LastState.Terminated == nil || c.LastState.Terminated.ExitCode != 3 {
				return fmt.Errorf("crasher not in CrashLoopBackOff after a restart with exit code 3: %+v", c)
			}
			return nil
		})
		n := s.checkEvents(t, name)
		s.checkCache(t, name)
		s.checkHealth(t)
		diedWithCode(t, s, name, "crasher", 3)
		t.Logf("%d kubelet events delivered by pleg", n)
	})

	t.Run("containerd restarted", func(t *testing.T) {
		if victim == "" {
			t.Skip("needs the victim pod of the previous scenario")
		}
		restarts := map[string]int32{}
		p, _ := k.Pod(t, victim)
		for _, c := range p.Status.ContainerStatuses {
			restarts[c.Name] = c.RestartCount
		}
		before := len(s.d.log.all())
		// Down long enough for both PLEGs to fail a relist (each counts
		// the failed list call in kubelet_runtime_operations_errors_total,
		// which the metric identity check compares), then up again.
		KillContainerd(t)
		eventually(t, 15*time.Second, "both PLEGs count a failed runtime call", func() error {
			km, err := k.Metrics()
			if err != nil {
				return err
			}
			pm, err := s.plegMetrics()
			if err != nil {
				return err
			}
			for who, mfs := range map[string]map[string]*dto.MetricFamily{"kubelet": km, "pleg": pm} {
				if mfs["kubelet_runtime_operations_errors_total"] == nil {
					return fmt.Errorf("%s: no kubelet_runtime_operations_errors_total yet", who)
				}
			}
			return nil
		})
		StartContainerd(t)
		up := time.Now()
		// Both PLEGs relist successfully again: their last-seen gauges
		// (the start of the last successful relist) move past the restart.
		eventually(t, 30*time.Second, "both PLEGs relist successfully after the restart", func() error {
			for _, src := range []struct {
				who string
				get func() (map[string]*dto.MetricFamily, error)
			}{{"kubelet", k.Metrics}, {"pleg", s.plegMetrics}} {
				mfs, err := src.get()
				if err != nil {
					return err
				}
				if seen, ok := lastSeen(mfs); !ok || seen.Unix() < up.Unix() {
					return fmt.Errorf("%s: PLEG last seen %v, containerd up again at %v", src.who, seen, up)
				}
			}
			return nil
		})
		s.checkHealth(t)
		s.checkCache(t, victim)
		s.checkEvents(t, victim)
		// Nothing happened to the pod: the kubelet restarted nothing and
		// pleg reported nothing new for it.
		p, _ = k.Pod(t, victim)
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != restarts[c.Name] || c.State.Running == nil {
				t.Errorf("container %s after the restart: %+v (restarts before %d)", c.Name, c, restarts[c.Name])
			}
		}
		uid := s.podUID(t, victim)
		for _, e := range s.d.log.all()[before:] {
			if string(e.PodUID) == uid {
				t.Errorf("pleg reported %s for %s across the containerd restart", e, victim)
			}
		}
	})

	t.Run("metric identity", func(t *testing.T) {
		km, err := k.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		pm, err := s.plegMetrics()
		if err != nil {
			t.Fatal(err)
		}
		names := compareMetricFamilies(t, km, pm, "kubelet_pleg_", "kubelet_runtime_operations_",
			"kubelet_evented_pleg_", "kubelet_running_pods", "kubelet_running_containers", "kubelet_node_name")
		t.Logf("%d families compared: %s", len(names), strings.Join(names, ", "))
	})

	t.Run("every kubelet event of the run", func(t *testing.T) {
		var names []string
		for n := range s.uids {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, m := range []string{"crash", "batch", "victim"} {
			if _, err := removeIfPresent(k, m); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range names {
			k.WaitPodGone(t, n, 60*time.Second)
		}
		// Once nothing runs any more, two relists of the kubelet have
		// seen every pod stop.
		if err := k.waitPodsStopped(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		k.WaitRelists(t, 2, 30*time.Second)
		s.latencies = s.latencies[:0]
		n := s.checkEvents(t, names...)
		p50, pmax, pmin := stats.Percentile(s.latencies, 0.50), slices.Max(s.latencies), slices.Min(s.latencies)
		measure(t, "kubelet-side-by-side: pleg delivery minus the kubelet's PLEG (its log) over %d events of %d pods: p50=%s min=%s max=%s (negative: pleg first)",
			n, len(names), ms(p50), ms(pmin), ms(pmax))
	})
}

// removeIfPresent removes manifest name if it is still there.
func removeIfPresent(k *kubelet, name string) (bool, error) {
	err := os.Remove(filepath.Join(k.manifests, name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// diedWithCode checks that pleg's ContainerDied events for pod name's
// container cname carry the exit code the kubelet reports. (The event
// stream does not say which IDs are sandboxes: the container's name
// tells.)
func diedWithCode(t testing.TB, s *sideBySide, name, cname string, code int32) {
	t.Helper()
	uid := s.podUID(t, name)
	n := 0
	for _, e := range s.d.log.all() {
		if string(e.PodUID) != uid || e.Type != pleg.ContainerDied || e.ContainerName != cname {
			continue
		}
		if e.ExitCode == nil || *e.ExitCode != code {
			t.Errorf("pleg: %s, want exit code %d", e, code)
		}
		n++
	}
	if n == 0 {
		t.Errorf("pleg delivered no ContainerDied for %s's containers", name)
	}
}

// harm reports the kubelet's relist durations and pod start times
// without and with pleg, and fails on real harm.
func harm(t testing.TB, without, with relistWindow) {
	t.Helper()
	maxStart := func(w relistWindow) time.Duration { return slices.Max(w.starts) }
	measure(t, "kubelet-harm: kubelet relist mean without pleg %s (%d relists), with pleg %s (%d relists); static pod start p50/max without %s/%s, with %s/%s",
		ms(without.mean()), without.count, ms(with.mean()), with.count,
		ms(stats.Percentile(without.starts, 0.50)), ms(maxStart(without)), ms(stats.Percentile(with.starts, 0.50)), ms(maxStart(with)))
	if without.count == 0 || with.count == 0 {
		t.Fatalf("the kubelet relisted %d and %d times in the windows", without.count, with.count)
	}
	if bound := 2*without.mean() + 100*time.Millisecond; with.mean() > bound {
		t.Errorf("the kubelet's relist mean with pleg %s > %s (2x without + 100ms)", ms(with.mean()), ms(bound))
	}
	if bound := 2*maxStart(without) + 2*time.Second; maxStart(with) > bound {
		t.Errorf("static pod start max with pleg %s > %s (2x without + 2s)", ms(maxStart(with)), ms(bound))
	}
}

// stabilityRE matches the stability level the kubelet's metrics framework
// (k8s.io/component-base/metrics) puts before the help of every metric
// that is not stable: "[ALPHA] ", "[BETA] " (stable ones have
// "[STABLE] " in some versions).
var stabilityRE = regexp.MustCompile(`^\[(ALPHA|BETA|STABLE|INTERNAL)\] `)

// compareMetricFamilies checks that every family whose name starts with
// one of prefixes, in the kubelet's /metrics (kube) or pleg's (mine), is
// in both with the same type, help, label names and histogram buckets.
//
// Help: the kubelet's help carries its stability level first ("[ALPHA]
// Duration in seconds for relisting pods in PLEG."); pleg's has no such
// level (it is the kubelet's framework's annotation, not part of the
// metric's description), so the kubelet's help is compared with the
// level removed, and the rest must be identical. Label values are not
// compared (the kubelet makes runtime calls pleg never makes, and which
// calls failed while containerd was down depends on timing), except that
// every operation_type pleg reports must be one the kubelet counted in
// kubelet_runtime_operations_total (same call, same name), apart from
// get_container_events (the kubelet calls it only with the Evented PLEG,
// off by default). It returns the names of the families
// compared.
func compareMetricFamilies(t testing.TB, kube, mine map[string]*dto.MetricFamily, prefixes ...string) []string {
	t.Helper()
	wanted := func(name string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	names := map[string]bool{}
	for n := range kube {
		if wanted(n) {
			names[n] = true
		}
	}
	for n := range mine {
		if wanted(n) {
			names[n] = true
		}
	}
	// Every runtime call the kubelet made, by its name.
	kubeOps := map[string]bool{}
	if mf := kube["kubelet_runtime_operations_total"]; mf != nil {
		kubeOps = labelValues(mf, "operation_type")
	}
	var compared []string
	for _, n := range slices.Sorted(maps.Keys(names)) {
		k, m := kube[n], mine[n]
		switch {
		case k == nil:
			t.Errorf("%s: in pleg's /metrics, not in the kubelet's", n)
			continue
		case m == nil:
			t.Errorf("%s: in the kubelet's /metrics, not in pleg's", n)
			continue
		}
		compared = append(compared, n)
		if k.GetType() != m.GetType() {
			t.Errorf("%s: type %s, the kubelet's %s", n, m.GetType(), k.GetType())
		}
		if kh := stabilityRE.ReplaceAllString(k.GetHelp(), ""); kh != m.GetHelp() {
			t.Errorf("%s: help %q, the kubelet's %q (level removed: %q)", n, m.GetHelp(), k.GetHelp(), kh)
		}
		if kl, ml := labelNames(k), labelNames(m); !slices.Equal(kl, ml) {
			t.Errorf("%s: labels %v, the kubelet's %v", n, ml, kl)
		}
		if k.GetType() == dto.MetricType_HISTOGRAM {
			if kb, mb := bucketBounds(k), bucketBounds(m); !slices.Equal(kb, mb) {
				t.Errorf("%s: buckets %v, the kubelet's %v", n, mb, kb)
			}
		}
		for v := range labelValues(m, "operation_type") {
			if !kubeOps[v] && v != "get_container_events" {
				t.Errorf("%s: pleg reports operation_type=%q, which the kubelet (calling %v) does not", n, v, slices.Sorted(maps.Keys(kubeOps)))
			}
		}
	}
	if len(compared) == 0 {
		t.Errorf("no family with prefixes %v in either /metrics", prefixes)
	}
	return compared
}

// labelNames returns the sorted label names of a family's series.
func labelNames(mf *dto.MetricFamily) []string {
	set := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			set[l.GetName()] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// labelValues returns the values label takes in a family.
func labelValues(mf *dto.MetricFamily, label string) map[string]bool {
	set := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				set[l.GetValue()] = true
			}
		}
	}
	return set
}

// bucketBounds returns the upper bounds of a histogram family's buckets
// (of its first series; every series of a family has the same).
func bucketBounds(mf *dto.MetricFamily) []float64 {
	if len(mf.GetMetric()) == 0 {
		return nil
	}
	var out []float64
	for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

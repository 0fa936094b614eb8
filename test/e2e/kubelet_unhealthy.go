package e2e

// The real kubelet v1.37.2 made to report "PLEG is not healthy", with
// `pleg run` beside it forecasting it (docs/forecast.md): the scenarios of
// test/kubeletfail, which runs them in a package of its own (Main) so that
// their minutes of waiting overlap with this package's suite.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

const (
	// kubeletPLEGThreshold is the kubelet's PLEG health threshold (fixed
	// at 3m in v1.37.2).
	kubeletPLEGThreshold = 3 * time.Minute
	// kubeletRequestTimeout is the kubelet's --runtime-request-timeout:
	// its default, as the harness sets none (kubeletConfig).
	kubeletRequestTimeout = 2 * time.Minute
	// minForecastLead is how long before the kubelet's first "PLEG is not
	// healthy" pleg's forecast must have said so.
	minForecastLead = 2 * time.Minute
	// forecastClearBound bounds how long after the hang's end the
	// forecast may stay at risk (it clears within a relist or so).
	forecastClearBound = 30 * time.Second
	// plegNotHealthy is what the kubelet's "Skipping pod synchronization"
	// error says once its PLEG's last good relist started more than 3m
	// ago: "PLEG is not healthy: pleg was last seen active 3m0.2s ago;
	// threshold is 3m0s". Its sync loop checks at the top of each
	// iteration only: when an iteration itself waits on the runtime
	// (housekeeping's ListContainers, 2m), its first line can say 4m2s.
	plegNotHealthy = "PLEG is not healthy: pleg was last seen active "
)

// lastSeenRE reads how long ago the kubelet's PLEG was last seen active.
var lastSeenRE = regexp.MustCompile(`pleg was last seen active (\S+) ago`)

// UnhealthyRuntimes are the runtimes KubeletPLEGUnhealthy runs on.
var UnhealthyRuntimes = []string{kubeletRuntime, "2.4.2", crioKubeletRuntime}

// Cases of KubeletPLEGUnhealthy.
const (
	// caseRuntimeStopped: the runtime process SIGSTOPped.
	caseRuntimeStopped = "runtime-stopped"
	// caseHungPods: some pods' status calls hang while the rest of the
	// runtime answers (CRI-O), or with them the node's ListContainers
	// (containerd).
	caseHungPods = "hung-pods"
	// caseOneHungPod: CRI-O's hung-pods with one pod: the kubelet stays
	// healthy.
	caseOneHungPod = "one-hung-pod"
)

// KubeletPLEGUnhealthy makes the real kubelet v1.37.2 report "PLEG is not
// healthy" for real (UnhealthyCases), all cases at once (parallel
// subtests, each on a kubelet and a runtime of its own; they mostly wait
// for the kubelet's fixed 3m threshold), with `pleg run` beside each
// kubelet (default settings; --kubelet-runtime-request-timeout 2m, the
// kubelet's: the harness leaves its --runtime-request-timeout at the
// default).
//
// What the kubelet v1.37.2 does (pkg/kubelet/pleg/generic.go): it is
// healthy while the last relist whose listing succeeded started less than
// 3m ago; a relist inspects, one after another, each pod whose listing
// changed or whose inspection failed in the relist before (once per
// relist), and GetPodStatus stops at its first failing call; each call
// that hangs costs the 2m request timeout.
//
//   - runtime-stopped (containerd 2.4.2, CRI-O): the runtime process
//     SIGSTOPped. The kubelet's relists fail at their listing, each after
//     2m, and it reports not healthy 3m after the start of its last relist
//     before the stop. pleg's forecast: the runtime does not answer its
//     listing (runtimeDown), from 10s after the stop.
//   - hung-pods on CRI-O: two pods (hung-a, hung-b) whose status calls
//     hang while the lists and every other pod answer. In each, web's
//     conmon is SIGSTOPped and web gets a CRI StopContainer (runc kills
//     it; CRI-O lists it exited but, with no exit file from conmon, runs
//     runc state again at each status call of it, and waits ~7.5s for the
//     file: slow, not hung); then every runc call naming web is held (the
//     harness's runtime wrapper, holdRuntimeCalls: a hung runc), so that
//     each ContainerStatus of web, and PodSandboxStatus of its pod (which
//     reports its containers' with enable_pod_events), waits under web's
//     lock for good; then side's process is SIGKILLed in both pods, a
//     change that makes the kubelet inspect both. ONE such pod makes the
//     kubelet's relists ~2m1s long and it stays healthy (one-hung-pod);
//     TWO make them ~4m, and it reports not healthy 3m after the start of
//     the first relist that pays both (2m later if its first relist met
//     only one). pleg (--full-inspection: it makes the kubelet's calls, see
//     kubeletUnhealthy) bounds its own inspections (--pod-inspection-timeout
//     10s), keeps relisting and stays healthy (/healthz 200 throughout); its
//     forecast names a hung pod and its call, and both pods as hung.
//   - one-hung-pod on CRI-O: hung-pods with hung-a alone. The kubelet's
//     relist fails to inspect it twice, ~2m apart, and it never reports not
//     healthy; the forecast names the pod, a relist of ~2m, not at risk.
//   - hung-pods on containerd 2.2.9: a stopped shim alone hangs none of the
//     calls a relist makes; a stopped shim plus an outstanding
//     UpdateContainerResources of pod slow's container web holds web's
//     status lock, so its ContainerStatus and the node-wide ListContainers
//     hang (TestDiagnoseHungShim): the kubelet's relists fail at their
//     listing, naming no pod, and the forecast says the listing does not
//     answer (runtimeDown). (2.4.2 gives the update up after ~2.5s.)
//
// Each case that turns the kubelet unhealthy asserts: the kubelet logs
// "Skipping pod synchronization" with "PLEG is not healthy: pleg was last
// seen active 3m..."; pleg's /readyz forecast was atRisk at least 2m
// before the kubelet's first such line, with the pod and call (CRI-O's
// hung-pods) or runtimeDown, and the kubelet's line came no earlier than
// the forecast's unhealthyAt (10s slack); `pleg check --forecast` exits 1
// printing it and pleg_kubelet_pleg_at_risk is 1. After the hang's end
// (SIGCONT, the hold released): the forecast clears within 30s; the
// kubelet relists (its kubelet_pleg_last_seen_seconds moves past the
// hang's end) and logs no "PLEG is not healthy" later; it restarts the
// bystander pod's container, SIGKILLed during the hang (on CRI-O's hung
// pods pleg delivered that death during the hang); pleg delivered every
// event the kubelet's PLEG produced for the scenario's pods (the
// bystander's death with the runtime's exit code), its cache agrees with
// the kubelet's /pods, and `pleg check --forecast` exits 0. MEASURE lines:
// the lead and the times to clear.
func KubeletPLEGUnhealthy(t *testing.T) {
	for _, c := range UnhealthyCases {
		t.Run(runtimeName(c.Runtime)+"/"+c.Case, func(t *testing.T) {
			t.Parallel()
			kubeletUnhealthy(t, c.Runtime, c.Case)
		})
	}
}

// UnhealthyCases are KubeletPLEGUnhealthy's scenarios: a case on a
// runtime (an allRuntimes item).
var UnhealthyCases = []struct{ Runtime, Case string }{
	{"2.4.2", caseRuntimeStopped},
	// containerd 2.4.2 bounds UpdateContainerResources' wait for the
	// shim (it fails after ~2.5s: "failed to get task: context deadline
	// exceeded") and the status lock with it, so ListContainers hangs for
	// seconds only; 2.2.9 holds it until the shim answers.
	{kubeletRuntime, caseHungPods},
	{crioKubeletRuntime, caseRuntimeStopped},
	{crioKubeletRuntime, caseHungPods},
	{crioKubeletRuntime, caseOneHungPod},
}

// unhealthyRun is one scenario's kubelet, pleg and what the test saw.
type unhealthyRun struct {
	k    *kubelet
	e    *env
	d    *daemonView
	s    *sideBySide
	fw   *forecastWatch
	kase string
	pods []string // full names of the scenario's pods
	hung []string // full names of the pods whose calls hang (CRI-O's hung-pods)
	crio bool
}

func kubeletUnhealthy(t *testing.T, item, kase string) {
	start := time.Now()
	plegBin := PlegBinary(t) // into the run's dir, which outlives this test's env
	k := startKubeletOn(t, item)
	r := &unhealthyRun{k: k, e: k.env, kase: kase, crio: k.env.kind == kindCRIO}
	args := []string{"--kubelet-runtime-request-timeout", kubeletRequestTimeout.String()}
	if kase != caseRuntimeStopped && r.crio {
		// The change that makes the kubelet inspect a hung pod is side's
		// death (see hang): pleg's delta inspection would fetch side's
		// status alone, which answers; the kubelet's GetPodStatus starts
		// with PodSandboxStatus, which hangs. --full-inspection makes the
		// kubelet's calls (docs/forecast.md, "What it cannot see").
		args = append(args, "--full-inspection")
	}
	r.d = startDaemonOn(t, "pleg run", k.CRIEndpoint(), args...)
	r.s = &sideBySide{k: k, d: r.d, uids: map[string]string{}}

	// The pods: a bystander whose container is SIGKILLed during the hang
	// (a transition pleg must deliver), and the pods whose calls hang.
	bystander := k.AddPod(t, StaticPod{Name: "bystander", Containers: []StaticContainer{{Name: "app", Args: []string{"run"}}}})
	r.pods = append(r.pods, bystander)
	if kase != caseRuntimeStopped {
		names := []string{"slow"}
		switch {
		case kase == caseOneHungPod:
			names = []string{"hung-a"}
		case r.crio:
			names = []string{"hung-a", "hung-b"}
		}
		for _, n := range names {
			cs := []StaticContainer{{Name: "web", Args: []string{"run"}}}
			if r.crio {
				cs = append(cs, StaticContainer{Name: "side", Args: []string{"run"}})
			}
			full := k.AddPod(t, StaticPod{Name: n, Containers: cs})
			r.pods = append(r.pods, full)
			if r.crio {
				r.hung = append(r.hung, full)
			}
		}
	}
	for _, p := range r.pods {
		k.WaitPod(t, p, 90*time.Second, podRunning)
		r.s.checkCache(t, p)
	}
	r.s.checkHealth(t)
	victim := r.containerOf(t, bystander, "app")
	victimPID := r.e.containerPID(t, victim)
	t.Logf("kubelet and pleg healthy with %d pods after %v", len(r.pods), time.Since(start).Round(time.Millisecond))
	if f := r.d.forecast(t); f.AtRisk {
		t.Fatalf("forecast at risk before any hang: %+v", f)
	}

	r.fw = watchForecast(t, r.d, 200*time.Millisecond)
	kubeLog := &logFollower{path: k.logPath}
	kubeLog.lines() // what was logged before the hang is not the hang's

	// The hang.
	hangStart := time.Now()
	release := r.hang(t)
	hangBegun := time.Now()
	t.Logf("hang begun (%s) in %v", kase, hangBegun.Sub(hangStart).Round(time.Millisecond))

	// The forecast speaks.
	var atRisk forecastSample
	if kase == caseOneHungPod {
		hung := r.fw.wait(t, hangStart, 90*time.Second, "forecast: the pod hangs, not at risk", func(f forecastJSON) bool {
			return len(f.HungPods) > 0
		})
		r.checkOneHungForecast(t, hung.f)
	} else {
		atRisk = r.fw.wait(t, hangStart, 90*time.Second, "forecast atRisk", func(f forecastJSON) bool { return f.AtRisk })
		t.Logf("forecast at risk %v after the hang began: %s", atRisk.at.Sub(hangStart).Round(time.Millisecond), atRisk.f.Message)
		r.checkForecast(t, atRisk.f)
		checkForecastCommand(t, plegBin, r.d, 1, "will report not healthy")
		if v := r.d.metricValue(t, "pleg_kubelet_pleg_at_risk"); v != 1 {
			t.Errorf("pleg_kubelet_pleg_at_risk %v while at risk, want 1", v)
		}
		// +Inf while the listing does not answer.
		if v := r.d.metricValue(t, "pleg_kubelet_relist_forecast_seconds"); v < kubeletPLEGThreshold.Seconds() || atRisk.f.RuntimeDown && !math.IsInf(v, 1) {
			t.Errorf("pleg_kubelet_relist_forecast_seconds %v while at risk (runtimeDown %v), want more than the threshold (+Inf when the listing does not answer)", v, atRisk.f.RuntimeDown)
		}
	}

	if kase == caseHungPods && !r.crio {
		// The listing hangs and names no pod; pleg run then diagnoses the
		// runtime once (the shim probe: a verbose PodSandboxStatus of
		// every sandbox) and names the pod whose shim does not answer.
		slow := kubeletNamespace + "/" + r.pods[1]
		named := r.fw.wait(t, atRisk.at, 60*time.Second, "forecast naming the stuck shim's pod", func(f forecastJSON) bool {
			return f.AtRisk && f.Pod == slow
		})
		if f := named.f; !f.RuntimeDown || !strings.Contains(f.Message, "the shim of pod "+slow+" does not answer") {
			t.Errorf("forecast %+v, want runtimeDown and the message to name the shim of pod %s", f, slow)
		}
		t.Logf("forecast named the stuck shim's pod %v after it went at risk: %s", named.at.Sub(atRisk.at).Round(time.Millisecond), named.f.Message)
	}

	// A transition during the hang: the bystander's container dies.
	if err := syscall.Kill(victimPID, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the bystander's container process %d: %v", victimPID, err)
	}
	killedAt := time.Now()
	if r.crio && kase != caseRuntimeStopped {
		// pleg keeps relisting the rest of the node: the death is
		// delivered during the hang.
		waitEvents(t, 30*time.Second, []*eventLog{r.d.log}, pleg.ContainerDied, victim)
		ev, _ := r.d.log.find(pleg.ContainerDied, victim)
		t.Logf("pleg delivered the bystander's death %v after the kill, during the hang", ev.At.Sub(killedAt).Round(time.Millisecond))
	}

	var unhealthy logLine
	var unhealthySince time.Time
	var lead, failGap time.Duration
	if kase == caseOneHungPod {
		failGap = r.staysHealthy(t, hangStart, kubeLog)
	} else {
		unhealthy, lead, unhealthySince = r.reportsUnhealthy(t, hangStart, atRisk, kubeLog)
	}
	if r.crio && kase != caseRuntimeStopped {
		// pleg's own health: its relists never stalled.
		if bad := r.fw.unhealthySince(hangStart); len(bad) > 0 {
			t.Errorf("pleg run /healthz not 200 while pods hang: %v", bad)
		}
	}

	// The end of the hang.
	contAt := time.Now()
	release()
	t.Logf("hang ended %v after it began", contAt.Sub(hangStart).Round(time.Millisecond))
	clear := r.fw.wait(t, contAt, forecastClearBound, "forecast clear after the hang", func(f forecastJSON) bool { return !f.AtRisk && len(f.HungPods) == 0 })
	clearAfter := clear.at.Sub(contAt)
	t.Logf("forecast clear %v after the hang's end: %s", clearAfter.Round(time.Millisecond), clear.f.Message)
	var kubeletBack time.Time
	eventually(t, 3*time.Minute, "the kubelet relisting again (kubelet_pleg_last_seen_seconds after the hang's end)", func() error {
		mfs, err := k.Metrics()
		if err != nil {
			return err
		}
		seen, ok := lastSeen(mfs)
		if !ok {
			return errors.New("no kubelet_pleg_last_seen_seconds")
		}
		if seen.Unix() <= contAt.Unix() {
			return fmt.Errorf("last seen %s", seen.Format(time.TimeOnly))
		}
		kubeletBack = time.Now()
		return nil
	})
	t.Logf("the kubelet relisted again %v after the hang's end", kubeletBack.Sub(contAt).Round(time.Millisecond))

	// Everything that happened is delivered.
	k.WaitPod(t, bystander, 2*time.Minute, func(p kubePod) error {
		c, _ := p.container("app")
		if c.State.Running == nil || c.LastState.Terminated == nil || runtimeID(c.LastState.Terminated.ContainerID) != victim {
			return fmt.Errorf("app not restarted after its kill: %+v", c)
		}
		return nil
	})
	want := r.e.exitCode(t, victim)
	ev := waitDied(t, r.d, victim)
	if ev.ExitCode == nil || *ev.ExitCode != want {
		t.Errorf("pleg: the bystander's death %v, want exit code %d as the runtime reports", ev, want)
	}
	for _, p := range r.hung {
		// Its exit code may be CRI-O's -1 of before the hang (see
		// above): checkCache compares it with the kubelet's.
		waitDied(t, r.d, r.webOf(t, p))
	}
	n := r.s.checkEvents(t, r.pods...)
	t.Logf("pleg delivered all %d events the kubelet's PLEG produced for %v", n, r.pods)
	for _, p := range r.pods {
		r.s.checkCache(t, p)
	}
	r.s.checkHealth(t)
	checkForecastCommand(t, plegBin, r.d, 0, "not at risk")
	if v := r.d.metricValue(t, "pleg_kubelet_pleg_at_risk"); v != 0 {
		t.Errorf("pleg_kubelet_pleg_at_risk %v after the hang, want 0", v)
	}
	// The kubelet stopped saying it: no line later than its first relist
	// after the hang plus its longest back-off between two (5s).
	for _, l := range kubeLog.lines() {
		if strings.Contains(l.text, plegNotHealthy) && l.at.After(kubeletBack.Add(6*time.Second)) {
			t.Errorf("the kubelet still reports not healthy %v after it relisted again: %s", l.at.Sub(kubeletBack).Round(time.Millisecond), l.text)
		}
	}
	if kase == caseOneHungPod {
		measureOn(t, r.e, "kubelet_pleg_one_hung_pod kubelet_failed_inspections_apart=%v (request timeout %v) kubelet_healthy=true forecast_at_risk=false forecast_clear_after_hang_end=%v",
			failGap.Round(time.Millisecond), kubeletRequestTimeout, clearAfter.Round(time.Millisecond))
	} else {
		measureOn(t, r.e, "kubelet_pleg_unhealthy case=%s forecast_at_risk_after_hang=%v kubelet_unhealthy_line_after_hang=%v (not_healthy_since=%v) lead=%v forecast_clear_after_hang_end=%v kubelet_relisting_after_hang_end=%v",
			kase, atRisk.at.Sub(hangStart).Round(time.Millisecond), unhealthy.at.Sub(hangStart).Round(time.Millisecond),
			unhealthySince.Sub(hangStart).Round(time.Millisecond), lead.Round(time.Millisecond),
			clearAfter.Round(time.Millisecond), kubeletBack.Sub(contAt).Round(time.Millisecond))
	}
	t.Logf("%s on %s took %v", kase, r.e.name(), time.Since(start).Round(time.Second))
}

// reportsUnhealthy waits for the kubelet's first "PLEG is not healthy"
// line and checks the forecast spoke at least minForecastLead before it,
// and not later than its unhealthyAt allows; it returns the line and the
// lead and since when the kubelet's PLEG was not healthy by the line's
// own account (its last good relist's start plus the threshold).
func (r *unhealthyRun) reportsUnhealthy(t *testing.T, hangStart time.Time, atRisk forecastSample, kubeLog *logFollower) (first logLine, lead time.Duration, since time.Time) {
	t.Helper()
	unhealthy := kubeLog.wait(t, hangStart.Add(8*time.Minute), "the kubelet's \"Skipping pod synchronization\" ... "+plegNotHealthy, func(l string) bool {
		return strings.Contains(l, `"Skipping pod synchronization"`) && strings.Contains(l, plegNotHealthy)
	})
	t.Logf("the kubelet reports it %v after the hang began: %s", unhealthy.at.Sub(hangStart).Round(time.Millisecond), unhealthy.text)
	// By its own account it has been unhealthy since its last good
	// relist's start plus the threshold.
	if m := lastSeenRE.FindStringSubmatch(unhealthy.text); m == nil {
		t.Errorf("no %q in the kubelet's line", lastSeenRE)
	} else if ago, err := time.ParseDuration(m[1]); err != nil {
		t.Errorf("the kubelet's line: %v", err)
	} else {
		since = unhealthy.at.Add(kubeletPLEGThreshold - ago)
		t.Logf("the kubelet's PLEG not healthy since %s, %v after the hang began (its last good relist started %v after it)",
			since.Format(time.StampMilli), since.Sub(hangStart).Round(time.Millisecond), unhealthy.at.Add(-ago).Sub(hangStart).Round(time.Millisecond))
	}
	lead = unhealthy.at.Sub(atRisk.at)
	if lead < minForecastLead {
		t.Errorf("the forecast went at risk at %s, %v before the kubelet's first %q at %s: want at least %v",
			atRisk.at.Format(time.StampMilli), lead.Round(time.Millisecond), plegNotHealthy, unhealthy.at.Format(time.StampMilli), minForecastLead)
	}
	if at, err := time.Parse(time.RFC3339Nano, atRisk.f.UnhealthyAt); err != nil {
		t.Errorf("forecast unhealthyAt %q: %v", atRisk.f.UnhealthyAt, err)
	} else if unhealthy.at.Before(at.Add(-10 * time.Second)) {
		t.Errorf("the kubelet reported not healthy at %s, before the forecast's earliest time %s (10s slack)",
			unhealthy.at.Format(time.StampMilli), at.Format(time.StampMilli))
	} else {
		t.Logf("forecast unhealthyAt %s; the kubelet's first line %v after it", at.Format(time.StampMilli), unhealthy.at.Sub(at).Round(time.Millisecond))
	}
	if f := r.fw.last(); !f.f.AtRisk {
		t.Errorf("forecast not at risk while the kubelet reports not healthy: %+v", f.f)
	}
	return unhealthy, lead, since
}

// staysHealthy waits until the kubelet failed to inspect the one hung pod
// in two relists (its "PLEG: Ignoring events for pod" lines, -v=4), which
// each cost its 2m request timeout, and checks it never reported "PLEG is
// not healthy" meanwhile, nor the forecast at risk; it returns the time
// between the two failures.
func (r *unhealthyRun) staysHealthy(t *testing.T, hangStart time.Time, kubeLog *logFollower) time.Duration {
	t.Helper()
	pod := kubeletNamespace + "/" + r.hung[0]
	var fails []logLine
	deadline := hangStart.Add(7 * time.Minute)
	for len(fails) < 2 {
		for _, l := range kubeLog.lines() {
			switch {
			case strings.Contains(l.text, `"PLEG: Ignoring events for pod" pod="`+pod+`"`):
				fails = append(fails, l)
				t.Logf("the kubelet's relist failed to inspect %s (%d) %v after the hang began", pod, len(fails), l.at.Sub(hangStart).Round(time.Millisecond))
			case strings.Contains(l.text, plegNotHealthy):
				t.Errorf("the kubelet reports not healthy with one hung pod: %s", l.text)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kubelet's relist failed to inspect %s %d times by %s, want 2", pod, len(fails), deadline.Format(time.StampMilli))
		}
		time.Sleep(200 * time.Millisecond)
	}
	gap := fails[1].at.Sub(fails[0].at)
	if gap < kubeletRequestTimeout-30*time.Second {
		t.Errorf("the kubelet's two failed inspections of %s %v apart, want about its request timeout (%v) each", pod, gap, kubeletRequestTimeout)
	}
	if code, body, err := r.k.healthz(); err != nil || code != http.StatusOK {
		t.Errorf("the kubelet's /healthz %d %q %v with one hung pod, want 200", code, body, err)
	}
	r.fw.mu.Lock()
	for _, s := range r.fw.samples {
		if !s.at.Before(hangStart) && s.f.AtRisk {
			t.Errorf("forecast at risk at %s with one hung pod: %s", s.at.Format(time.StampMilli), s.f.Message)
			break
		}
	}
	r.fw.mu.Unlock()
	return gap
}

// checkOneHungForecast checks the forecast with one hung pod: not at risk,
// a relist of about the request timeout, the pod named.
func (r *unhealthyRun) checkOneHungForecast(t *testing.T, f forecastJSON) {
	t.Helper()
	pod := kubeletNamespace + "/" + r.hung[0]
	t.Logf("forecast with one hung pod: %s", f.Message)
	if f.AtRisk || f.RuntimeDown || !slices.Equal(f.HungPods, []string{pod}) {
		t.Errorf("forecast %+v, want not at risk with hungPods [%s]", f, pod)
	}
	if f.RelistSeconds == nil || *f.RelistSeconds < kubeletRequestTimeout.Seconds() || *f.RelistSeconds >= kubeletPLEGThreshold.Seconds() {
		t.Errorf("forecast relistSeconds %v, want the request timeout (%v) or a little more, under the threshold", f.RelistSeconds, kubeletRequestTimeout)
	}
	if !strings.Contains(f.Message, "not at risk") || !strings.Contains(f.Message, "for pod "+pod+" hangs") {
		t.Errorf("forecast message %q, want it not at risk and naming %s", f.Message, pod)
	}
}

// hang starts the case's hang and checks it holds; the function it
// returns ends it.
func (r *unhealthyRun) hang(t *testing.T) (release func()) {
	t.Helper()
	rt := r.e.cri.rt
	switch {
	case r.kase == caseRuntimeStopped:
		pid := containerdPid(t, r.e)
		sigstop(t, pid)
		if d, err := timedCRI(time.Second, func(ctx context.Context) error {
			_, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return err
		}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("ListPodSandbox with %s stopped: %v after %v, want it to hang", r.e.name(), err, d)
		}
		return func() { sigcont(t, pid) }

	case r.crio:
		// In each hung pod: web's conmon stopped, then StopContainer of
		// web (runc kills it; CRI-O lists it exited but, with no exit
		// file from conmon, asks runc for its state again at each status
		// call of it, which then waits ~7.5s for the file); then every
		// runtime call naming web held, so that each status call of web,
		// and of its pod (PodSandboxStatus reports its containers' with
		// enable_pod_events), waits for runc under web's lock for good.
		// Then side's process is SIGKILLed in both pods at once: a change
		// of each pod's listing after the hang set in, so that the
		// kubelet's relist inspects both (likely in the same relist),
		// whatever it did in the seconds before the hold (StopContainer
		// lists web exited at once: the kubelet may see web's death then,
		// exit code -1, and restart it).
		var conmons, sides []int
		var webs []string
		for _, p := range r.hung {
			id := r.webOf(t, p)
			webs = append(webs, id)
			conmons = append(conmons, conmonOf(t, r.e, id))
			sides = append(sides, r.e.containerPID(t, r.containerOf(t, p, "side")))
		}
		for _, pid := range conmons {
			sigstop(t, pid)
		}
		errs := make([]error, len(webs))
		var wg sync.WaitGroup
		for i, id := range webs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, errs[i] = rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 1})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("StopContainer(%s web) with its conmon stopped: %v", r.hung[i], err)
			}
		}
		unhold := r.e.holdRuntimeCalls(t, webs...)
		for _, pid := range sides {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL side's process %d: %v", pid, err)
			}
		}
		// Longer than CRI-O's own wait for an exit file (~7.5s).
		for i, id := range webs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := timedCRI(12*time.Second, func(ctx context.Context) error {
					_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
					return err
				})
				errs[i] = err
				if status.Code(err) != codes.DeadlineExceeded {
					errs[i] = fmt.Errorf("ContainerStatus(%s web) with its runtime calls held: %v after %v, want it to hang", r.hung[i], err, d)
				} else {
					errs[i] = nil
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if d, err := timedCRI(2*time.Second, func(ctx context.Context) error {
			_, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}); err != nil {
			t.Fatalf("ListContainers with two pods hung: %v after %v, want an answer", err, d)
		}
		return func() {
			unhold()
			for _, pid := range conmons {
				sigcont(t, pid)
			}
		}

	default:
		// containerd: pod slow's shim stopped, and an update of its
		// container web outstanding.
		web := r.webOf(t, r.pods[1])
		sandbox := r.e.sandboxOf(t, web)
		shim := r.e.shimOf(t, sandbox)
		sigstop(t, shim)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}) // closed when the update returned, with updErr
		var updErr error
		go func() {
			defer close(done)
			_, updErr = rt.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: web,
				Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512}})
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("cleanup: UpdateContainerResources did not return 10s after its cancellation")
			}
		})
		eventually(t, 10*time.Second, "ListContainers blocked by the outstanding update", func() error {
			select {
			case <-done:
				t.Fatalf("UpdateContainerResources returned while the shim is stopped: %v", updErr)
			default:
			}
			_, err := timedCRI(300*time.Millisecond, func(ctx context.Context) error {
				_, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				return err
			})
			if status.Code(err) != codes.DeadlineExceeded {
				return fmt.Errorf("ListContainers: %v", err)
			}
			return nil
		})
		return func() {
			sigcont(t, shim)
			select {
			case <-done:
				if updErr != nil {
					t.Errorf("UpdateContainerResources after SIGCONT: %v", updErr)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("UpdateContainerResources still outstanding 30s after its shim continued")
			}
		}
	}
}

// checkForecast checks the forecast's fields once it is at risk.
func (r *unhealthyRun) checkForecast(t *testing.T, f forecastJSON) {
	t.Helper()
	if f.ThresholdSeconds != kubeletPLEGThreshold.Seconds() {
		t.Errorf("forecast thresholdSeconds %v, want %v", f.ThresholdSeconds, kubeletPLEGThreshold.Seconds())
	}
	if f.Since == "" || f.UnhealthyAt == "" {
		t.Errorf("forecast at risk without since (%q) or unhealthyAt (%q)", f.Since, f.UnhealthyAt)
	}
	if len(r.hung) == 0 {
		// The listing itself does not answer.
		if !f.RuntimeDown || f.RelistSeconds != nil || f.Pod != "" {
			t.Errorf("forecast %+v, want runtimeDown, no relistSeconds, no pod", f)
		}
		if !strings.Contains(f.Message, "does not answer its listing") {
			t.Errorf("forecast message %q, want it to say the runtime does not answer its listing", f.Message)
		}
		return
	}
	if f.RuntimeDown {
		t.Errorf("forecast runtimeDown while the listing answers: %+v", f)
	}
	pods := map[string]bool{}
	for _, p := range r.hung {
		pods[kubeletNamespace+"/"+p] = true
	}
	if !pods[f.Pod] {
		t.Errorf("forecast pod %q, want one of %v", f.Pod, r.hung)
	}
	if f.Call != "ContainerStatus" && f.Call != "PodSandboxStatus" {
		t.Errorf("forecast call %q, want ContainerStatus or PodSandboxStatus", f.Call)
	}
	if want := f.Call + " for pod " + f.Pod; !strings.Contains(f.Message, want) {
		t.Errorf("forecast message %q, want it to name %q", f.Message, want)
	}
	if uid := r.s.podUID(t, strings.TrimPrefix(f.Pod, kubeletNamespace+"/")); f.PodUID != uid {
		t.Errorf("forecast podUID %q, want %q (the kubelet's)", f.PodUID, uid)
	}
	if f.RelistSeconds == nil || *f.RelistSeconds < kubeletPLEGThreshold.Seconds() {
		t.Errorf("forecast relistSeconds %v, want more than the threshold", f.RelistSeconds)
	}
	for p := range pods {
		if !slices.Contains(f.HungPods, p) {
			t.Errorf("forecast hungPods %v, want %s in it", f.HungPods, p)
		}
	}
}

// containerOf returns the runtime ID of container cname of the kubelet's
// pod name.
func (r *unhealthyRun) containerOf(t testing.TB, name, cname string) string {
	t.Helper()
	p, ok := r.k.Pod(t, name)
	if !ok {
		t.Fatalf("pod %s not in the kubelet's /pods", name)
	}
	c, ok := p.container(cname)
	if !ok || c.ContainerID == "" {
		t.Fatalf("pod %s: no container %s in the kubelet's /pods", name, cname)
	}
	return runtimeID(c.ContainerID)
}

// webOf returns the ID of the first container web of pod name (the one
// the hang is about): the kubelet's current one before the hang, its last
// one after it restarted it.
func (r *unhealthyRun) webOf(t testing.TB, name string) string {
	t.Helper()
	p, ok := r.k.Pod(t, name)
	if !ok {
		t.Fatalf("pod %s not in the kubelet's /pods", name)
	}
	c, _ := p.container("web")
	if lt := c.LastState.Terminated; lt != nil && lt.ContainerID != "" {
		return runtimeID(lt.ContainerID)
	}
	if c.ContainerID == "" {
		t.Fatalf("pod %s: no container web in the kubelet's /pods", name)
	}
	return runtimeID(c.ContainerID)
}

// waitDied waits until pleg delivered ContainerDied for id and returns it.
func waitDied(t testing.TB, d *daemonView, id string) seenEvent {
	t.Helper()
	waitEvents(t, 30*time.Second, []*eventLog{d.log}, pleg.ContainerDied, id)
	ev, _ := d.log.find(pleg.ContainerDied, id)
	return ev
}

// ---------------------------------------------------------------------------
// The forecast, as /readyz serves it.

// forecastJSON is /readyz's "forecast" object (docs/forecast.md), decoded
// from its JSON names (the contract), not from pleg's Go type.
type forecastJSON struct {
	AtRisk           bool     `json:"atRisk"`
	Message          string   `json:"message"`
	RuntimeDown      bool     `json:"runtimeDown"`
	RelistSeconds    *float64 `json:"relistSeconds"`
	ThresholdSeconds float64  `json:"thresholdSeconds"`
	Since            string   `json:"since"`
	UnhealthyAt      string   `json:"unhealthyAt"`
	Pod              string   `json:"pod"`
	PodUID           string   `json:"podUID"`
	Call             string   `json:"call"`
	ID               string   `json:"id"`
	HungPods         []string `json:"hungPods"`
}

// forecast returns pleg's forecast now; /readyz without one fails t.
func (d *daemonView) forecast(t testing.TB) forecastJSON {
	t.Helper()
	f, err := d.readForecast()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (d *daemonView) readForecast() (forecastJSON, error) {
	var body struct {
		Forecast *forecastJSON `json:"forecast"`
	}
	if _, err := d.getJSON("/readyz", &body); err != nil {
		return forecastJSON{}, err
	}
	if body.Forecast == nil || body.Forecast.Message == "" {
		return forecastJSON{}, fmt.Errorf("%s: /readyz has no forecast", d.name)
	}
	return *body.Forecast, nil
}

// metricValue returns a gauge or counter of pleg's /metrics (summed over
// its series); a missing one fails t.
func (d *daemonView) metricValue(t testing.TB, name string) float64 {
	t.Helper()
	mf := d.metricFamilies(t)[name]
	if mf == nil {
		t.Fatalf("%s: no metric %s", d.name, name)
	}
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return v
}

// forecastSample is one poll of /readyz's forecast and /healthz.
type forecastSample struct {
	at         time.Time
	f          forecastJSON
	err        error
	healthz    int
	healthBody string
}

// forecastWatch polls a pleg run's forecast and /healthz until the test
// ends.
type forecastWatch struct {
	mu      sync.Mutex
	samples []forecastSample
}

// atRisk returns the samples that were at risk (or failed to be read).
func (w *forecastWatch) atRisk() []forecastSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []forecastSample
	for _, s := range w.samples {
		if s.err != nil || s.f.AtRisk {
			out = append(out, s)
		}
	}
	return out
}

// pollEvery calls sample at once and then every interval, on a goroutine
// the test's cleanup stops and waits for.
func pollEvery(t testing.TB, every time.Duration, sample func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			sample()
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

func watchForecast(t testing.TB, d *daemonView, every time.Duration) *forecastWatch {
	w := &forecastWatch{}
	pollEvery(t, every, func() {
		s := forecastSample{}
		s.f, s.err = d.readForecast()
		s.at = time.Now()
		code, b, err := d.get("/healthz")
		s.healthz, s.healthBody = code, string(b)
		if err != nil {
			s.healthBody = err.Error()
		}
		w.mu.Lock()
		w.samples = append(w.samples, s)
		w.mu.Unlock()
	})
	return w
}

// wait waits (up to timeout) for a sample taken after since whose
// forecast cond accepts, and returns the first; a failing poll fails t.
func (w *forecastWatch) wait(t testing.TB, since time.Time, timeout time.Duration, what string, cond func(forecastJSON) bool) forecastSample {
	t.Helper()
	var got forecastSample
	eventually(t, timeout, what, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		var last forecastSample
		for _, s := range w.samples {
			if s.at.Before(since) {
				continue
			}
			if s.err != nil {
				t.Fatalf("%s: polling the forecast: %v", what, s.err)
			}
			if cond(s.f) {
				got = s
				return nil
			}
			last = s
		}
		return fmt.Errorf("last: %+v", last.f)
	})
	return got
}

// last returns the latest sample.
func (w *forecastWatch) last() forecastSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return forecastSample{}
	}
	return w.samples[len(w.samples)-1]
}

// unhealthySince returns the samples after since whose /healthz was not
// 200 "ok" (at most 5).
func (w *forecastWatch) unhealthySince(since time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var bad []string
	for _, s := range w.samples {
		if !s.at.Before(since) && (s.healthz != http.StatusOK || strings.TrimSpace(s.healthBody) != "ok") && len(bad) < 5 {
			bad = append(bad, fmt.Sprintf("%s: %d %q", s.at.Format(time.StampMilli), s.healthz, s.healthBody))
		}
	}
	return bad
}

// checkForecastCommand runs `pleg check --forecast --url <d>/readyz` and
// checks its exit code and that its line contains want.
func checkForecastCommand(t testing.TB, bin string, d *daemonView, wantCode int, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "check", "--forecast", "--url", d.base+"/readyz")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("pleg check --forecast: %v", err)
	}
	line := strings.TrimSpace(out.String())
	if code != wantCode || !strings.Contains(line, want) {
		t.Errorf("pleg check --forecast: exit %d, %q (stderr %q); want exit %d and %q", code, line, errOut.String(), wantCode, want)
	} else {
		t.Logf("pleg check --forecast: exit %d: %s", code, line)
	}
}

// ---------------------------------------------------------------------------
// The kubelet's log, line by line with its klog time.

// logLine is one line of a klog log and its time.
type logLine struct {
	at   time.Time
	text string
}

// logFollower reads a klog log on from where it stopped.
type logFollower struct {
	path string
	mu   sync.Mutex
	off  int64
	part []byte
}

// lines returns the complete lines logged since the last call.
func (f *logFollower) lines() []logLine {
	f.mu.Lock()
	defer f.mu.Unlock()
	fh, err := os.Open(f.path)
	if err != nil {
		return nil
	}
	defer fh.Close()
	if _, err := fh.Seek(f.off, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(fh)
	f.off += int64(len(b))
	buf := append(f.part, b...)
	var out []logLine
	year := time.Now().Year()
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		line := string(buf[:i])
		buf = buf[i+1:]
		m := klogHeaderRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
		if err != nil {
			continue
		}
		out = append(out, logLine{at: at.AddDate(year, 0, 0), text: line})
	}
	f.part = append([]byte(nil), buf...)
	return out
}

// wait reads on until a line match accepts, and returns it; it fails t at
// deadline.
func (f *logFollower) wait(t testing.TB, deadline time.Time, what string, match func(string) bool) logLine {
	t.Helper()
	for {
		for _, l := range f.lines() {
			if match(l.text) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not logged by %s", what, deadline.Format(time.StampMilli))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Hangs: processes stopped and continued, and whose they are.

func procStat(pid int) (state byte, ppid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid
}

// sigstop stops pid and waits until it is stopped; a cleanup continues it
// (so that the teardown's CRI calls find the shim answering).
func sigstop(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	eventually(t, 5*time.Second, fmt.Sprintf("process %d stopped", pid), func() error {
		if st, _ := procStat(pid); st != 'T' {
			return fmt.Errorf("state %q", st)
		}
		return nil
	})
}

func sigcont(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %d: %v", pid, err)
	}
	// Running again, or gone: a conmon whose container exited while it
	// was stopped finishes its work and exits once continued (seen on
	// CRI-O under the load harness).
	eventually(t, 5*time.Second, fmt.Sprintf("process %d continued", pid), func() error {
		if st, _ := procStat(pid); st == 'T' {
			return fmt.Errorf("state %q", st)
		}
		return nil
	})
}

// conmonOf returns the pid of the conmon that monitors container id on
// e's CRI-O (its command line carries -c <id> and paths in e's dir).
func conmonOf(t testing.TB, e *env, id string) int {
	t.Helper()
	for _, p := range ourProcesses(e.dir, e.cgroupParent, -1) {
		if len(p.argv) == 0 || !strings.HasSuffix(p.argv[0], "/conmon") || p.state == 'Z' {
			continue
		}
		if i := slices.Index(p.argv, "-c"); i > 0 && i+1 < len(p.argv) && p.argv[i+1] == id {
			return p.pid
		}
	}
	t.Fatalf("no conmon of ours with -c %s", id)
	return 0
}

// shimOf returns the pid of the containerd-shim-runc-v2 serving sandbox
// sandboxID of e's containerd.
func (e *env) shimOf(t testing.TB, sandboxID string) int {
	t.Helper()
	return shimPID(t, sandboxID, e.sock)
}

// shimPID returns the pid of the containerd-shim-runc-v2 serving sandbox
// sandboxID of the containerd at socket sock (its command line carries -id
// <sandboxID> and -address <sock>).
func shimPID(t testing.TB, sandboxID, sock string) int {
	t.Helper()
	for _, p := range listProcs() {
		if len(p.argv) == 0 || filepath.Base(p.argv[0]) != "containerd-shim-runc-v2" || p.state == 'Z' {
			continue
		}
		var id, addr string
		for i := 1; i+1 < len(p.argv); i++ {
			switch p.argv[i] {
			case "-id":
				id = p.argv[i+1]
			case "-address":
				addr = p.argv[i+1]
			}
		}
		if id == sandboxID && addr == sock {
			return p.pid
		}
	}
	t.Fatalf("no containerd-shim-runc-v2 with -id %s -address %s", sandboxID, sock)
	return 0
}

// sandboxOf returns the sandbox ID of container id of e's runtime.
func (e *env) sandboxOf(t testing.TB, id string) string {
	t.Helper()
	cs, err := e.cri.rt.ListContainers(criCtx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
	if err != nil || len(cs.Containers) != 1 {
		t.Fatalf("ListContainers(id %s): %v (%d containers)", id, err, len(cs.GetContainers()))
	}
	return cs.Containers[0].PodSandboxId
}

// exitCode returns the exit code e's runtime reports for exited container
// id.
func (e *env) exitCode(t testing.TB, id string) int32 {
	t.Helper()
	st := e.waitContainerState(t, id, runtimeapi.ContainerState_CONTAINER_EXITED, 30*time.Second)
	return st.ExitCode
}

// timedCRI runs a CRI call bounded by timeout and returns how long it took.
func timedCRI(timeout time.Duration, call func(context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s := time.Now()
	err := call(ctx)
	return time.Since(s).Round(10 * time.Microsecond), err
}

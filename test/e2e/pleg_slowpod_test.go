package e2e

// A pod whose containerd-shim stops answering, on the real containerd
// 2.2.9, and what `pleg diagnose` and `pleg run` make of it.
//
// What the suite found (see README.md, "A hung shim"): with the podsandbox
// sandboxer and the runc shim, the CRI calls a relist makes never reach the
// shim. ListPodSandbox, ListContainers, PodSandboxStatus and ContainerStatus
// (not verbose) are answered from containerd's memory and its metadata
// database, so a stopped shim (SIGSTOP; freezing the pod's cgroup does even
// less) leaves them at well under a millisecond; only a verbose
// PodSandboxStatus (`crictl inspectp`) asks the shim and hangs. The one way
// a hung shim reaches the relist is through a container's status lock: CRI
// UpdateContainerResources (the kubelet's CPU manager and in-place resize
// make it) holds the container's status lock for writing while it waits
// for the shim's task.Update, and every reader of that status then waits
// too: that container's ContainerStatus, and ListContainers, which reads
// the status of every container on the node before it filters. So
// containerd cannot be made to hang one pod's status calls alone: when they
// hang, the node's listing hangs with them, and a relist fails before it
// inspects any pod (containerd/containerd#9770 describes the same lock
// behind "PLEG is not healthy"). `pleg diagnose` then makes one call the
// kubelet does not: a verbose PodSandboxStatus of every sandbox, which
// finds the pod whose shim does not answer.

import (
	"context"
	"fmt"
	"os"
	"regexp"
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
	"github.com/podlifecycle/pleg/internal/stats"
)

// TestDiagnoseHungShim stops the shim of one pod ("slow", containers web
// and side) next to two healthy pods and checks, against raw CRI calls:
//
//  1. shim stopped: the pod's status calls answer at once; `pleg diagnose`
//     exits 0 with every pod ok, `pleg run` stays healthy. web's process
//     is SIGKILLed meanwhile: containerd does not learn of it (the shim
//     reaps and reports exits), so no view may report it either.
//  2. shim stopped and an UpdateContainerResources of side outstanding:
//     side's ContainerStatus and ListContainers hang, everything else
//     answers; `pleg diagnose` exits 1 within seconds, blames the listing
//     (ListContainers hung) and, through its shim probe (verbose
//     PodSandboxStatus of every sandbox), names the slow pod as the one
//     whose shim does not answer; `pleg run`'s relists fail and /healthz
//     turns 500 after its threshold.
//  3. shim continued: the update completes, /healthz is 200 again, web's
//     death is delivered with the exit code containerd reports, and the
//     cache holds the pod as containerd does, without error.
func TestDiagnoseHungShim(t *testing.T) {
	// The facts below are containerd 2.2.9's (the lock of
	// UpdateContainerResources, what a verbose status asks the shim);
	// TestDiagnose checks diagnose itself on every version.
	useRuntime(t, "2.2.")
	start := time.Now()
	daemon := startDaemon(t, "daemon", "--relist-period", "200ms", "--pod-inspection-timeout", "1s",
		"--runtime-request-timeout", "2s", "--relist-threshold", "4s", "-v=2")
	hz := watchHealthz(t, daemon, 100*time.Millisecond)

	var healthy []string // sandbox IDs
	var running []string // container IDs
	for i := 0; i < 2; i++ {
		sb, _ := RunPod(t, fmt.Sprintf("healthy-%d", i))
		healthy = append(healthy, sb)
		running = append(running, CreateAndStart(t, sb, "app", nil))
	}
	sb, uid := RunPod(t, "slow")
	web := CreateAndStart(t, sb, "web", []string{"run"})
	side := CreateAndStart(t, sb, "side", []string{"run"})
	running = append(running, web, side)
	for _, id := range running {
		WaitContainerState(t, id, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	}
	waitCached(t, 10*time.Second, []podCache{daemon}, uid, truthPod(t, uid))
	slowRef := podNamespace + "/slow"

	webPID := containerPID(t, web)
	requireOurs(t, webPID)
	shim := podShim(t, sb)
	if ppid := procPPID(webPID); ppid != shim {
		t.Fatalf("web's process %d has parent %d, want the pod's shim %d (containers share the sandbox's shim)", webPID, ppid, shim)
	}
	t.Logf("pods up, daemon caught up after %v; slow pod's shim is pid %d", time.Since(start).Round(time.Millisecond), shim)

	// ---------------------------------------------------------------
	// 1. The shim stops answering.
	sigstop(t, shim)
	phase1 := time.Now()
	rt := RuntimeClient()
	answers := []criProbe{
		{"PodSandboxStatus(slow)", func(ctx context.Context) error {
			_, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
			return err
		}},
		{"ContainerStatus(web)", func(ctx context.Context) error {
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: web})
			return err
		}},
		{"ContainerStatus(side)", func(ctx context.Context) error {
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: side})
			return err
		}},
		// Verbose too: pleg's relist makes it with --cri-socket
		// (docs/cri.md), so it must not wait on the shim.
		{"verbose ContainerStatus(web)", func(ctx context.Context) error {
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: web, Verbose: true})
			return err
		}},
		{"ListPodSandbox", func(ctx context.Context) error {
			_, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return err
		}},
		{"ListContainers", func(ctx context.Context) error {
			_, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
	}
	for _, c := range answers {
		d, err := timedCRI(time.Second, c.call)
		if err != nil {
			t.Fatalf("shim stopped: %s: %v after %v, want an answer (containerd serves it from memory)", c.name, err, d)
		}
		t.Logf("shim stopped: %s answered in %v", c.name, d)
	}
	// The one status call that asks the shim (for its task's status):
	// it hangs for the slow pod only, until the caller's deadline. How it
	// ends at that deadline is a race inside containerd, not a fact about
	// the shim: containerd's task.Status fails with the caller's expired
	// context, and containerd either answers DeadlineExceeded or, having
	// mapped the failure to an "unknown" task status, answers the status
	// itself a moment after the deadline, which the client may still
	// take (seen: <nil> after 1.002 s). So the test asserts the cause,
	// the call lasting its whole deadline, and accepts either ending.
	const verboseDeadline = time.Second
	for _, id := range append([]string{sb}, healthy...) {
		d, err := timedCRI(verboseDeadline, func(ctx context.Context) error {
			_, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
			return err
		})
		switch {
		case id == sb && d < verboseDeadline/2: // a healthy pod answers in ~1 ms
			t.Fatalf("shim stopped: verbose PodSandboxStatus(slow): %v after %v, want it to wait for the whole %v deadline (it asks the stopped shim)", errOr(err, "answered"), d, verboseDeadline)
		case id == sb && err != nil && status.Code(err) != codes.DeadlineExceeded:
			t.Fatalf("shim stopped: verbose PodSandboxStatus(slow): %v after %v, want DeadlineExceeded or a status answered at the deadline", err, d)
		case id != sb && err != nil:
			t.Fatalf("shim stopped: verbose PodSandboxStatus of a healthy pod: %v after %v", err, d)
		case id == sb:
			t.Logf("shim stopped: verbose PodSandboxStatus(slow) hangs (%v)", d)
		}
	}

	// web dies; only its (stopped) shim could notice.
	if err := syscall.Kill(webPID, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL web's process %d: %v", webPID, err)
	}
	killedAt := time.Now()

	rep, text, took := runDiagnose(t, 0)
	t.Logf("shim stopped: diagnose took %v (report %.3fs): %s", took.Round(time.Millisecond), rep.TookSeconds, rep.Verdict)
	// Nothing hangs (the report's hung calls say so below); the bound
	// only proves diagnose waits for no runtime timeout (2 min), with room
	// for a loaded machine (it takes ~15 ms on a quiet one).
	if took > 10*time.Second {
		t.Errorf("shim stopped: diagnose took %v, want well under 10s (nothing hangs)", took)
	}
	if !rep.Healthy || rep.Cause != nil || rep.Estimate.ListFails || rep.Estimate.HungCalls != 0 {
		t.Errorf("shim stopped: diagnose healthy=%v cause=%+v estimate=%+v, want healthy with no cause", rep.Healthy, rep.Cause, rep.Estimate)
	}
	// Nothing the kubelet calls hangs: no shim probe (it is made when a
	// list call hangs).
	if rep.ShimProbe != nil || len(rep.StuckShims) != 0 {
		t.Errorf("shim stopped: diagnose shimProbe=%+v stuckShims=%+v, want neither", rep.ShimProbe, rep.StuckShims)
	}
	if len(rep.Pods) != 3 {
		t.Errorf("shim stopped: diagnose reports %d pods, want 3", len(rep.Pods))
	}
	for _, p := range rep.Pods {
		if p.Result != "ok" {
			t.Errorf("shim stopped: diagnose: pod %s/%s result %q (%s), want ok", p.Namespace, p.Name, p.Result, p.Error)
		}
		if p.Namespace+"/"+p.Name == slowRef && p.SlowestCall != nil {
			t.Logf("shim stopped: slow pod's slowest call %s %.1fms", p.SlowestCall.Call, p.SlowestCall.Seconds*1000)
		}
	}
	// (The two runs time the calls anew, so their figures may differ.)
	for _, v := range []string{rep.Verdict, lastLine(text)} {
		if !strings.HasPrefix(v, "relist would take ~") || !strings.HasSuffix(v, " (threshold 3m0s): healthy") {
			t.Errorf("shim stopped: verdict %q, want \"relist would take ~... (threshold 3m0s): healthy\" (JSON and the text's last line)", v)
		}
	}
	// containerd still has web running, and so has the daemon.
	if st := ContainerState(t, web); st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("shim stopped: runtime reports web %v %v after its process was killed, want still RUNNING (no shim to report the exit)", st, time.Since(killedAt).Round(time.Millisecond))
	}
	waitRelistsSince(t, daemon, phase1, 5)
	p1 := relistsSince(t, daemon, phase1)
	for _, r := range p1 {
		if r.Error != "" {
			t.Errorf("shim stopped: relist failed: %s", r.Error)
		}
	}
	t.Logf("shim stopped: %d relists, p50 %s p99 %s max %s", len(p1), ms(stats.Percentile(durations(p1), 0.50)),
		ms(stats.Percentile(durations(p1), 0.99)), ms(stats.Percentile(durations(p1), 1)))
	if bad := hz.non200Since(phase1); len(bad) > 0 {
		t.Errorf("shim stopped: /healthz not 200: %v", bad)
	}

	// ---------------------------------------------------------------
	// 2. A resource update of side waits for the stopped shim, holding
	// side's status lock.
	updStart := time.Now()
	updCtx, updCancel := context.WithTimeout(context.Background(), time.Minute)
	updDone := make(chan error, 1)
	go func() {
		_, err := rt.UpdateContainerResources(updCtx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: side,
			Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512}})
		updDone <- err
	}()
	t.Cleanup(func() {
		updCancel()
		select {
		case <-updDone:
		case <-time.After(10 * time.Second):
			t.Errorf("cleanup: UpdateContainerResources did not return 10s after its cancellation")
		}
	})
	eventually(t, 5*time.Second, "side's ContainerStatus blocked by the outstanding update", func() error {
		select {
		case err := <-updDone:
			t.Fatalf("UpdateContainerResources returned while the shim is stopped: %v", err)
		default:
		}
		_, err := timedCRI(300*time.Millisecond, func(ctx context.Context) error {
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: side})
			return err
		})
		if status.Code(err) != codes.DeadlineExceeded {
			return fmt.Errorf("ContainerStatus(side): %v", err)
		}
		return nil
	})
	phase2 := time.Now()
	hangs := map[string]bool{"ContainerStatus(side)": true, "ListContainers": true}
	for _, c := range append(answers, criProbe{"ContainerStatus(healthy-0/app)", func(ctx context.Context) error {
		_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: running[0]})
		return err
	}}) {
		d, err := timedCRI(time.Second, c.call)
		switch {
		case hangs[c.name] && status.Code(err) != codes.DeadlineExceeded:
			t.Errorf("update outstanding: %s: %v after %v, want DeadlineExceeded (it waits for side's status lock)", c.name, err, d)
		case !hangs[c.name] && err != nil:
			t.Errorf("update outstanding: %s: %v after %v, want an answer", c.name, err, d)
		default:
			t.Logf("update outstanding: %s: %v after %v", c.name, errOr(err, "answered"), d)
		}
	}

	rep, text, took = runDiagnose(t, 1)
	t.Logf("update outstanding: diagnose took %v (report %.3fs): %s", took.Round(time.Millisecond), rep.TookSeconds, rep.Verdict)
	// The listing's 1s probe timeout, then the shim probe's: ~2 s on a
	// quiet machine; the bound proves it waits for no runtime timeout
	// (2 min), with room for a loaded machine.
	if took > 15*time.Second {
		t.Errorf("update outstanding: diagnose took %v, want about two 1s probe timeouts", took)
	}
	if rep.Healthy || !rep.Estimate.ListFails || rep.Cause == nil ||
		rep.Cause.Call != "ListContainers" || !rep.Cause.Hung || len(rep.Pods) != 0 {
		t.Errorf("update outstanding: diagnose healthy=%v estimate=%+v cause=%+v pods=%d, want the listing failing with ListContainers hung and no pod inspected",
			rep.Healthy, rep.Estimate, rep.Cause, len(rep.Pods))
	}
	// The shim probe: the slow pod's verbose PodSandboxStatus hangs, the
	// healthy pods' answer.
	if rep.Cause == nil || rep.Cause.Pod != slowRef || rep.Cause.PodUID != uid || rep.Cause.ID != "" {
		t.Errorf("update outstanding: diagnose cause=%+v, want pod %s (%s), the one whose shim is stopped", rep.Cause, slowRef, uid)
	}
	if sp := rep.ShimProbe; sp == nil || sp.Reason != "listHung" || sp.Sandboxes != 3 || sp.Stuck != 1 || sp.Answered != 2 || sp.Skipped != 0 {
		t.Errorf("update outstanding: diagnose shimProbe=%+v, want 3 sandboxes probed because the listing hung, 1 stuck", sp)
	}
	if len(rep.StuckShims) != 1 || rep.StuckShims[0].Pod != slowRef || rep.StuckShims[0].PodUID != uid ||
		rep.StuckShims[0].SandboxID != sb || rep.StuckShims[0].Seconds < 1 {
		t.Errorf("update outstanding: diagnose stuckShims=%+v, want only %s's sandbox %s", rep.StuckShims, slowRef, sb)
	}
	wantShim := fmt.Sprintf("; the shim of pod %s does not answer (crictl inspectp %s hangs): ", slowRef, sb[:13])
	if last := lastLine(text); !strings.HasPrefix(last, "relist fails: ListContainers hangs") || last != rep.Verdict ||
		!strings.Contains(last, wantShim) {
		t.Errorf("update outstanding: text verdict %q, want the JSON verdict %q starting with \"relist fails: ListContainers hangs\" and naming the stuck shim (%q)",
			last, rep.Verdict, wantShim)
	}
	if want := fmt.Sprintf("\n  pod %s: its shim does not answer: verbose PodSandboxStatus hung (no answer within 1s); try: crictl inspectp %s\n", slowRef, sb); !strings.Contains(text, want) {
		t.Errorf("update outstanding: diagnose text lacks %q:\n%s", strings.TrimSpace(want), text)
	}

	// The daemon's relists fail at the listing; /healthz turns 500 once
	// none has succeeded for the 4s threshold.
	var body string
	eventually(t, 15*time.Second, "/healthz 500", func() error {
		code, b := daemon.healthz(t)
		if code != 500 {
			return fmt.Errorf("HTTP %d %q", code, b)
		}
		body = b
		return nil
	})
	unhealthyAfter := time.Since(updStart)
	if !regexp.MustCompile(`^PLEG is not healthy: pleg was last seen active \S+ ago; threshold is 4s$`).MatchString(strings.TrimSpace(body)) {
		t.Errorf("update outstanding: /healthz body %q, want \"PLEG is not healthy: pleg was last seen active ... ago; threshold is 4s\"", body)
	}
	t.Logf("update outstanding: /healthz 500 %v after the update: %q", unhealthyAfter.Round(time.Millisecond), strings.TrimSpace(body))
	daemon.waitStderr(t, "Unable to retrieve pods", 5*time.Second)
	for _, l := range daemon.stderrLines() {
		if strings.Contains(l, "Unable to retrieve pods") {
			if !strings.Contains(l, "ListContainers") || !strings.Contains(l, "DeadlineExceeded") {
				t.Errorf("update outstanding: log line %q, want it to name ListContainers and DeadlineExceeded", l)
			}
			break
		}
	}
	metrics := daemonMetrics(t, daemon)
	if n := metrics.sum("kubelet_runtime_operations_errors_total", `operation_type="list_containers"`); n < 1 {
		t.Errorf("update outstanding: kubelet_runtime_operations_errors_total{operation_type=\"list_containers\"} = %v, want > 0", n)
	}
	// Relists are recorded when they end: wait for one that started
	// after the lock was seen held.
	var p2 []relistStat
	eventually(t, 10*time.Second, "a failed relist", func() error {
		p2 = relistsSince(t, daemon, phase2)
		for _, r := range p2 {
			if r.Error == "" {
				t.Fatalf("update outstanding: a relist succeeded: %+v", r)
			}
			if !strings.Contains(r.Error, "ListContainers") {
				t.Errorf("update outstanding: relist error %q, want ListContainers named", r.Error)
			}
		}
		if len(p2) < 1 {
			return fmt.Errorf("%d so far", len(p2))
		}
		return nil
	})
	t.Logf("update outstanding: %d relists since, all failed, p50 %s p99 %s; pleg_pod_inspection_timeouts_total %v",
		len(p2), ms(stats.Percentile(durations(p2), 0.50)), ms(stats.Percentile(durations(p2), 0.99)),
		metrics.sum("pleg_pod_inspection_timeouts_total", ""))
	if _, ok := daemon.log.find(pleg.ContainerDied, web); ok {
		t.Errorf("daemon reported web dead while containerd still had it running")
	}

	// ---------------------------------------------------------------
	// 3. The shim goes on: the update completes, the listing answers,
	// web's exit reaches containerd and the daemon.
	sigcont(t, shim)
	select {
	case err := <-updDone:
		if err != nil {
			t.Errorf("UpdateContainerResources after SIGCONT: %v, want success", err)
		}
		updDone <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatalf("UpdateContainerResources still outstanding 10s after SIGCONT")
	}
	recovered := time.Now()
	eventually(t, 10*time.Second, "/healthz 200 again", func() error {
		if code, b := daemon.healthz(t); code != 200 {
			return fmt.Errorf("HTTP %d %q", code, b)
		}
		return nil
	})
	t.Logf("shim continued: /healthz 200 %v later", time.Since(recovered).Round(time.Millisecond))
	st := WaitContainerState(t, web, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	waitEvents(t, 10*time.Second, []*eventLog{daemon.log}, pleg.ContainerDied, web)
	if e, _ := daemon.log.find(pleg.ContainerDied, web); e.ExitCode == nil || *e.ExitCode != st.ExitCode {
		t.Errorf("daemon: %v, want exit code %d as containerd reports", e, st.ExitCode)
	}
	if st.ExitCode != 137 {
		t.Errorf("runtime: web exit code %d (%s), want 137 (SIGKILL)", st.ExitCode, st.Reason)
	}
	died, _ := daemon.log.find(pleg.ContainerDied, web)
	t.Logf("shim continued: web exited with code %d (%s); ContainerDied delivered %v after SIGCONT",
		st.ExitCode, st.Reason, died.At.Sub(recovered).Round(time.Millisecond))
	waitCached(t, 10*time.Second, []podCache{daemon}, uid, truthPod(t, uid))
	for _, sb := range healthy {
		if PodState(t, sb) != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("healthy pod %.12s not ready", sb)
		}
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// Helpers.

// criProbe is a raw CRI call, named for the log.
type criProbe struct {
	name string
	call func(context.Context) error
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// podShim returns the pid of the containerd-shim-runc-v2 serving sandbox
// sandboxID of the suite's containerd.
func podShim(t testing.TB, sandboxID string) int {
	t.Helper()
	return shimPID(t, sandboxID, suite.sock)
}

// requireOurs fails the test unless process pid is in the suite's cgroups.
func requireOurs(t testing.TB, pid int) {
	t.Helper()
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil || !strings.Contains(string(cg), suite.cgroupParent+"/") {
		t.Fatalf("process %d is not in our cgroup %s (%v): %s", pid, suite.cgroupParent, err, cg)
	}
}

func procPPID(pid int) int { _, p := procStat(pid); return p }

// healthzWatch polls a daemon's /healthz and keeps what it answered.
type healthzWatch struct {
	mu      sync.Mutex
	samples []healthzSample
}

type healthzSample struct {
	at   time.Time
	code int
	body string
}

func (s healthzSample) String() string {
	return fmt.Sprintf("%s %d %q", s.at.Format("15:04:05.000"), s.code, strings.TrimSpace(s.body))
}

func watchHealthz(t testing.TB, d *daemonView, every time.Duration) *healthzWatch {
	w := &healthzWatch{}
	pollEvery(t, every, func() {
		code, b, err := d.get("/healthz")
		s := healthzSample{at: time.Now(), code: code, body: string(b)}
		if err != nil {
			s.body = err.Error()
		}
		w.mu.Lock()
		w.samples = append(w.samples, s)
		w.mu.Unlock()
	})
	return w
}

// non200Since returns the samples taken at or after since that were not 200.
func (w *healthzWatch) non200Since(since time.Time) []healthzSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []healthzSample
	for _, s := range w.samples {
		if !s.at.Before(since) && s.code != 200 {
			out = append(out, s)
		}
	}
	return out
}

// relistStat is one relist of the daemon's /api/v1/relists.
type relistStat struct {
	Start           time.Time `json:"start"`
	DurationSeconds float64   `json:"durationSeconds"`
	Inspected       int       `json:"inspected"`
	Failed          int       `json:"failed"`
	TimedOut        int       `json:"timedOut"`
	Error           string    `json:"error"`
}

func relistsSince(t testing.TB, d *daemonView, since time.Time) []relistStat {
	t.Helper()
	var body struct {
		Relists []relistStat `json:"relists"`
	}
	if _, err := d.getJSON("/api/v1/relists", &body); err != nil {
		t.Fatalf("%s: /api/v1/relists: %v", d.name, err)
	}
	var out []relistStat
	for _, r := range body.Relists {
		if !r.Start.Before(since) {
			out = append(out, r)
		}
	}
	return out
}

func waitRelistsSince(t testing.TB, d *daemonView, since time.Time, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d relists", n), func() error {
		if got := len(relistsSince(t, d, since)); got < n {
			return fmt.Errorf("%d so far", got)
		}
		return nil
	})
}

func durations(rs []relistStat) []time.Duration {
	out := make([]time.Duration, 0, len(rs))
	for _, r := range rs {
		out = append(out, time.Duration(r.DurationSeconds*float64(time.Second)))
	}
	return out
}

// promText is a scraped /metrics page.
type promText string

func daemonMetrics(t testing.TB, d *daemonView) promText {
	t.Helper()
	code, b, err := d.get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("%s: /metrics: HTTP %d %v", d.name, code, err)
	}
	return promText(b)
}

// sum adds up the samples of metric name whose labels contain label ("":
// all).
func (p promText) sum(name, label string) float64 {
	var total float64
	for _, l := range strings.Split(string(p), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		if label != "" && !strings.Contains(l, label) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}

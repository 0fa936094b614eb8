package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
)

// TestDiagnoseHungConmon: on CRI-O 1.36.3, the conmon of one container
// ("web" of pod "slow", beside "side" and two healthy pods) is SIGSTOPped.
// What the suite found:
//
//  1. conmon stopped: every CRI call of a relist still answers at once
//     (CRI-O serves them from memory); StopContainer of web returns after
//     its timeout (runc kills the process).
//  2. after that StopContainer, with conmon still stopped, web's
//     ContainerStatus and the pod's PodSandboxStatus hang (CRI-O waits for
//     the exit conmon has not reported), while the lists, side's status
//     and the other pods' statuses answer. The kubelet would wait its
//     runtime request timeout for them, once a relist. `pleg diagnose`
//     exits 0 (relist ~30s, under the 3m threshold, with a 30s request
//     timeout) and names the pod and the call that hangs; `pleg run`
//     (pod inspection timeout 1s) keeps relisting and stays healthy.
//  3. conmon continued: the calls answer again and web's death is
//     delivered with the exit code CRI-O reports.
func TestDiagnoseHungConmon(t *testing.T) {
	e := useCRIO(t)
	daemon := startDaemon(t, "daemon", "--relist-period", "200ms", "--pod-inspection-timeout", "1s",
		"--runtime-request-timeout", "2s", "--relist-threshold", "4s", "-v=2")
	hz := watchHealthz(t, daemon, 100*time.Millisecond)

	var healthy []string
	for i := 0; i < 2; i++ {
		sb, _ := RunPod(t, fmt.Sprintf("healthy-%d", i))
		healthy = append(healthy, sb)
		CreateAndStart(t, sb, "app", nil)
	}
	sb, uid := RunPod(t, "slow")
	web := CreateAndStart(t, sb, "web", []string{"run"})
	side := CreateAndStart(t, sb, "side", []string{"run"})
	WaitContainerState(t, web, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	WaitContainerState(t, side, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	waitCached(t, 10*time.Second, []podCache{daemon}, uid, truthPod(t, uid))
	conmon := conmonOf(t, e, web)
	rt := RuntimeClient()
	status := func(name, id string, sandbox bool) criProbe {
		return criProbe{name, func(ctx context.Context) error {
			if sandbox {
				_, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
				return err
			}
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
			return err
		}}
	}
	lists := []criProbe{
		{"ListPodSandbox", func(ctx context.Context) error {
			_, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return err
		}},
		{"ListContainers", func(ctx context.Context) error {
			_, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
		status("ContainerStatus(side)", side, false),
		status("PodSandboxStatus(healthy-0)", healthy[0], true),
		status("PodSandboxStatus(healthy-1)", healthy[1], true),
	}
	answer := func(phase string, probes []criProbe) {
		t.Helper()
		for _, c := range probes {
			if d, err := timedCRI(2*time.Second, c.call); err != nil {
				t.Fatalf("%s: %s: %v after %v, want an answer", phase, c.name, err, d)
			}
		}
	}

	// 1. conmon stopped.
	sigstop(t, conmon)
	answer("conmon stopped", append(lists, status("ContainerStatus(web)", web, false), status("PodSandboxStatus(slow)", sb, true)))
	stopStart := time.Now()
	if _, err := rt.StopContainer(criCtx(t), &runtimeapi.StopContainerRequest{ContainerId: web, Timeout: 1}); err != nil {
		t.Fatalf("StopContainer(web) with its conmon stopped: %v", err)
	}
	t.Logf("StopContainer(web) with its conmon stopped returned after %v", time.Since(stopStart).Round(time.Millisecond))

	// 2. web's and its pod's status hang; the rest answers.
	hangStart := time.Now()
	for _, c := range []criProbe{status("ContainerStatus(web)", web, false), status("PodSandboxStatus(slow)", sb, true)} {
		if d, err := timedCRI(time.Second, c.call); err == nil {
			t.Fatalf("after StopContainer with conmon stopped: %s answered in %v, want it to hang (CRI-O's behaviour changed?)", c.name, d)
		}
	}
	answer("after StopContainer with conmon stopped", lists)

	rep, text, took := runDiagnose(t, 0)
	t.Logf("diagnose took %v: %s", took.Round(time.Millisecond), rep.Verdict)
	if rep.List.Error != "" || rep.Estimate.ListFails {
		t.Errorf("diagnose list: %+v, want the listing to answer", rep.List)
	}
	if c := rep.Cause; c == nil || c.Pod != podNamespace+"/slow" || !c.Hung ||
		!(c.Call == "PodSandboxStatus" && c.ID == sb || c.Call == "ContainerStatus" && c.ID == web) {
		t.Errorf("diagnose cause %+v, want pod %s/slow with a hung PodSandboxStatus(%.12s) or ContainerStatus(web %.12s)", c, podNamespace, sb, web)
	}
	for _, p := range rep.Pods {
		if want := p.Name != "slow"; (p.Result == "ok") != want {
			t.Errorf("diagnose: pod %s/%s result %q (%s)", p.Namespace, p.Name, p.Result, p.Error)
		}
	}
	want := "for pod " + podNamespace + "/slow hangs"
	for _, v := range []string{rep.Verdict, lastLine(text)} {
		if !strings.Contains(v, want) {
			t.Errorf("verdict %q, want it to say %q (JSON and the text's last line)", v, want)
		}
	}
	if took > 5*time.Second {
		t.Errorf("diagnose took %v, want a few seconds (probe timeout 1s)", took)
	}

	// pleg run keeps relisting past its threshold: healthy throughout.
	waitRelistAfter(t, daemon, hangStart.Add(4*time.Second), 15*time.Second)
	if bad := hz.non200Since(hangStart); len(bad) > 0 {
		t.Errorf("pleg run /healthz not 200 while the slow pod's status hangs: %v", bad)
	}
	if code, body := daemon.healthz(t); code != http.StatusOK {
		t.Errorf("pleg run /healthz %d %q, want 200: one pod's hung status must not stall the relist", code, body)
	}

	// 3. conmon continued.
	sigcont(t, conmon)
	st := WaitContainerState(t, web, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
	answer("conmon continued", append(lists, status("ContainerStatus(web)", web, false), status("PodSandboxStatus(slow)", sb, true)))
	waitEvents(t, 10*time.Second, []*eventLog{daemon.log}, pleg.ContainerDied, web)
	if ev, _ := daemon.log.find(pleg.ContainerDied, web); ev.ExitCode == nil || *ev.ExitCode != st.ExitCode {
		t.Errorf("daemon: %v, want exit code %d as CRI-O reports", ev, st.ExitCode)
	}
	waitCached(t, 10*time.Second, []podCache{daemon}, uid, truthPod(t, uid))
	t.Logf("web exited with code %d (reason %q) once its conmon continued", st.ExitCode, st.Reason)
	daemon.requireRunning(t)
}

package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestHarness proves the harness with raw CRI calls, on every runtime:
// pods and containers run, exit codes are reported, the event stream works
// (1.6: answers Unimplemented), and pods survive a containerd restart.
func TestHarness(t *testing.T) {
	forEachRuntime(t, testHarness)
}

func testHarness(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt := RuntimeClient()

	ver, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runtime %s %s (CRI %s)", ver.RuntimeName, ver.RuntimeVersion, ver.RuntimeApiVersion)
	if !strings.Contains(ver.RuntimeVersion, e.version) {
		t.Fatalf("runtime version %q, want %s", ver.RuntimeVersion, e.name())
	}

	sandboxID, podUID := RunPod(t, "harness")
	if got := PodState(t, sandboxID); got != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod state %v, want SANDBOX_READY", got)
	}
	pst, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		t.Fatal(err)
	}
	if pst.Status.Labels[labelPodUID] != podUID || pst.Status.Metadata.Uid != podUID {
		t.Fatalf("pod labels/metadata %v / %v do not carry uid %s", pst.Status.Labels, pst.Status.Metadata, podUID)
	}

	t.Run("exit code", func(t *testing.T) {
		id := CreateAndStart(t, sandboxID, "exiter", []string{"exit", "3"})
		st := WaitContainerState(t, id, runtimeapi.ContainerState_CONTAINER_EXITED, 10*time.Second)
		if st.ExitCode != 3 {
			t.Fatalf("exit code %d, want 3 (reason %q)", st.ExitCode, st.Reason)
		}
		if st.Labels[labelContainerName] != "exiter" || st.Labels[labelPodUID] != podUID {
			t.Fatalf("container labels %v", st.Labels)
		}
	})

	runner := CreateAndStart(t, sandboxID, "runner", []string{"run"})
	WaitContainerState(t, runner, runtimeapi.ContainerState_CONTAINER_RUNNING, 10*time.Second)
	t.Run("logs", func(t *testing.T) {
		logPath := ContainerStatus(t, runner).LogPath
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, _ := os.ReadFile(logPath)
			if strings.Contains(string(b), "workload: run") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("log %s has %q, want the workload's start line", logPath, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.HasPrefix(logPath, filepath.Join(SuiteDir(), "logs")) {
			t.Errorf("log path %s is not under the suite dir", logPath)
		}
	})

	t.Run("events", func(t *testing.T) {
		if !e.hasEvents() {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.Unimplemented {
				t.Fatalf("GetContainerEvents on %s: %v, want Unimplemented", e.name(), err)
			}
			return
		}
		// Opened after the activity above: containerd replays its buffered
		// events to the first subscriber, then streams new ones.
		events := ContainerEvents(t)
		sleeper := CreateAndStart(t, sandboxID, "sleeper", []string{"sleep", "300ms"})
		want := map[runtimeapi.ContainerEventType]bool{
			runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT: true,
			runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT: true,
			runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT: true,
		}
		var replayed []string
		timeout := time.After(15 * time.Second)
		for len(want) > 0 {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatal("event stream closed")
				}
				if ev.ContainerId == sleeper {
					delete(want, ev.ContainerEventType)
				} else {
					replayed = append(replayed, ev.ContainerEventType.String())
				}
			case <-timeout:
				t.Fatalf("missing events for the new container: %v", want)
			}
		}
		t.Logf("events of earlier containers seen on the stream (replayed or late): %v", replayed)
		if st := ContainerStatus(t, sleeper); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 0 {
			t.Fatalf("sleeper: state %v exit code %d, want EXITED 0", st.State, st.ExitCode)
		}
	})

	t.Run("containerd restart", func(t *testing.T) {
		before := ContainerStatus(t, runner)
		start := time.Now()
		RestartContainerd(t)
		t.Logf("restart took %v", time.Since(start).Round(time.Millisecond))
		if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
			t.Fatalf("CRI after restart: %v", err)
		}
		pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(pods.Items, func(p *runtimeapi.PodSandbox) bool { return p.Id == sandboxID }) {
			t.Fatalf("pod %s not listed after restart: %v", sandboxID, pods.Items)
		}
		if got := PodState(t, sandboxID); got != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Fatalf("pod state after restart %v, want SANDBOX_READY", got)
		}
		after := ContainerStatus(t, runner)
		if after.State != runtimeapi.ContainerState_CONTAINER_RUNNING || after.StartedAt != before.StartedAt {
			t.Fatalf("runner after restart: %v started %d, want RUNNING started %d", after.State, after.StartedAt, before.StartedAt)
		}
	})

	t.Run("stop and remove", func(t *testing.T) {
		StopContainer(t, runner, 10)
		st := WaitContainerState(t, runner, runtimeapi.ContainerState_CONTAINER_EXITED, 5*time.Second)
		if st.ExitCode != 0 {
			t.Fatalf("runner exit code %d after SIGTERM, want 0", st.ExitCode)
		}
		RemoveContainer(t, runner)
		StopPod(t, sandboxID)
		if got := PodState(t, sandboxID); got != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Fatalf("pod state after stop %v, want SANDBOX_NOTREADY", got)
		}
		RemovePod(t, sandboxID)
		pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 0 || len(ctrs.Containers) != 0 {
			t.Fatalf("left after removal: %d pods, %d containers", len(pods.Items), len(ctrs.Containers))
		}
	})

	if e.kind == kindCRIO {
		// CRI-O's default: no events, and a stream that says so by
		// ending at once with OK (not Unimplemented).
		t.Run("enable_pod_events=false", func(t *testing.T) {
			setPodEvents(t, false)
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			start := time.Now()
			stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
			if err != nil {
				t.Fatalf("GetContainerEvents: %v, want a stream", err)
			}
			ev, err := stream.Recv()
			if !errors.Is(err, io.EOF) {
				t.Fatalf("GetContainerEvents with enable_pod_events=false: Recv = %v, %v; want the stream ended (io.EOF)", ev, err)
			}
			t.Logf("GetContainerEvents ended with OK after %v", time.Since(start).Round(time.Millisecond))
		})
	}
}

// A container's cgroups the runtime left behind are removed when empty
// (runc's rmdir can lose a race with the exiting task on cgroup v1), and
// are an error while a process is still in one: real cgroups, in every
// hierarchy the machine mounts.
func TestRemoveEmptyContainerCgroups(t *testing.T) {
	id := "pleg-e2e-cgroup-test-" + strings.ReplaceAll(t.Name(), "/", "-")
	dirs := cgroupDirs("/k8s.io/" + id)
	if len(dirs) == 0 {
		t.Fatal("no cgroup hierarchy mounted")
	}
	mk := func() {
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(d, "child"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { rmdirTrees(dirs) })

	mk()
	removed, err := removeEmptyContainerCgroups(id)
	if err != nil || len(removed) != len(dirs) {
		t.Fatalf("empty cgroups: removed %v, %v; want all of %v", removed, err, dirs)
	}
	for _, d := range dirs {
		if fileExists(d) {
			t.Errorf("%s still exists", d)
		}
	}
	if removed, err := removeEmptyContainerCgroups(id); removed != nil || err != nil {
		t.Errorf("none left: %v, %v", removed, err)
	}

	// A process in one of them: an error, and nothing removed.
	mk()
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	if err := os.WriteFile(filepath.Join(dirs[0], "child", "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err = removeEmptyContainerCgroups(id)
	if err == nil || !strings.Contains(err.Error(), "with processes") || removed != nil {
		t.Fatalf("a process in %s: removed %v, %v; want an error naming it", dirs[0], removed, err)
	}
	if !fileExists(dirs[0]) {
		t.Errorf("%s removed with a process in it", dirs[0])
	}
	// Give the process back to the root cgroup, so that the cleanup can
	// remove the test's cgroups.
	root := filepath.Dir(filepath.Dir(dirs[0]))
	os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644)
}

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestKubeletStaticPod runs the real kubelet with one static pod: /pods
// shows it Running with its container running, /healthz is ok, the
// kubelet read the pod from its static pod directory ("SyncLoop ADD"
// source="file") and its PLEG logged the container starting.
func TestKubeletStaticPod(t *testing.T) {
	k := startKubelet(t)
	name := k.AddPod(t, StaticPod{Name: "hello", Containers: []StaticContainer{{Name: "app", Args: []string{"run"}}}})
	p := k.WaitPod(t, name, 60*time.Second, podRunning)
	c, ok := p.container("app")
	if !ok || c.State.Running == nil || !strings.HasPrefix(c.ContainerID, "containerd://") {
		t.Fatalf("container app: %+v", c)
	}
	if code, body := k.Healthz(t); code != http.StatusOK || body != "ok" {
		t.Errorf("kubelet /healthz: %d %q", code, body)
	}
	k.WaitLog(t, `"SyncLoop ADD" source="file" pods=["`+kubeletNamespace+"/"+name+`"]`, 10*time.Second)
	id := runtimeID(c.ContainerID)
	eventually(t, 10*time.Second, "kubelet PLEG: ContainerStarted for app", func() error {
		for _, l := range k.PLEGLines() {
			if l.Kind == "event" && l.Type == "ContainerStarted" && l.ContainerID == id && l.PodUID == p.Metadata.UID &&
				l.Pod == kubeletNamespace+"/"+name {
				return nil
			}
		}
		return errors.New("not logged")
	})
}

// envKubeletChild marks the test binary TestKubeletKilled re-executes.
const envKubeletChild = "PLEG_E2E_KUBELET_CHILD"

// TestKubeletKilled proves the cleanup when the test binary that runs a
// kubelet is SIGKILLed (no cleanup of its own runs): it re-executes itself
// (TestKubeletKilled in child mode, containerd 2.2 only) to start a
// kubelet with a running static pod, SIGKILLs that child, and checks that
// the supervisors tear everything down by themselves: the kubelet and every
// other process of both dirs gone, the dirs gone, no cgroup of the pod's
// sandbox or container left.
func TestKubeletKilled(t *testing.T) {
	if os.Getenv(envKubeletChild) == "1" {
		kubeletKilledChild(t)
		return
	}
	requireKubeletRuntime(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^TestKubeletKilled$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envKubeletChild+"=1", envRuntimes+"="+kubeletRuntime, envCache+"="+suite.cacheDir)
	// Its stdout and stderr on one pipe of ours, read to the end (the
	// supervisors and the kubelet write to their own log files).
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		t.Fatal(err)
	}
	w.Close()
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	var mu sync.Mutex
	var output []string
	ready := make(chan []string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			mu.Lock()
			output = append(output, sc.Text())
			mu.Unlock()
			if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "KUBELET-CHILD-READY" {
				ready <- f[1:]
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
		<-readDone
	})
	childOutput := func() string {
		mu.Lock()
		defer mu.Unlock()
		return "  | " + strings.Join(output, "\n  | ")
	}
	var fields []string
	select {
	case fields = <-ready:
	case <-waited:
		<-readDone
		t.Fatalf("the child exited before its kubelet was ready:\n%s", childOutput())
	case <-time.After(3 * time.Minute):
		t.Fatalf("the child's kubelet not ready within 3 minutes:\n%s", childOutput())
	}
	kubeletDir, suiteDir, ids := fields[0], fields[1], fields[2:]
	if len(ids) < 2 || !strings.HasPrefix(filepath.Base(kubeletDir), "pleg-e2e-") || !strings.HasPrefix(filepath.Base(suiteDir), "pleg-e2e-") {
		t.Fatalf("child says %q", fields)
	}
	kubeletProcs := ourProcesses(kubeletDir, "/"+filepath.Base(kubeletDir), -1)
	found := false
	for _, p := range kubeletProcs {
		found = found || (len(p.argv) > 0 && p.argv[0] == filepath.Join(kubeletDir, "bin", "kubelet"))
	}
	if !found {
		t.Fatalf("no kubelet among the processes of %s: %v", kubeletDir, kubeletProcs)
	}
	t.Logf("child ready: kubelet env %s, suite %s, %d processes of the kubelet's env (%v); SIGKILL", kubeletDir, suiteDir, len(kubeletProcs), kubeletProcs)
	// Each of those processes by identity, so that their end is checked
	// whatever decides what is "ours".
	before := map[int]string{}
	for _, p := range kubeletProcs {
		before[p.pid] = processIdentity(p.pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-waited
	start := time.Now()
	eventually(t, time.Minute, "the supervisors clean up after the SIGKILLed test binary", func() error {
		var left []string
		procs := listProcs()
		for pid, id := range before {
			if p := procs[pid]; p != nil && p.state != 'Z' && processIdentity(pid) == id {
				left = append(left, "still running: "+p.String())
			}
		}
		for _, dir := range []string{kubeletDir, suiteDir} {
			if procs := ourProcesses(dir, "/"+filepath.Base(dir), -1); len(procs) > 0 {
				left = append(left, fmt.Sprintf("processes of %s: %v", dir, procs))
			}
			if fileExists(dir) {
				left = append(left, dir+" exists")
			}
		}
		for _, id := range ids {
			for _, cg := range cgroupDirs("/k8s.io/" + id) {
				if fileExists(cg) {
					left = append(left, "cgroup "+cg)
				}
			}
		}
		if len(left) > 0 {
			return errors.New(strings.Join(left, "; "))
		}
		return nil
	})
	t.Logf("everything gone %v after the SIGKILL", time.Since(start).Round(time.Millisecond))
}

// kubeletKilledChild is TestKubeletKilled's child: a kubelet with a running
// static pod, its dirs and IDs on stdout, then it waits to be killed (at
// most 2 minutes).
func kubeletKilledChild(t *testing.T) {
	k := startKubelet(t)
	name := k.AddPod(t, StaticPod{Name: "doomed", Containers: []StaticContainer{{Name: "app", Args: []string{"run"}}}})
	k.WaitPod(t, name, time.Minute, podRunning)
	ids := k.runtimeIDs()
	fmt.Printf("KUBELET-CHILD-READY %s %s %s\n", k.env.dir, SuiteDir(), strings.Join(ids, " "))
	// Not a wait for a condition: the parent SIGKILLs this process within
	// seconds; the bound only ends a child whose parent is gone.
	time.Sleep(2 * time.Minute)
	t.Fatal("not killed within 2 minutes")
}

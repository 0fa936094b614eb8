package criserve

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/journal"
)

// TestProcScope maps PIDs to pods through a fake /proc: containerd's and
// CRI-O's systemd cgroups, cgroupfs, cgroup v1 lines, a sandbox's pause
// process, a process of the node, and a container pleg does not know.
func TestProcScope(t *testing.T) {
	j := journal.New(journal.Options{Epoch: "e1"})
	cid := strings.Repeat("ab", 32)
	sid := strings.Repeat("cd", 32)
	uid := "8f4c1a2e-3b5d-4e6f-9a0b-1c2d3e4f5a6b"
	p := journalPod(uid, 0)
	p.Containers[0].ID, p.Sandboxes[0].ID = cid, sid
	started(j, p)
	other := journalPod("0b1c2d3e-aaaa-4bbb-8ccc-ddddeeeeffff", 0)
	started(j, other)

	root := t.TempDir()
	us := strings.ReplaceAll(uid, "-", "_")
	files := map[int]string{
		// containerd, systemd driver, cgroup v2
		10: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice/cri-containerd-" + cid + ".scope\n",
		// CRI-O, systemd driver
		11: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us + ".slice/crio-" + cid + ".scope\n",
		// cgroupfs driver
		12: "0::/kubepods/besteffort/pod" + uid + "/" + cid + "\n",
		// cgroup v1 lines
		13: "12:memory:/kubepods/pod" + uid + "/" + cid + "\n11:cpu,cpuacct:/kubepods/pod" + uid + "/" + cid + "\n0::/\n",
		// the sandbox's pause process
		14: "0::/kubepods.slice/kubepods-pod" + us + ".slice/cri-containerd-" + sid + ".scope\n",
		// a container pleg does not know yet, in the pod's cgroup
		15: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice/cri-containerd-" + strings.Repeat("ef", 32) + ".scope\n",
		// the node
		20: "0::/system.slice/sshd.service\n",
		21: "0::/\n",
		// a pod pleg does not know
		22: "0::/kubepods.slice/kubepods-pod11111111_2222_4333_8444_555555555555.slice/cri-containerd-" + strings.Repeat("12", 32) + ".scope\n",
	}
	for pid, content := range files {
		writeFile(t, filepath.Join(root, strconv.Itoa(pid), "cgroup"), content)
	}
	ps := ProcScope{Root: root}
	for pid := range files {
		got, ok := ps.PodOf(int32(pid), j)
		want := pid < 20
		if ok != want {
			t.Errorf("pid %d: in a pod %t, want %t", pid, ok, want)
			continue
		}
		if ok && string(got.UID) != uid {
			t.Errorf("pid %d: pod %s, want %s", pid, got.UID, uid)
		}
	}
	for _, pid := range []int32{0, -1, 99} { // no such process
		if _, ok := ps.PodOf(pid, j); ok {
			t.Errorf("pid %d: found a pod", pid)
		}
	}
}

// TestProcScopeThroughSocket: the real peer credentials of a caller (this
// process) lead through a fake /proc to its pod.
func TestProcScopeThroughSocket(t *testing.T) {
	root := t.TempDir()
	cid := strings.Repeat("ab", 32)
	writeFile(t, filepath.Join(root, strconv.Itoa(os.Getpid()), "cgroup"),
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice/cri-containerd-"+cid+".scope\n")
	_, j, c := bareServer(t, Config{Scope: ProcScope{Root: root}})
	mine := journalPod("mine", 0)
	mine.Containers[0].ID = cid
	started(j, mine)
	started(j, journalPod("other", 0))
	cs, err := c.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.GetContainers()) != 1 || cs.GetContainers()[0].GetId() != cid {
		t.Errorf("ListContainers through the pod-scoped socket: %v, want only %s", cs.GetContainers(), cid)
	}
	// Another process's view: this PID's cgroup no longer names a known
	// container.
	writeFile(t, filepath.Join(root, strconv.Itoa(os.Getpid()), "cgroup"), "0::/user.slice\n")
	cs, err = c.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil || len(cs.GetContainers()) != 0 {
		t.Errorf("ListContainers from no pod: %v, %v; want nothing", cs.GetContainers(), err)
	}
}

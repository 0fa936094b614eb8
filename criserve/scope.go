package criserve

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/journal"
)

// ProcScope finds a caller's pod from /proc: the cgroups of its process
// (/proc/PID/cgroup) name its container's cgroup, which holds the
// container's ID (containerd: cri-containerd-<id>.scope or
// .../<id>; CRI-O: crio-<id>.scope) and its pod's UID
// (kubepods-...-pod<uid>.slice or .../pod<uid>/). The ID is looked up
// among the containers and sandboxes the journal knows; failing that, the
// pod UID among its pods.
type ProcScope struct {
	// Root is the proc file system (default "/proc"); tests give a fake.
	Root string
}

// maxCgroupFile bounds what is read of /proc/PID/cgroup.
const maxCgroupFile = 64 << 10

// PodOf implements Scope.
func (ps ProcScope) PodOf(pid int32, j *journal.Journal) (*journal.Pod, bool) {
	root := ps.Root
	if root == "" {
		root = "/proc"
	}
	if pid <= 0 {
		return nil, false
	}
	f, err := os.Open(filepath.Join(root, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	buf := make([]byte, maxCgroupFile)
	n, _ := f.Read(buf)
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(buf[:n]))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && parts[2] != "" && parts[2] != "/" {
			paths = append(paths, parts[2])
		}
	}
	for _, p := range paths {
		for _, id := range hexRuns(p, 32) {
			if found, ok := j.Container(id); ok && !found.Removed {
				return found.Pod, true
			}
		}
	}
	for _, p := range paths {
		for _, uid := range podUIDs(p) {
			if pod, ok := j.Pod(types.UID(uid)); ok {
				return pod, true
			}
		}
	}
	return nil, false
}

// hexRuns returns the runs of lower-case hex digits of s at least min
// long: container IDs in a cgroup path.
func hexRuns(s string, min int) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		hex := i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f')
		switch {
		case hex && start < 0:
			start = i
		case !hex && start >= 0:
			if i-start >= min {
				out = append(out, s[start:i])
			}
			start = -1
		}
	}
	return out
}

// podUIDs returns the pod UIDs a cgroup path names: a component
// "pod<uid>" (cgroupfs) or "...-pod<uid>.slice" (systemd, with the UID's
// dashes as underscores).
func podUIDs(path string) []string {
	var out []string
	for _, c := range strings.Split(path, "/") {
		c = strings.TrimSuffix(c, ".slice")
		i := strings.LastIndex(c, "pod")
		if i < 0 || (i > 0 && c[i-1] != '-') {
			continue
		}
		uid := strings.ReplaceAll(c[i+3:], "_", "-")
		if len(uid) >= 8 {
			out = append(out, uid)
		}
	}
	return out
}

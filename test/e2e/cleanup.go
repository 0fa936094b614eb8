package e2e

// Low-level cleanup used by the supervisor's teardown and by the test
// process's final check: finding our processes, mounts, cgroups and shim
// sockets. "Ours" is always decided from the private dir (every path of
// ours is below it) or from the process tree below the supervisor; nothing
// is matched by a broad name.

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type procInfo struct {
	pid, ppid int
	state     byte
	comm      string
	argv      []string
}

func (p *procInfo) String() string {
	return fmt.Sprintf("%d(%s %c)", p.pid, strings.Join(p.argv, " "), p.state)
}

// listProcs reads /proc. Processes that vanish meanwhile are skipped.
func listProcs() map[int]*procInfo {
	ents, _ := os.ReadDir("/proc")
	procs := make(map[int]*procInfo, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces and parens.
		s := string(stat)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		p := &procInfo{pid: pid, ppid: ppid, state: fields[0][0], comm: s[open+1 : close]}
		if cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && len(cl) > 0 {
			p.argv = strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		}
		procs[pid] = p
	}
	return procs
}

// ownedBinaries are the programs whose command line names our dir when
// they belong to us (containerd --config <dir>/config.toml, shims with
// -address <dir>/containerd.sock, runc --root <dir>/runc/..., ctr -a ...;
// crio --config <dir>/crio.conf, conmon --exit-dir <dir>/exits ... (CRI-O's
// per-container monitor, double-forked), pinns -d <dir>/ns, skopeo copy).
var ownedBinaries = map[string]bool{
	"containerd": true, "containerd-shim-runc-v2": true, "ctr": true, "runc": true,
	"crio": true, "conmon": true, "pinns": true, "skopeo": true,
}

func referencesDir(p *procInfo, dir string) bool {
	if len(p.argv) == 0 {
		return false
	}
	// A program run from our dir (the pleg binary the scenario tests build
	// into <dir>/bin) is ours whatever its arguments.
	if strings.HasPrefix(p.argv[0], dir+"/") {
		return true
	}
	if !ownedBinaries[filepath.Base(p.argv[0])] {
		return false
	}
	for _, a := range p.argv[1:] {
		if a == dir || strings.HasPrefix(a, dir+"/") {
			return true
		}
	}
	return false
}

// ourProcesses returns the live (non-zombie) processes that are ours: those
// of ownedBinaries whose command line references dir, those in our cgroup
// parent, the children of supervisor (if > 0; it is their subreaper), and
// all their descendants.
func ourProcesses(dir, cgroupParent string, supervisor int) []*procInfo {
	procs := listProcs()
	inCgroup := cgroupProcs(cgroupParent)
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	seen := map[int]bool{}
	var queue []int
	for _, p := range procs {
		if p.pid == supervisor || p.pid == os.Getpid() {
			continue
		}
		if (supervisor > 0 && p.ppid == supervisor) || referencesDir(p, dir) || inCgroup[p.pid] {
			queue = append(queue, p.pid)
		}
	}
	var out []*procInfo
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] || pid == supervisor || pid == os.Getpid() {
			continue
		}
		seen[pid] = true
		if p := procs[pid]; p != nil && p.state != 'Z' {
			out = append(out, p)
		}
		queue = append(queue, children[pid]...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// killOurProcesses SIGKILLs ourProcesses until none is left and (for the
// supervisor) its zombie children have been reaped.
func killOurProcesses(dir, cgroupParent string, supervisor int, timeout time.Duration) (int, error) {
	killed := map[int]bool{}
	deadline := time.Now().Add(timeout)
	for {
		left := ourProcesses(dir, cgroupParent, supervisor)
		zombies := 0
		if supervisor > 0 {
			for _, p := range listProcs() {
				if p.ppid == supervisor && p.state == 'Z' {
					zombies++
				}
			}
		}
		if len(left) == 0 && zombies == 0 {
			return len(killed), nil
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("processes still alive after %v: %v (and %d unreaped zombies)", timeout, left, zombies)
		}
		for _, p := range left {
			if syscall.Kill(p.pid, syscall.SIGKILL) == nil {
				killed[p.pid] = true
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// mountsUnder returns the mount points at or below dir, from
// /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	var out []string
	for _, m := range readMountinfo() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	return out
}

type mountEntry struct{ point, fstype string }

func readMountinfo() []mountEntry {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		m := mountEntry{point: unescapeMountinfo(f[4])}
		for i := 6; i < len(f)-1; i++ {
			if f[i] == "-" {
				m.fstype = f[i+1]
				break
			}
		}
		out = append(out, m)
	}
	return out
}

// unescapeMountinfo decodes the \ooo octal escapes of mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder lazily unmounts everything at or below dir, deepest first,
// until nothing is left (a mount can hide others stacked below it).
func unmountUnder(dir string) (int, error) {
	n := 0
	for round := 0; round < 20; round++ {
		ms := mountsUnder(dir)
		if len(ms) == 0 {
			return n, nil
		}
		sort.Slice(ms, func(i, j int) bool {
			return strings.Count(ms[i], "/") > strings.Count(ms[j], "/") ||
				(strings.Count(ms[i], "/") == strings.Count(ms[j], "/") && ms[i] > ms[j])
		})
		for _, m := range ms {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err == nil {
				n++
			}
		}
	}
	if ms := mountsUnder(dir); len(ms) > 0 {
		return n, fmt.Errorf("still mounted: %v", ms)
	}
	return n, nil
}

// cgroupDirs returns the directories of cgroup path parent in every mounted
// cgroup hierarchy (v1 controllers and the v2/unified one).
func cgroupDirs(parent string) []string {
	if parent == "" || parent == "/" || !strings.HasPrefix(parent, "/") {
		return nil
	}
	var out []string
	for _, m := range readMountinfo() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, filepath.Join(m.point, parent))
		}
	}
	return out
}

// cgroupProcs returns the pids in cgroup path parent or below it, in any
// hierarchy.
func cgroupProcs(parent string) map[int]bool {
	if !strings.HasPrefix(parent, "/pleg-e2e-") {
		return map[int]bool{} // never look at anybody else's cgroups
	}
	return procsIn(cgroupDirs(parent))
}

// procsIn returns the pids in the cgroup directories roots or below them.
func procsIn(roots []string) map[int]bool {
	pids := map[int]bool{}
	for _, root := range roots {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	return pids
}

// runcCgroupPaths returns the cgroup paths of the containers whose runc
// state is under dir/runc (state.json "cgroup_paths"), for containers
// created outside our cgroup parent.
func runcCgroupPaths(dir string) []string {
	// containerd's runc root is <dir>/runc/<namespace>, CRI-O's <dir>/runc.
	files, _ := filepath.Glob(filepath.Join(dir, "runc", "*", "*", "state.json"))
	more, _ := filepath.Glob(filepath.Join(dir, "runc", "*", "state.json"))
	files = append(files, more...)
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var st struct {
			CgroupPaths map[string]string `json:"cgroup_paths"`
		}
		if json.Unmarshal(b, &st) != nil {
			continue
		}
		for _, p := range st.CgroupPaths {
			if strings.HasPrefix(p, "/sys/fs/cgroup/") {
				out = append(out, p)
			}
		}
	}
	return out
}

// removeCgroups removes our cgroup parent in every hierarchy and the cgroups
// of our runc containers, deepest first. Cgroup directories can only be
// removed once their processes are gone; a few retries cover the kernel
// catching up after SIGKILL.
func removeCgroups(dir, parent string) (int, error) {
	return rmdirTrees(append(cgroupDirs(parent), runcCgroupPaths(dir)...))
}

// rmdirTrees removes the cgroup directories roots and everything below
// them, deepest first, waiting up to 2.5 s for the kernel to let go of
// exited processes.
func rmdirTrees(roots []string) (int, error) {
	removed := 0
	var lastErr error
	for try := 0; try < 50; try++ {
		lastErr = nil
		for _, root := range roots {
			var dirs []string
			filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
			for _, d := range dirs {
				if err := syscall.Rmdir(d); err == nil {
					removed++
				} else if !errors.Is(err, syscall.ENOENT) {
					lastErr = fmt.Errorf("rmdir %s: %w", d, err)
				}
			}
		}
		if lastErr == nil {
			return removed, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return removed, lastErr
}

// shimSockets returns the paths of the sockets the runc shims of our
// containerd create. containerd 2.x names them
// /run/containerd/s/<sha256(<containerd address>/<namespace>/<id>)>
// (pkg/shim.SocketAddress), plus a ".../debug" variant, outside our dir.
// The ids are taken from the task bundles in our state dir and from the
// command lines of running shims.
func shimSockets(dir string) []string {
	address := filepath.Join(dir, "containerd.sock")
	type key struct{ ns, id string }
	keys := map[key]bool{}
	bundles, _ := filepath.Glob(filepath.Join(dir, "state", "io.containerd.runtime.v2.task", "*", "*"))
	for _, b := range bundles {
		keys[key{filepath.Base(filepath.Dir(b)), filepath.Base(b)}] = true
	}
	for _, p := range listProcs() {
		if len(p.argv) == 0 || filepath.Base(p.argv[0]) != "containerd-shim-runc-v2" {
			continue
		}
		var ns, id, addr string
		for i := 1; i+1 < len(p.argv); i++ {
			switch p.argv[i] {
			case "-namespace":
				ns = p.argv[i+1]
			case "-id":
				id = p.argv[i+1]
			case "-address":
				addr = p.argv[i+1]
			}
		}
		if addr == address && ns != "" && id != "" {
			keys[key{ns, id}] = true
		}
	}
	var out []string
	for k := range keys {
		for _, suffix := range []string{"", "debug"} {
			sum := sha256.Sum256([]byte(filepath.Join(address, k.ns, k.id, suffix)))
			out = append(out, fmt.Sprintf("/run/containerd/s/%x", sum))
		}
	}
	sort.Strings(out)
	return out
}

// probeSnapshotter returns "overlayfs" if an overlay mount works in dir,
// else "native".
func probeSnapshotter(dir string) string {
	base := filepath.Join(dir, "overlay-probe")
	defer os.RemoveAll(base)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return "native"
		}
	}
	merged := filepath.Join(base, "merged")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "work"))
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		logf("overlay mount does not work here (%v): using the native snapshotter", err)
		return "native"
	}
	syscall.Unmount(merged, syscall.MNT_DETACH)
	return "overlayfs"
}

// ownerFile, in a suite dir, holds the processIdentity of its supervisor.
const ownerFile = "supervisor.id"

// processIdentity is "<pid> <start time>", which stays unique when pids are
// reused; "" if the process does not exist.
func processIdentity(pid int) string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 {
		return ""
	}
	return strconv.Itoa(pid) + " " + fields[19] // field 22 of stat: starttime
}

// sweepStale cleans up suite dirs of earlier runs whose supervisor is gone
// (it was killed itself, so it could not clean up): their processes,
// mounts, cgroups, shim sockets and the dir. Dirs of live runs, and dirs
// without an owner file, are left alone.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pleg-e2e-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		id := strings.TrimSpace(string(b))
		pid, _, _ := strings.Cut(id, " ")
		if n, err := strconv.Atoi(pid); err != nil || processIdentity(n) == id {
			continue
		}
		logf("cleaning up %s, left by a run whose supervisor died", dir)
		sockets := shimSockets(dir)
		var errs []error
		if _, err := killOurProcesses(dir, "/"+filepath.Base(dir), -1, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
		if _, err := unmountUnder(dir); err != nil {
			errs = append(errs, err)
		}
		if _, err := removeCgroups(dir, "/"+filepath.Base(dir)); err != nil {
			errs = append(errs, err)
		}
		for _, p := range sockets {
			if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
				os.Remove(p)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			logf("cleaning up %s: %v", dir, err)
		}
	}
}

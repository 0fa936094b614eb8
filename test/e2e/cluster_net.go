package e2e

// A cluster node on this one machine: a network namespace and a mount
// namespace of its own, holding the node's runtime and its kubelet, and
// so every container of the node (runc inherits the runtime's
// namespaces). Two nodes on one machine then look to Kubernetes as two
// machines do: each has its own address, its pods on the host's network
// bind the same ports without meeting, and the DaemonSets' hostPath
// volumes (/run/containerd, /var/run/crio, /run/pleg) are the node's own.
//
// Network: the host side is the bridge clusterBridge with clusterHostIP
// (the API server's address for the nodes) and clusterServiceIP, the
// "kubernetes" Service's cluster IP. There is no kube-proxy: the host
// holding the Service's IP on the bridge and the API server listening on
// port 443 is what lets a pod's in-cluster configuration
// (KUBERNETES_SERVICE_HOST, node-problem-detector's) reach the API server.
// Each node is a veth pair from the bridge into its network namespace.
//
// Mounts: the node's mount namespace is a slave of the host's (what the
// host mounts later appears in it; nothing it mounts reaches the host),
// with tmpfs over /var/lib and /var/log (the paths a kubelet writes
// whatever its --root-dir says) and /run (the runtime's shim sockets, as
// on a machine of its own), and bind mounts of the node's own directories
// over the runtime's socket directory and /run/pleg. It is
// kept by a bind mount of its nsfs file under clusterNSDir, so the
// runtime's supervisor and the kubelet enter it with nsenter.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	clusterBridge    = "pleg-e2e-br"
	clusterHostIP    = "10.250.0.1"
	clusterNodeNet   = "10.250.0." // node i (from 0) is .(i+2)
	clusterServiceIP = "10.251.0.1"
	clusterServices  = "10.251.0.0/24"
	clusterNSDir     = "/run/pleg-e2e-nodes"
	clusterNetnsPfx  = "pleg-e2e-"
)

// run runs a command, its output in the error.
// Each is bounded (ip, mount, unshare answer in milliseconds; a minute
// says something is stuck).
func run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupClusterBridge makes the host side of the cluster's network,
// removing what a run that died left.
func setupClusterBridge() error {
	teardownClusterNet()
	for _, args := range [][]string{
		{"link", "add", clusterBridge, "type", "bridge"},
		{"addr", "add", clusterHostIP + "/24", "dev", clusterBridge},
		{"addr", "add", clusterServiceIP + "/32", "dev", clusterBridge},
		{"link", "set", clusterBridge, "up"},
	} {
		if err := run("ip", args...); err != nil {
			return fmt.Errorf("the cluster's bridge: %w", err)
		}
	}
	return nil
}

// teardownClusterNet removes the bridge, every node namespace and the
// namespace files: those of this run, or of one that died.
func teardownClusterNet() error {
	var errs []error
	if ents, err := os.ReadDir(clusterNSDir); err == nil {
		for _, e := range ents {
			p := filepath.Join(clusterNSDir, e.Name())
			exec.Command("umount", p).Run() // not mounted when a setup failed halfway
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
		exec.Command("umount", clusterNSDir).Run()
		os.Remove(clusterNSDir)
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], clusterNetnsPfx) {
				if err := run("ip", "netns", "del", f[0]); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// A veth pair goes with its namespace, but the kernel destroys a
	// namespace asynchronously: delete the host ends now, so that the next
	// cluster can make them again at once.
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(name, "pleg-e2e-v") {
				if err := run("ip", "link", "del", name); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if exec.Command("ip", "link", "show", clusterBridge).Run() == nil {
		if err := run("ip", "link", "del", clusterBridge); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// nodeNS is a node's pair of namespaces.
type nodeNS struct {
	name  string // the node's name
	ip    string
	netns string // its name for ip netns (/run/netns/<netns>)
	mntns string // the bind-mounted nsfs file
	veth  string // the host end of its veth pair
}

// bindMount is a directory of the host mounted over a path in the node.
type bindMount struct{ source, target string }

// newNodeNS makes node i's namespaces: its address, and its mount
// namespace with binds (the sources must exist) and a tmpfs over each
// of tmpfs besides /var/lib, /var/log and /run.
func newNodeNS(i int, name string, binds []bindMount, tmpfs []string) (*nodeNS, error) {
	n := &nodeNS{
		name:  name,
		ip:    clusterNodeNet + strconv.Itoa(i+2),
		netns: clusterNetnsPfx + name,
		mntns: filepath.Join(clusterNSDir, name),
	}
	host, peer := "pleg-e2e-v"+strconv.Itoa(i), "pleg-e2e-p"+strconv.Itoa(i)
	n.veth = host
	steps := [][]string{
		{"netns", "add", n.netns},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", host, "master", clusterBridge, "up"},
		{"link", "set", peer, "netns", n.netns},
		{"-n", n.netns, "link", "set", peer, "name", "eth0"},
		{"-n", n.netns, "addr", "add", n.ip + "/24", "dev", "eth0"},
		{"-n", n.netns, "link", "set", "eth0", "up"},
		{"-n", n.netns, "link", "set", "lo", "up"},
		{"-n", n.netns, "route", "add", "default", "via", clusterHostIP},
	}
	for _, args := range steps {
		if err := run("ip", args...); err != nil {
			return nil, fmt.Errorf("node %s's network: %w", name, err)
		}
	}
	// The nsfs file must be on a private mount to be bind-mounted.
	if err := os.MkdirAll(clusterNSDir, 0o700); err != nil {
		return nil, err
	}
	if !isMountPoint(clusterNSDir) {
		if err := run("mount", "--bind", clusterNSDir, clusterNSDir); err != nil {
			return nil, err
		}
		if err := run("mount", "--make-private", clusterNSDir); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(n.mntns, nil, 0o600); err != nil {
		return nil, err
	}
	script := "set -e\n"
	for _, dir := range append([]string{"/var/lib", "/var/log", "/run"}, tmpfs...) {
		script += "mount -t tmpfs -o mode=0755 pleg-e2e-node " + dir + "\n"
	}
	for _, b := range binds {
		script += fmt.Sprintf("mkdir -p %s\nmount --bind %s %s\n", strconv.Quote(b.target), strconv.Quote(b.source), strconv.Quote(b.target))
	}
	if err := run("unshare", "--mount="+n.mntns, "--propagation", "slave", "/bin/sh", "-c", script); err != nil {
		return nil, fmt.Errorf("node %s's mounts: %w", name, err)
	}
	return n, nil
}

// enter is the command prefix that runs a program in the node.
func (n *nodeNS) enter() []string {
	return []string{"nsenter", "--mount=" + n.mntns, "--net=/run/netns/" + n.netns, "--"}
}

// remove gives the namespaces up: the mount namespace ends once its last
// process is gone, the network namespace (and the veth pair) at once.
func (n *nodeNS) remove() error {
	var errs []error
	if err := run("umount", n.mntns); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(n.mntns); err != nil {
		errs = append(errs, err)
	}
	// The host end first: deleting it deletes the pair at once, where the
	// namespace's destruction (and with it the pair's) is asynchronous.
	if exec.Command("ip", "link", "show", n.veth).Run() == nil {
		if err := run("ip", "link", "del", n.veth); err != nil {
			errs = append(errs, err)
		}
	}
	if err := run("ip", "netns", "del", n.netns); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// isMountPoint reports whether dir is a mount point in this namespace.
func isMountPoint(dir string) bool {
	for _, m := range readMountinfo() {
		if m.point == dir {
			return true
		}
	}
	return false
}

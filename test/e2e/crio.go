package e2e

// The suite's CRI-O: its configuration (every path private, in the env's
// dir), the test images loaded into its storage with skopeo before it
// first starts, and the switch between enable_pod_events true and false
// (setPodEvents). Start, stop, kill and restart go through the same
// supervisor as containerd's (supervisor.go), with crio's command line.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Kinds of runtime an env runs.
const (
	kindContainerd = "containerd"
	kindCRIO       = "crio"
)

// crioConfig is CRI-O 1.36's configuration, found with `crio config` of
// v1.36.3 and trials on this kind of machine:
//
//   - every path CRI-O writes is below the env's dir: storage root and
//     runroot, the version files, namespaces_dir (pinns bind-mounts the
//     pod's namespaces there), the exits and attach socket dirs, runc's
//     state root, the auth dir, the CNI config dir.
//   - clean_shutdown_file = "" and internal_wipe = false: a CRI-O that was
//     SIGKILLed (as the tests do) would otherwise wipe its storage, images
//     included, on the next start, as after a node crash.
//   - cgroup_manager cgroupfs and conmon_cgroup "pod": conmon lives in the
//     pod's cgroup, below the env's cgroup parent.
//   - drop_infra_ctr: a pod whose PID namespace is per container (the
//     kubelet's default, and RunPod's) has no infra container. An infra
//     container asks for oom_score_adj -998, which runc cannot set here
//     (no CAP_SYS_RESOURCE in this sandbox).
//   - runc, not Debian's crun 1.8, which refuses the runtime-spec version
//     CRI-O 1.36 writes ("unknown version specified"), through
//     runcOOMClamp: CRI-O has no restrict_oom_score_adj, and a pod the
//     kubelet gives a negative oom_score_adj (system-node-critical, as the
//     DaemonSet's; Guaranteed) would fail here otherwise.
//   - signature_policy: a private policy accepting every image (no fetch);
//     the images are loaded with skopeo before CRI-O starts.
//   - a loopback-only CNI conflist makes NetworkReady true without touching
//     the host's network (the suite's pods use the node's network).
//   - NRI (a socket in /var/run/nri) and metrics are off.
const crioConfig = `[crio]
root = {{dir}}/root
runroot = {{dir}}/runroot
storage_driver = {{driver}}
log_dir = {{dir}}/pods
version_file = {{dir}}/state/version
version_file_persist = {{dir}}/state/version-persist
clean_shutdown_file = ""
internal_wipe = false

[crio.api]
listen = {{sock}}
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
pinns_path = {{pinns}}
drop_infra_ctr = true
enable_pod_events = {{podEvents}}
namespaces_dir = {{dir}}/ns
container_exits_dir = {{dir}}/exits
container_attach_socket_dir = {{dir}}/attach
decryption_keys_path = {{dir}}/keys
hooks_dir = []
cdi_spec_dirs = []
log_to_journald = false
enable_criu_support = false

[crio.runtime.runtimes.runc]
runtime_path = {{runc}}
runtime_type = "oci"
runtime_root = {{dir}}/runc
monitor_path = {{conmon}}
monitor_cgroup = "pod"

[crio.image]
pause_image = {{pause}}
signature_policy = {{dir}}/policy.json
signature_policy_dir = {{dir}}/policies
namespaced_auth_dir = {{dir}}/auth

[crio.network]
network_dir = {{dir}}/cni/net.d
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
`

// runcOOMClamp is the runtime_path of the suite's CRI-O: runc, after
// raising a negative oomScoreAdj in the bundle's config.json to 0, the
// runtime's own, as containerd's restrict_oom_score_adj does. This machine
// lacks CAP_SYS_RESOURCE, so runc cannot lower a process's oom_score_adj
// ("failed to update /proc/self/oom_score_adj: Permission denied"); on a
// node CRI-O would pass it through unchanged. While <dir>/runtime-hold/<id>
// exists, a call naming container id waits (holdRuntimeCalls): CRI-O then
// waits for its runtime as for a runc that hangs.
const runcOOMClamp = `#!/bin/sh
if [ -d {{hold}} ]; then
	for a in "$@"; do
		case $a in */*) continue ;; esac
		while [ -e {{hold}}/"$a" ]; do sleep 0.1; done
	done
fi
prev=
for a in "$@"; do
	case $prev in --bundle | -b) bundle=$a ;; esac
	case $a in --bundle=*) bundle=${a#--bundle=} ;; esac
	prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	sed -i -E 's/("oomScoreAdj": *)-[0-9]+/\10/g' "$bundle/config.json" || exit 1
fi
exec {{runc}} "$@"
`

const crioPolicy = `{"default":[{"type":"insecureAcceptAnything"}]}` + "\n"

const crioLoopbackCNI = `{"cniVersion":"1.0.0","name":"pleg-e2e-loopback","plugins":[{"type":"loopback"}]}` + "\n"

// crioStorageDriver maps the probed snapshotter to CRI-O's storage driver.
func crioStorageDriver(snapshotter string) string {
	if snapshotter == "overlayfs" {
		return "overlay"
	}
	return "vfs"
}

// writeCRIOConfig writes crio.conf, an empty drop-in dir (so that
// /etc/crio/crio.conf.d plays no part), the signature policy and the CNI
// conflist.
func (e *env) writeCRIOConfig() error {
	conmon, err := exec.LookPath("conmon")
	if err != nil {
		return fmt.Errorf("conmon not found after provisioning: %w", err)
	}
	q := strconv.Quote
	r := strings.NewReplacer(
		"{{dir}}/root", q(filepath.Join(e.dir, "root")),
		"{{dir}}/runroot", q(filepath.Join(e.dir, "runroot")),
		"{{dir}}/pods", q(filepath.Join(e.dir, "pods")),
		"{{dir}}/state/version-persist", q(filepath.Join(e.dir, "state", "version-persist")),
		"{{dir}}/state/version", q(filepath.Join(e.dir, "state", "version")),
		"{{dir}}/ns", q(filepath.Join(e.dir, "ns")),
		"{{dir}}/exits", q(filepath.Join(e.dir, "exits")),
		"{{dir}}/attach", q(filepath.Join(e.dir, "attach")),
		"{{dir}}/keys", q(filepath.Join(e.dir, "keys")),
		"{{dir}}/runc", q(filepath.Join(e.dir, "runc")),
		"{{dir}}/policy.json", q(filepath.Join(e.dir, "policy.json")),
		"{{dir}}/policies", q(filepath.Join(e.dir, "policies")),
		"{{dir}}/auth", q(filepath.Join(e.dir, "auth")),
		"{{dir}}/cni/net.d", q(filepath.Join(e.dir, "cni", "net.d")),
		"{{driver}}", q(crioStorageDriver(e.snapshotter)),
		"{{sock}}", q(e.sock),
		"{{pinns}}", q(filepath.Join(e.binDir, "pinns")),
		"{{podEvents}}", strconv.FormatBool(e.podEvents),
		"{{runc}}", q(filepath.Join(e.dir, "runc-oom-clamp")),
		"{{conmon}}", q(conmon),
		"{{pause}}", q(pauseImage),
	)
	cfg := r.Replace(crioConfig)
	if strings.Contains(cfg, "{{") {
		return fmt.Errorf("unexpanded placeholder in the CRI-O config")
	}
	for _, d := range []string{"logs", "state", "conf.d", "cni/net.d", "auth", "keys", "policies", filepath.Base(filepath.Dir(e.sock))} {
		if err := os.MkdirAll(filepath.Join(e.dir, d), 0o755); err != nil {
			return err
		}
	}
	clamp := strings.NewReplacer("{{runc}}", q(e.runcPath), "{{hold}}", q(e.runtimeHoldDir())).Replace(runcOOMClamp)
	if err := os.WriteFile(filepath.Join(e.dir, "runc-oom-clamp"), []byte(clamp), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.dir, "policy.json"), []byte(crioPolicy), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.dir, "cni", "net.d", "10-loopback.conflist"), []byte(crioLoopbackCNI), 0o644); err != nil {
		return err
	}
	return os.WriteFile(e.configPath, []byte(cfg), 0o644)
}

// crioArgv is the command line the supervisor starts CRI-O with.
func (e *env) crioArgv() []string {
	return []string{filepath.Join(e.binDir, "crio"), "--config", e.configPath, "--config-dir", filepath.Join(e.dir, "conf.d")}
}

// loadCRIOImages copies the pause and workload images, and the env's
// preload, into CRI-O's storage with skopeo, before CRI-O first starts (one
// archive per image: skopeo cannot choose between two images tagged e2e in
// one archive). skopeo leaves the storage's overlay dir bind-mounted on
// itself: unmounted here, which is why it cannot run beside a CRI-O that
// has containers.
func (e *env) loadCRIOImages() error {
	root, runroot := filepath.Join(e.dir, "root"), filepath.Join(e.dir, "runroot")
	driver := crioStorageDriver(e.snapshotter)
	images := filepath.Dir(e.imageArchive)
	for _, img := range append([]ociArchive{
		{filepath.Join(images, "pause.tar"), pauseImage},
		{filepath.Join(images, "workload.tar"), workloadImage},
	}, e.preload...) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "skopeo", "copy", "--quiet", "--policy", filepath.Join(e.dir, "policy.json"),
			"oci-archive:"+img.path, fmt.Sprintf("containers-storage:[%s@%s+%s]%s", driver, root, runroot, img.ref))
		cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(e.dir, "tmp"))
		os.MkdirAll(filepath.Join(e.dir, "tmp"), 0o755)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("skopeo copy %s: %v\n%s", img.path, err, out)
		}
	}
	if _, err := unmountUnder(root); err != nil {
		return fmt.Errorf("unmounting what skopeo left under %s: %w", root, err)
	}
	return nil
}

// startCRIO writes the configuration, loads the images on the first start
// and starts CRI-O, waiting until CRI answers and both images are listed.
func (e *env) startCRIO() error {
	if err := e.writeCRIOConfig(); err != nil {
		return err
	}
	if !fileExists(filepath.Join(e.dir, "root", driverImagesDir(e.snapshotter))) {
		if err := e.loadCRIOImages(); err != nil {
			return err
		}
	}
	if err := e.startContainerd(); err != nil {
		return err
	}
	var err error
	if e.cri == nil {
		if e.cri, err = dialCRI(e.sock); err != nil {
			return err
		}
	}
	if err := e.waitCRI(30 * time.Second); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), criTimeout)
	defer cancel()
	for _, img := range []string{pauseImage, workloadImage} {
		resp, err := e.cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
		if err != nil {
			return fmt.Errorf("CRI ImageStatus %s: %w", img, err)
		}
		if resp.Image == nil {
			return fmt.Errorf("image %s not in CRI-O's storage after skopeo loaded it", img)
		}
	}
	return nil
}

// driverImagesDir is the dir of the storage's image store, present once
// skopeo has loaded an image.
func driverImagesDir(snapshotter string) string {
	return crioStorageDriver(snapshotter) + "-images"
}

// setPodEvents makes the suite's CRI-O run with enable_pod_events = on for
// the rest of t (restarting it gracefully when the setting changes) and
// puts the setting back when t ends. Pods and containers survive the
// restart.
func setPodEvents(t testing.TB, on bool) {
	t.Helper()
	e := suite
	if e.kind != kindCRIO {
		t.Fatalf("setPodEvents on %s: only CRI-O has enable_pod_events", e.name())
	}
	if e.podEvents == on {
		return
	}
	switchTo := func(v bool) error {
		if _, err := e.sup.call("stop 10000", 30*time.Second); err != nil {
			return err
		}
		e.podEvents = v
		return e.restart()
	}
	if err := switchTo(on); err != nil {
		t.Fatalf("restarting CRI-O with enable_pod_events = %v: %v", on, err)
	}
	t.Logf("CRI-O restarted with enable_pod_events = %v", on)
	t.Cleanup(func() {
		if err := switchTo(!on); err != nil {
			t.Errorf("cleanup: restarting CRI-O with enable_pod_events = %v: %v", !on, err)
		}
	})
}

var errNotContainerd = errors.New("needs containerd")

// runtimeHoldDir holds a file per container whose runtime calls wait
// (holdRuntimeCalls).
func (e *env) runtimeHoldDir() string { return filepath.Join(e.dir, "runtime-hold") }

// holdRuntimeCalls makes every runtime (runc) call of CRI-O naming one of
// ids wait until the function it returns is called (a cleanup calls it
// too): what a hung runc does to CRI-O, which holds the container's lock
// meanwhile.
func (e *env) holdRuntimeCalls(t testing.TB, ids ...string) (release func()) {
	t.Helper()
	dir := e.runtimeHoldDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := os.WriteFile(filepath.Join(dir, id), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			for _, id := range ids {
				if err := os.Remove(filepath.Join(dir, id)); err != nil {
					t.Errorf("releasing the runtime calls of %s: %v", id, err)
				}
			}
		})
	}
	t.Cleanup(release)
	return release
}

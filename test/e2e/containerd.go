package e2e

// The suite's containerds: their configuration (version 2 for 1.x, 3 for
// 2.x), start, CRI readiness and image import; which one a test talks to
// (forEachRuntime, useRuntime, useEnv); stopping, killing and restarting
// it under a test (KillContainerd, StopContainerd, StartContainerd,
// RestartContainerd).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerdConfig is the containerd 2.x (config version 3) configuration.
// Every path is inside the private dir. The keys that matter, found with
// `containerd config default` of v2.2.9:
//
//   - restrict_oom_score_adj lives directly in
//     [plugins.'io.containerd.cri.v1.runtime'] (not under runtimes.runc).
//     Without it runc cannot set the sandbox's oom_score_adj on machines
//     lacking CAP_SYS_RESOURCE and fails with "can't get final child's PID
//     from pipe: EOF".
//   - the sandbox (pause) image is [plugins.'io.containerd.cri.v1.images'.
//     pinned_images] sandbox (1.x had sandbox_image in the cri plugin).
//   - the CRI snapshotter is [plugins.'io.containerd.cri.v1.images']
//     snapshotter; `ctr images import` must unpack into the same one.
//   - disabling io.containerd.image-verifier.v1.bindir breaks the transfer
//     service and with it the whole CRI plugin ("no plugins registered for
//     io.containerd.image-verifier.v1"); point its bin_dir into our dir.
//   - imports = [] keeps /etc/containerd/conf.d out; NRI (a socket in
//     /var/run/nri), opt (/opt/containerd) and the restart monitor are
//     disabled as the suite needs none of them.
//   - runc's state root (options.Root) is private, so `runc list` of other
//     containerds never shows ours and vice versa.
//   - [grpc] gid is the socket's group (mode 0660), applied each time
//     containerd creates the socket: env.socketGID, root's (0) unless a
//     test sets it (the same key in config version 2).
const containerdConfig = `version = 3
root = {{dir}}/root
state = {{dir}}/state
temp = {{dir}}/tmp
imports = []
disabled_plugins = ['io.containerd.internal.v1.opt', 'io.containerd.nri.v1.nri', 'io.containerd.monitor.container.v1.restart']

[grpc]
  address = {{sock}}
  gid = {{sockGID}}

[plugins]
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = {{dir}}/image-verifiers

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = {{snapshotter}}
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {{pause}}

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        sandboxer = 'podsandbox'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {{runc}}
          Root = {{dir}}/runc
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{{dir}}/cni/bin]
      conf_dir = {{dir}}/cni/net.d

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`

// containerdConfigV2 is the containerd 1.6/1.7 (config version 2)
// configuration, with the same private paths. Everything of the CRI plugin
// is under [plugins."io.containerd.grpc.v1.cri"]: sandbox_image and
// restrict_oom_score_adj (required here, as for 2.x) directly in it, the
// snapshotter and runtimes under .containerd, CNI under .cni (bin_dir, one
// dir). 1.x has no image verifier plugin; the restart monitor is
// io.containerd.internal.v1.restart (1.6 has no NRI: disabling a plugin
// that does not exist is harmless).
const containerdConfigV2 = `version = 2
root = {{dir}}/root
state = {{dir}}/state
temp = {{dir}}/tmp
imports = []
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri", "io.containerd.internal.v1.restart", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = {{sock}}
  gid = {{sockGID}}

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = {{pause}}
    restrict_oom_score_adj = true
    enable_cdi = false
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = {{snapshotter}}
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = {{runc}}
          Root = {{dir}}/runc
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {{dir}}/cni/bin
      conf_dir = {{dir}}/cni/net.d
`

// configTemplate is the config of e's containerd version.
func (e *env) configTemplate() string {
	if strings.HasPrefix(e.version, "1.") {
		return containerdConfigV2
	}
	return containerdConfig
}

// hasEvents reports whether e's runtime serves GetContainerEvents
// (containerd 1.7 and later; 1.6 answers Unimplemented; CRI-O with
// enable_pod_events = true, while with false its stream ends at once).
func (e *env) hasEvents() bool {
	if e.kind == kindCRIO {
		return e.podEvents
	}
	return !strings.HasPrefix(e.version, "1.6.")
}

// sharedEvents reports whether e's containerd feeds every
// GetContainerEvents subscriber from one shared channel, so that with
// several subscribers each gets only part of the events (1.7:
// containerd/containerd#7318; 2.x broadcasts).
func (e *env) sharedEvents() bool {
	return e.kind == kindContainerd && strings.HasPrefix(e.version, "1.7.")
}

// name is the subtest name of e's runtime, e.g. "containerd-1.7.35" or
// "crio-1.36.3".
func (e *env) name() string { return e.kind + "-" + e.version }

// forEachRuntime runs f as a subtest per runtime of this run, named by
// version (TestX/containerd-1.7.35), with suite set to that runtime.
func forEachRuntime(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	for _, e := range runtimes {
		t.Run(e.name(), func(t *testing.T) {
			useEnv(t, e)
			f(t, e)
		})
	}
}

// useRuntime points suite at the containerd whose version starts with
// prefix for the rest of t, and skips t (saying why) when this run has
// none, i.e. when PLEG_E2E_RUNTIMES narrowed it away.
func useRuntime(t *testing.T, prefix string) *env {
	t.Helper()
	for _, e := range runtimes {
		if e.kind == kindContainerd && strings.HasPrefix(e.version, prefix) {
			useEnv(t, e)
			return e
		}
	}
	t.Skipf("needs containerd %s, not in this run (%s=%q)", prefix, envRuntimes, os.Getenv(envRuntimes))
	return nil
}

// useEnv sets suite to e until t and its cleanups are done (the cleanup
// is registered first, so it runs last).
func useEnv(t testing.TB, e *env) {
	prev := suite
	suite = e
	t.Cleanup(func() { suite = prev })
}

func (e *env) writeConfig() error {
	q := strconv.Quote // TOML basic strings accept Go's quoting of ASCII paths
	r := strings.NewReplacer(
		"{{dir}}/root", q(filepath.Join(e.dir, "root")),
		"{{dir}}/state", q(filepath.Join(e.dir, "state")),
		"{{dir}}/tmp", q(filepath.Join(e.dir, "tmp")),
		"{{dir}}/image-verifiers", q(filepath.Join(e.dir, "image-verifiers")),
		"{{dir}}/runc", q(filepath.Join(e.dir, "runc")),
		"{{dir}}/cni/bin", q(filepath.Join(e.dir, "cni", "bin")),
		"{{dir}}/cni/net.d", q(filepath.Join(e.dir, "cni", "net.d")),
		"{{sock}}", q(e.sock),
		"{{snapshotter}}", q(e.snapshotter),
		"{{pause}}", q(pauseImage),
		"{{runc}}", q(e.runcPath),
		"{{sockGID}}", strconv.Itoa(e.socketGID),
	)
	cfg := r.Replace(e.configTemplate())
	if strings.Contains(cfg, "{{") {
		return fmt.Errorf("unexpanded placeholder in containerd config")
	}
	for _, d := range []string{"tmp", "logs", "image-verifiers"} {
		if err := os.MkdirAll(filepath.Join(e.dir, d), 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(e.configPath, []byte(cfg), 0o644)
}

// startContainerd starts containerd (through the supervisor).
func (e *env) startContainerd() error {
	if _, err := e.sup.call("start", 10*time.Second); err != nil {
		return err
	}
	return nil
}

// waitCRI waits until the CRI plugin answers Version and ListPodSandbox
// (the latter fails until the plugin has finished its recovery), or
// containerd exits, or timeout.
func (e *env) waitCRI(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	e.cri.conn.ResetConnectBackoff()
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := e.cri.rt.Version(ctx, &runtimeapi.VersionRequest{})
		if err == nil {
			_, err = e.cri.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		if st, serr := e.sup.call("status", 5*time.Second); serr == nil && strings.HasPrefix(st, "stopped") {
			return fmt.Errorf("%s exited (%s) before CRI answered; see %s", e.kind, strings.TrimPrefix(st, "stopped "), e.logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("CRI on %s did not answer within %v: %v", e.sock, timeout, lastErr)
}

// importImages imports the suite's OCI archive (pause and workload
// images) into e's containerd.
func (e *env) importImages() error {
	return e.importArchive(e.imageArchive, pauseImage, workloadImage)
}

// importArchive imports an OCI archive with ctr into the CRI namespace,
// unpacked for the CRI snapshotter, and waits until CRI sees every image
// of refs.
func (e *env) importArchive(archive string, refs ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.kind != kindContainerd {
		// CRI-O's images are copied into its storage before it starts
		// (env.preload): check that they were.
		for _, img := range refs {
			resp, err := e.cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
			if err != nil {
				return fmt.Errorf("CRI ImageStatus %s: %w", img, err)
			}
			if resp.Image == nil {
				return fmt.Errorf("importing %s into %s: %w (give the archive to env.preload before it starts)", archive, e.name(), errNotContainerd)
			}
		}
		return nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(e.binDir, "ctr"), "-n", criNamespace, "-a", e.sock,
		"images", "import", "--snapshotter", e.snapshotter, archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import %s: %v\n%s", archive, err, out)
	}
	// The CRI image store learns about imported images asynchronously, from
	// containerd's image events: poll.
	deadline := time.Now().Add(15 * time.Second)
	for _, img := range refs {
		for {
			resp, err := e.cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
			if err != nil {
				return fmt.Errorf("CRI ImageStatus %s: %w", img, err)
			}
			if resp.Image != nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("image %s not visible through CRI 15s after the import", img)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// tagImage gives the image src of e's containerd (CRI namespace) the
// reference dst too (ctr images tag: the same image under a second name),
// and waits until CRI sees dst.
func (e *env) tagImage(src, dst string) error {
	if e.kind != kindContainerd {
		return fmt.Errorf("tagging %s as %s in %s: %w (give CRI-O the archive under dst in env.preload)", src, dst, e.name(), errNotContainerd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.binDir, "ctr"), "-n", criNamespace, "-a", e.sock, "images", "tag", src, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images tag %s %s: %v\n%s", src, dst, err, out)
	}
	for {
		resp, err := e.cri.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: dst}})
		if err != nil {
			return fmt.Errorf("CRI ImageStatus %s: %w", dst, err)
		}
		if resp.Image != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("image %s not visible through CRI a minute after ctr images tag", dst)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KillContainerd SIGKILLs the suite's runtime (containerd, or CRI-O: these
// helpers predate it and act on either) and waits until it is gone. Shims
// (conmons) and containers keep running, as on a real node. If the test does not start
// containerd again, a cleanup does, so later tests find it running.
func KillContainerd(t testing.TB) {
	t.Helper()
	stopContainerd(t, "kill")
}

// StopContainerd stops containerd gracefully (SIGTERM, SIGKILL after 10s).
// Like KillContainerd, it leaves shims and containers running.
func StopContainerd(t testing.TB) {
	t.Helper()
	stopContainerd(t, "stop 10000")
}

func stopContainerd(t testing.TB, how string) {
	t.Helper()
	e := suite
	r, err := e.sup.call(how, 30*time.Second)
	if err != nil {
		t.Fatalf("stopping %s: %v", e.name(), err)
	}
	t.Logf("%s stopped: %s", e.name(), r)
	t.Cleanup(func() {
		if !e.sup.running() {
			t.Logf("cleanup: %s was left stopped; starting it again", e.name())
			if err := e.restart(); err != nil {
				t.Errorf("cleanup: starting %s: %v", e.name(), err)
			}
		}
	})
}

// StartContainerd starts containerd again on the same root, state and
// socket, and waits until CRI answers (and has recovered its pods).
func StartContainerd(t testing.TB) {
	t.Helper()
	start := time.Now()
	if err := suite.restart(); err != nil {
		t.Fatalf("starting %s: %v", suite.name(), err)
	}
	t.Logf("%s started, CRI ready after %v", suite.name(), time.Since(start).Round(time.Millisecond))
}

// RestartContainerd kills containerd (SIGKILL) and starts it again.
func RestartContainerd(t testing.TB) {
	t.Helper()
	KillContainerd(t)
	StartContainerd(t)
}

func (e *env) restart() error {
	if e.kind == kindCRIO {
		return e.startCRIO()
	}
	if err := e.startContainerd(); err != nil {
		return err
	}
	return e.waitCRI(30 * time.Second)
}

// ContainerdRunning reports whether the suite's containerd is running.
func ContainerdRunning() bool { return suite.sup.running() }

// CRIEndpoint is the CRI endpoint of the suite's containerd, for clients
// under test (e.g. the PLEG's own CRI runtime): "unix:///tmp/pleg-e2e-*/containerd.sock".
func CRIEndpoint() string { return "unix://" + suite.sock }

// SuiteDir is the private temp dir everything of the suite lives in.
func SuiteDir() string { return suite.dir }

package e2e

// The real kubelet v1.37.2, for tests that run pleg beside it.
//
// startKubelet gives a test a kubelet of its own: standalone (no API
// server), reading static pods from a directory, on a private containerd
// 2.2.9 (startKubeletOn: or another runtime of allRuntimes, CRI-O
// 1.36.3 for TestKubeletSideBySideCRIO) that nothing else uses (a standalone kubelet stops and removes
// every runtime pod it did not create, so it must not share a containerd
// with the other tests). The binary is built by test/kubelet/build.sh
// into <cache>/kubelet during provisioning.
//
// Ownership and cleanup: the kubelet's containerd is a normal env (its own
// dir, supervisor, cgroup parent). The kubelet runs from the symlink
// <env dir>/bin/kubelet, so the env's supervisor, the final checkClean and
// the next run's sweepStale count it as ours (referencesDir) and kill it
// when the test binary dies. It runs in its own mount namespace (unshare
// -m, private propagation) with tmpfs over /var/lib and /var/log, the host
// paths it uses whatever --root-dir says (it empties
// /var/lib/kubelet/device-plugins at start and writes /var/log/containers
// symlinks); its bind mount of the root dir stays in that namespace and
// dies with it. Its pods' cgroups are containerd's default /k8s.io/<id>
// (with cgroupsPerQOS off the kubelet gives the runtime no cgroup parent):
// runc removes them with the containers, the supervisor removes those of
// containers whose runc state is left (runcCgroupPaths), and stop checks
// that none is left.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/internal/testport"
)

const (
	// kubeletRuntime is the containerd version the kubelet runs on.
	kubeletRuntime = "2.2.9"
	// crioKubeletRuntime is the CRI-O the kubelet runs on in the CRI-O tests.
	crioKubeletRuntime = "crio-1.36.3"
	// kubeletNode is the kubelet's node name; static pods are named
	// <manifest name>-<node>.
	kubeletNode = "pleg-e2e-node"
	// kubeletNamespace is the namespace of the static pods AddPod writes.
	kubeletNamespace = "default"
)

// kubeletHostPaths are host paths the kubelet writes whatever its
// --root-dir: its mount namespace hides them, and checkClean verifies
// that none of them appeared on the host.
var kubeletHostPaths = []string{"/var/lib/kubelet", "/var/log/containers", "/var/log/pods"}

// kubelet is a running real kubelet and its private containerd.
type kubelet struct {
	env          *env
	dir          string // <env dir>/kubelet
	manifests    string // the static pod directory
	logPath      string // the kubelet's stderr (klog, -v=4)
	port         int    // HTTPS: /pods, /metrics
	healthzPort  int    // HTTP: /healthz
	releasePorts func() // gives port and healthzPort back to testport
	client       *http.Client

	cmd  *exec.Cmd
	done chan struct{} // closed when the kubelet exited
	mu   sync.Mutex
	exit error

	logMu   sync.Mutex
	logOff  int64
	logPart []byte
	lines   []kubeletLine

	hostPathsBefore map[string]bool
	featureGates    []string // turned on in its configuration (featureGates)

	// A cluster node's kubelet (startClusterKubelet) registers to an API
	// server with kubeconfig as node, on ip, in the namespaces ns enters;
	// a standalone one has none of these.
	node       string
	ip         string
	kubeconfig string
	ns         *nodeNS
}

// nodeName is the kubelet's node name.
func (k *kubelet) nodeName() string {
	if k.node != "" {
		return k.node
	}
	return kubeletNode
}

// addr is the address the kubelet serves on.
func (k *kubelet) addr() string {
	if k.ip != "" {
		return k.ip
	}
	return "127.0.0.1"
}

// kubeletLine is a PLEG line of the kubelet's log.
type kubeletLine struct {
	At   time.Time
	Kind string // "event": SyncLoop (PLEG) event (for a known pod or ignored); "generic": a GenericPLEG transition
	// Pod is "namespace/name" for events of known pods.
	Pod         string
	PodUID      string
	ContainerID string
	Type        string // event type ("event" lines)
	Old, New    string // states ("generic" lines): running, exited, unknown, non-existent
	Raw         string
}

// startKubelet starts a containerd 2.2.9 of its own and a standalone
// kubelet on it, and waits until the kubelet's healthz answers. A cleanup
// stops both (see kubelet.stop). It skips t when this run does not
// include containerd 2.2 (PLEG_E2E_RUNTIMES). featureGates (e.g. "EventedPLEG") are
// turned on in its configuration.
//
// suite is not changed: tests that run pleg or CRI helpers against the
// kubelet's containerd call useEnv(t, k.env) (build the pleg binary
// first, with PlegBinary, so it lands in the long-lived suite dir).
func startKubelet(t testing.TB, featureGates ...string) *kubelet {
	t.Helper()
	return startKubeletOn(t, kubeletRuntime, featureGates...)
}

// startKubeletOn is startKubelet on a runtime of its own named by an
// allRuntimes item (a containerd version, or crio-<version>); it skips t
// when this run does not include that runtime.
func startKubeletOn(t testing.TB, item string, featureGates ...string) *kubelet {
	t.Helper()
	return startKubeletWith(t, item, nil, featureGates...)
}

// startKubeletWith is startKubeletOn, calling before (when set) on the
// runtime's env before the runtime first starts (e.g. to preload images
// into CRI-O's storage).
func startKubeletWith(t testing.TB, item string, before func(*env) error, featureGates ...string) *kubelet {
	t.Helper()
	if baseEnv == nil || baseEnv.kubeletBin == "" {
		t.Fatal("kubelet not provisioned")
	}
	requireRuntimeItem(t, item)
	start := time.Now()
	k := newKubelet()
	k.featureGates = featureGates
	for _, p := range kubeletHostPaths {
		k.hostPathsBefore[p] = fileExists(p)
	}
	e := k.startRuntime(t, item, envOpts{before: before})
	if err := k.start(); err != nil {
		t.Fatalf("starting the kubelet: %v\n%s", err, k.logTail(40))
	}
	t.Logf("kubelet on %s (%s) healthy after %v; log %s", k.base(), e.name(), time.Since(start).Round(time.Millisecond), k.logPath)
	return k
}

// newKubelet is a kubelet not started yet.
func newKubelet() *kubelet {
	return &kubelet{done: make(chan struct{}), hostPathsBefore: map[string]bool{}}
}

// startRuntime starts the kubelet's runtime (an allRuntimes item) with
// o's hooks and makes it the kubelet's: t's cleanup stops the kubelet and
// then tears the runtime down (kubelet.stop), also when the runtime failed
// to start, which fails t.
func (k *kubelet) startRuntime(t testing.TB, item string, o envOpts) *env {
	t.Helper()
	e, err := startEnvOpts(baseEnv, item, o)
	if e != nil {
		k.env = e
		e.kubelet = k
		t.Cleanup(func() { k.stop(t) })
	}
	if err != nil {
		t.Fatalf("starting the kubelet's runtime %s: %v", runtimeName(item), err)
	}
	return e
}

// kubeletConfig is the KubeletConfiguration; every key is explained in
// ../../../shared/spec/ecosystem.md and test/e2e/README.md.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {{manifests}}
fileCheckFrequency: 1s
containerRuntimeEndpoint: {{endpoint}}
cgroupDriver: cgroupfs
cgroupRoot: {{cgroupRoot}}
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
address: {{address}}
port: {{port}}
healthzBindAddress: {{address}}
healthzPort: {{healthzPort}}
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: {{podLogs}}
volumePluginDir: {{volumePlugins}}
`

func (k *kubelet) start() error {
	e := k.env
	k.dir = filepath.Join(e.dir, "kubelet")
	k.manifests = filepath.Join(k.dir, "manifests")
	k.logPath = filepath.Join(k.dir, "kubelet.log")
	for _, d := range []string{k.manifests, filepath.Join(k.dir, "root"), filepath.Join(k.dir, "pki"),
		filepath.Join(k.dir, "pod-logs"), filepath.Join(k.dir, "volume-plugins"), filepath.Join(e.dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	bin := filepath.Join(e.dir, "bin", "kubelet")
	if err := os.Symlink(baseEnv.kubeletBin, bin); err != nil {
		return err
	}
	ports, release, err := testport.Reserve(2)
	if err != nil {
		return err
	}
	k.port, k.healthzPort, k.releasePorts = ports[0], ports[1], release
	q := strconv.Quote
	cfg := strings.NewReplacer(
		"{{manifests}}", q(k.manifests),
		"{{endpoint}}", q("unix://"+e.sock),
		"{{cgroupRoot}}", q(e.cgroupParent),
		"{{address}}", k.addr(),
		"{{port}}", strconv.Itoa(k.port),
		"{{healthzPort}}", strconv.Itoa(k.healthzPort),
		"{{podLogs}}", q(filepath.Join(k.dir, "pod-logs")),
		"{{volumePlugins}}", q(filepath.Join(k.dir, "volume-plugins")),
	).Replace(kubeletConfig)
	if len(k.featureGates) > 0 {
		cfg += "featureGates:\n"
		for _, g := range k.featureGates {
			cfg += "  " + g + ": true\n"
		}
	}
	cfgPath := filepath.Join(k.dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	logFile, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// The mount namespace: private tmpfs over the host paths the kubelet
	// uses whatever --root-dir says, then exec (same pid) the kubelet.
	script := `set -e
mount -t tmpfs -o mode=0755 pleg-e2e-kubelet /var/lib
mount -t tmpfs -o mode=0755 pleg-e2e-kubelet /var/log
`
	if e.kind == kindCRIO {
		// The kubelet limits every container's huge pages (to 0) for each
		// size in /sys/kernel/mm/hugepages; CRI-O passes the limits on
		// when the kernel has the hugetlb controller (/proc/cgroups), and
		// runc then fails on this machine, whose cgroup v1 has no hugetlb
		// hierarchy mounted ("cannot set hugetlb limit"; containerd drops
		// them). An empty dir there, in the kubelet's namespace only: no
		// sizes, no limits.
		script += "mount -t tmpfs -o mode=0755 pleg-e2e-kubelet /sys/kernel/mm/hugepages\n"
	}
	script += `exec "$@"`
	args := []string{"--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh",
		bin, "--config", cfgPath, "--root-dir", filepath.Join(k.dir, "root"), "--cert-dir", filepath.Join(k.dir, "pki"),
		"--hostname-override", k.nodeName(), "--v", "4"}
	k.cmd = exec.Command("unshare", args...)
	if k.ns != nil {
		// A cluster node: the node's namespaces have the tmpfs mounts
		// already, and the runtime runs in them too.
		args = append(k.ns.enter(), bin, "--config", cfgPath, "--root-dir", filepath.Join(k.dir, "root"), "--cert-dir", filepath.Join(k.dir, "pki"),
			"--hostname-override", k.nodeName(), "--node-ip", k.ip, "--kubeconfig", k.kubeconfig, "--v", "4")
		k.cmd = exec.Command(args[0], args[1:]...)
	}
	k.cmd.Dir = k.dir
	k.cmd.Stdout = logFile
	k.cmd.Stderr = logFile
	// Its own process group, so a ^C in the terminal reaches the test
	// binary (which tears down in order) rather than the kubelet.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		return fmt.Errorf("starting the kubelet: %w", err)
	}
	go func() {
		err := k.cmd.Wait()
		k.mu.Lock()
		k.exit = err
		k.mu.Unlock()
		close(k.done)
	}()
	k.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The kubelet serves a self-signed certificate from its cert dir.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if k.exited() {
			return fmt.Errorf("the kubelet exited: %v; see %s", k.exitErr(), k.logPath)
		}
		code, body, err := k.healthz()
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("healthz not ok within 90s: %d %q %v", code, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b, _ := os.ReadFile(k.logPath); bytes.Contains(b, []byte("Using lenient decoding as strict decoding failed")) {
		return fmt.Errorf("the kubelet did not understand its configuration (lenient decoding); see %s", k.logPath)
	}
	return nil
}

func (k *kubelet) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

func (k *kubelet) exitErr() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.exit
}

// base is the kubelet's HTTPS address.
func (k *kubelet) base() string { return "https://" + net.JoinHostPort(k.addr(), strconv.Itoa(k.port)) }

// CRIEndpoint is the endpoint of the kubelet's containerd, for pleg.
func (k *kubelet) CRIEndpoint() string { return "unix://" + k.env.sock }

// Env is the kubelet's containerd env: useEnv(t, k.Env()) points the CRI
// helpers (RuntimeClient, ContainerStatus, RestartContainerd, ...) and
// CRIEndpoint at it.
func (k *kubelet) Env() *env { return k.env }

func (k *kubelet) healthz() (int, string, error) {
	resp, err := k.client.Get("http://" + net.JoinHostPort(k.addr(), strconv.Itoa(k.healthzPort)) + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Healthz returns the kubelet's /healthz status code and body.
func (k *kubelet) Healthz(t testing.TB) (int, string) {
	t.Helper()
	code, body, err := k.healthz()
	if err != nil {
		t.Fatalf("kubelet /healthz: %v", err)
	}
	return code, body
}

// get fetches path from the kubelet's HTTPS port.
func (k *kubelet) get(path string) ([]byte, error) { return getOK(k.client, k.base()+path) }

// ---------------------------------------------------------------------------
// Static pods.

// StaticPod is a static pod AddPod writes: host network, the suite's
// workload image (never pulled), a short grace period.
type StaticPod struct {
	Name          string // manifest name; the pod is <Name>-<node>
	RestartPolicy string // Always (default), OnFailure, Never
	Containers    []StaticContainer
}

// StaticContainer is one container of a StaticPod: the workload image
// with Args (see images/workload: run, sleep <d>, exit <code>).
type StaticContainer struct {
	Name string
	Args []string
}

// AddPod writes p's manifest into the static pod directory and returns
// the pod's full name ("<name>-<node>"), as /pods and the runtime's
// labels show it.
func (k *kubelet) AddPod(t testing.TB, p StaticPod) string {
	t.Helper()
	type container struct {
		Name            string   `json:"name"`
		Image           string   `json:"image"`
		ImagePullPolicy string   `json:"imagePullPolicy"`
		Args            []string `json:"args,omitempty"`
	}
	spec := struct {
		HostNetwork                   bool        `json:"hostNetwork"`
		RestartPolicy                 string      `json:"restartPolicy,omitempty"`
		TerminationGracePeriodSeconds int         `json:"terminationGracePeriodSeconds"`
		Containers                    []container `json:"containers"`
	}{HostNetwork: true, RestartPolicy: p.RestartPolicy, TerminationGracePeriodSeconds: 2}
	for _, c := range p.Containers {
		spec.Containers = append(spec.Containers, container{Name: c.Name, Image: workloadImage, ImagePullPolicy: "Never", Args: c.Args})
	}
	m := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": p.Name, "namespace": kubeletNamespace},
		"spec":       spec,
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	k.AddManifest(t, p.Name, b)
	return p.Name + "-" + kubeletNode
}

// ImportImage imports an OCI archive into the kubelet's containerd and
// waits until CRI sees each of refs (static pods then use them with
// imagePullPolicy: Never).
func (k *kubelet) ImportImage(t testing.TB, archive string, refs ...string) {
	t.Helper()
	if err := k.env.importArchive(archive, refs...); err != nil {
		t.Fatal(err)
	}
}

// AddManifest writes a static pod manifest (YAML or JSON) named name into
// the static pod directory, atomically (the kubelet never reads half a
// file).
func (k *kubelet) AddManifest(t testing.TB, name string, manifest []byte) {
	t.Helper()
	tmp := filepath.Join(k.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.manifests, name+".json")); err != nil {
		t.Fatal(err)
	}
}

// RemoveManifest removes the manifest AddPod/AddManifest wrote as name;
// the kubelet then stops the pod.
func (k *kubelet) RemoveManifest(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(k.manifests, name+".json")); err != nil {
		t.Fatal(err)
	}
}

// kubePod is a pod of the kubelet's /pods (the fields of core/v1 Pod the
// tests read; pleg's module does not depend on k8s.io/api).
type kubePod struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Phase             string            `json:"phase"`
		Conditions        []kubeCondition   `json:"conditions"`
		ContainerStatuses []kubeContainerSt `json:"containerStatuses"`
	} `json:"status"`
}

type kubeCondition struct {
	Type   string `json:"type"`
	Status string `json:"status"`
}

// kubeContainerSt is a core/v1 ContainerStatus.
type kubeContainerSt struct {
	Name         string       `json:"name"`
	ContainerID  string       `json:"containerID"` // "containerd://<id>"
	Ready        bool         `json:"ready"`
	RestartCount int32        `json:"restartCount"`
	State        kubeCtrState `json:"state"`
	LastState    kubeCtrState `json:"lastState"`
	Started      *bool        `json:"started"`
	Image        string       `json:"image"`
}

// kubeCtrState is a core/v1 ContainerState.
type kubeCtrState struct {
	Waiting *struct {
		Reason string `json:"reason"`
	} `json:"waiting"`
	Running *struct {
		StartedAt time.Time `json:"startedAt"`
	} `json:"running"`
	Terminated *struct {
		ExitCode    int32     `json:"exitCode"`
		Reason      string    `json:"reason"`
		ContainerID string    `json:"containerID"`
		FinishedAt  time.Time `json:"finishedAt"`
	} `json:"terminated"`
}

// runtimeID strips the runtime prefix of a container ID of /pods.
func runtimeID(s string) string {
	if _, id, ok := strings.Cut(s, "://"); ok {
		return id
	}
	return s
}

// ready reports whether the pod's Ready condition is True (the kubelet's
// view, probes included).
func (p kubePod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// container returns the status of the container named name.
func (p kubePod) container(name string) (kubeContainerSt, bool) {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == name {
			return c, true
		}
	}
	return kubeContainerSt{}, false
}

// Pods returns the kubelet's /pods.
func (k *kubelet) Pods() ([]kubePod, error) {
	b, err := k.get("/pods")
	if err != nil {
		return nil, err
	}
	var list struct {
		Kind  string    `json:"kind"`
		Items []kubePod `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("/pods: %v: %.200s", err, b)
	}
	if list.Kind != "PodList" {
		return nil, fmt.Errorf("/pods: kind %q, want PodList", list.Kind)
	}
	return list.Items, nil
}

// Pod returns the pod of /pods named name (full name), and whether it is
// there.
func (k *kubelet) Pod(t testing.TB, name string) (kubePod, bool) {
	t.Helper()
	pods, err := k.Pods()
	if err != nil {
		t.Fatalf("kubelet: %v", err)
	}
	for _, p := range pods {
		if p.Metadata.Name == name {
			return p, true
		}
	}
	return kubePod{}, false
}

// WaitPod polls /pods until the pod named name is there and cond accepts
// it (nil cond: present), and returns it; it fails t after timeout.
func (k *kubelet) WaitPod(t testing.TB, name string, timeout time.Duration, cond func(kubePod) error) kubePod {
	t.Helper()
	var got kubePod
	eventually(t, timeout, "kubelet /pods: pod "+name, func() error {
		if k.exited() {
			t.Fatalf("the kubelet exited: %v\n%s", k.exitErr(), k.logTail(40))
		}
		pods, err := k.Pods()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.Metadata.Name == name {
				got = p
				if cond == nil {
					return nil
				}
				return cond(p)
			}
		}
		return errors.New("not listed")
	})
	return got
}

// WaitPodGone polls /pods until no pod is named name.
func (k *kubelet) WaitPodGone(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "kubelet /pods: pod "+name+" gone", func() error {
		if _, ok := k.Pod(t, name); ok {
			return errors.New("still listed")
		}
		return nil
	})
}

// podRunning is a WaitPod condition: phase Running with every container
// running.
func podRunning(p kubePod) error {
	if p.Status.Phase != "Running" {
		return fmt.Errorf("phase %q", p.Status.Phase)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return fmt.Errorf("container %s not running", c.Name)
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// Metrics.

// Metrics returns the kubelet's /metrics, parsed.
func (k *kubelet) Metrics() (map[string]*dto.MetricFamily, error) {
	b, err := k.get("/metrics")
	if err != nil {
		return nil, err
	}
	return parseMetrics(b)
}

// parseMetrics parses a Prometheus text exposition.
func parseMetrics(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// histogramTotals returns a histogram family's sample count and sum, over
// every series.
func histogramTotals(mfs map[string]*dto.MetricFamily, name string) (count uint64, sum float64) {
	mf := mfs[name]
	if mf == nil {
		return 0, 0
	}
	for _, m := range mf.GetMetric() {
		if h := m.GetHistogram(); h != nil {
			count += h.GetSampleCount()
			sum += h.GetSampleSum()
		}
	}
	return count, sum
}

// WaitRelists waits until the kubelet's PLEG has finished n more relists
// (its kubelet_pleg_relist_duration_seconds count), so that what the
// runtime shows now has been seen by a relist that started after it.
func (k *kubelet) WaitRelists(t testing.TB, n uint64, timeout time.Duration) {
	t.Helper()
	m, err := k.Metrics()
	if err != nil {
		t.Fatalf("kubelet /metrics: %v", err)
	}
	c0, _ := histogramTotals(m, "kubelet_pleg_relist_duration_seconds")
	eventually(t, timeout, fmt.Sprintf("%d relists of the kubelet", n), func() error {
		m, err := k.Metrics()
		if err != nil {
			return err
		}
		if c, _ := histogramTotals(m, "kubelet_pleg_relist_duration_seconds"); c < c0+n {
			return fmt.Errorf("%d so far", c-c0)
		}
		return nil
	})
}

// ---------------------------------------------------------------------------
// The kubelet's log.

var (
	klogHeaderRE = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+\s+\S+\] (.*)$`)
	kvRE         = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// parseKubeletLine parses a klog text line into a PLEG line, if it is one.
func parseKubeletLine(line string, year int) (kubeletLine, bool) {
	m := klogHeaderRE.FindStringSubmatch(line)
	if m == nil {
		return kubeletLine{}, false
	}
	msg := m[2]
	l := kubeletLine{Raw: line}
	switch {
	case strings.HasPrefix(msg, `"SyncLoop (PLEG): event for pod"`), strings.HasPrefix(msg, `"SyncLoop (PLEG): pod does not exist, ignore irrelevant event"`):
		l.Kind = "event"
		_, js, ok := strings.Cut(msg, " event=")
		if !ok {
			return kubeletLine{}, false
		}
		var ev struct {
			ID   string `json:"ID"`
			Type string `json:"Type"`
			Data any    `json:"Data"`
		}
		if err := json.Unmarshal([]byte(js), &ev); err != nil {
			return kubeletLine{}, false
		}
		l.PodUID, l.Type = ev.ID, ev.Type
		if s, ok := ev.Data.(string); ok {
			l.ContainerID = s
		}
		for _, kv := range kvRE.FindAllStringSubmatch(msg, -1) {
			if kv[1] == "pod" {
				l.Pod = kv[2]
			}
		}
	case strings.HasPrefix(msg, `"GenericPLEG"`):
		l.Kind = "generic"
		for _, kv := range kvRE.FindAllStringSubmatch(msg, -1) {
			switch kv[1] {
			case "podUID":
				l.PodUID = kv[2]
			case "containerID":
				l.ContainerID = kv[2]
			case "oldState":
				l.Old = kv[2]
			case "newState":
				l.New = kv[2]
			}
		}
	default:
		return kubeletLine{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return kubeletLine{}, false
	}
	l.At = at.AddDate(year, 0, 0)
	return l, true
}

// PLEGLines returns every PLEG line the kubelet has logged so far (reading
// the log on from where the last call stopped).
func (k *kubelet) PLEGLines() []kubeletLine {
	k.logMu.Lock()
	defer k.logMu.Unlock()
	f, err := os.Open(k.logPath)
	if err != nil {
		return append([]kubeletLine(nil), k.lines...)
	}
	defer f.Close()
	if _, err := f.Seek(k.logOff, io.SeekStart); err == nil {
		b, _ := io.ReadAll(f)
		k.logOff += int64(len(b))
		buf := append(k.logPart, b...)
		year := time.Now().Year()
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			if l, ok := parseKubeletLine(string(buf[:i]), year); ok {
				k.lines = append(k.lines, l)
			}
			buf = buf[i+1:]
		}
		k.logPart = append([]byte(nil), buf...)
	}
	return append([]kubeletLine(nil), k.lines...)
}

// WaitLog polls the kubelet's log until a line contains s, and returns
// that line.
func (k *kubelet) WaitLog(t testing.TB, s string, timeout time.Duration) string {
	t.Helper()
	var found string
	eventually(t, timeout, "kubelet log line "+strconv.Quote(s), func() error {
		b, err := os.ReadFile(k.logPath)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, s) {
				found = l
				return nil
			}
		}
		return errors.New("not logged")
	})
	return found
}

// logTail returns the last n lines of the kubelet's log.
func (k *kubelet) logTail(n int) string {
	b, err := os.ReadFile(k.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  | " + strings.Join(lines, "\n  | ")
}

// ---------------------------------------------------------------------------
// Teardown.

// stop removes every manifest, waits (bounded) until the kubelet has
// stopped their pods, stops the kubelet (SIGTERM, SIGKILL after 10 s),
// then tears the containerd env down (pods left are removed through CRI,
// the supervisor kills what is left of ours, unmounts and removes the
// dir) and checks that nothing is left, the host paths included. Errors
// fail t.
func (k *kubelet) stop(t testing.TB) {
	start := time.Now()
	if t.Failed() && k.logPath != "" {
		logs := map[string]string{"kubelet": k.logPath}
		if k.env != nil && k.env.logPath != "" {
			// Its runtime's too: a runtime that died under the
			// kubelet says why only there.
			logs[strings.TrimSuffix(filepath.Base(k.env.logPath), ".log")] = k.env.logPath
		}
		keepFailedLogs(t, "the kubelet's and its runtime's", logs)
	}
	if k.cmd != nil && k.cmd.Process != nil && k.exited() {
		t.Errorf("the kubelet exited during the test: %v\n%s", k.exitErr(), k.logTail(40))
	}
	if k.cmd != nil && k.cmd.Process != nil && !k.exited() {
		ents, _ := os.ReadDir(k.manifests)
		for _, e := range ents {
			os.Remove(filepath.Join(k.manifests, e.Name()))
		}
		if len(ents) > 0 {
			if err := k.waitPodsStopped(60 * time.Second); err != nil {
				t.Errorf("kubelet teardown: %v", err)
			}
		}
		k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.done:
		case <-time.After(10 * time.Second):
			k.cmd.Process.Kill()
			<-k.done
			t.Errorf("kubelet teardown: the kubelet ignored SIGTERM for 10s; killed")
		}
	}
	if k.env != nil {
		ids := k.runtimeIDs()
		if err := k.env.teardown(); err != nil {
			t.Errorf("kubelet teardown: containerd %s: %v", k.env.version, err)
		}
		for _, id := range ids {
			removed, err := removeEmptyContainerCgroups(id)
			if err != nil {
				t.Errorf("kubelet teardown: %v", err)
			} else if len(removed) > 0 {
				t.Logf("kubelet teardown: the runtime left the empty cgroups %v of %s; removed them", removed, id)
			}
		}
	}
	if k.releasePorts != nil {
		k.releasePorts()
	}
	t.Logf("kubelet teardown took %v", time.Since(start).Round(time.Millisecond))
}

// runtimeIDs lists every sandbox and container ID of the kubelet's
// containerd (nil if it does not answer).
// removeEmptyContainerCgroups removes the cgroups of the removed container
// or sandbox id (created under containerd's /k8s.io parent) if no process
// is left in them, and returns those it removed; a process in one is an
// error. On cgroup v1 runc's rmdir of a cgroup can fail (EBUSY) while the
// kernel is still letting go of the task that just exited, and runc does
// not try again: the container is gone, its directory is not.
func removeEmptyContainerCgroups(id string) ([]string, error) {
	var left []string
	for _, cg := range cgroupDirs("/k8s.io/" + id) {
		if fileExists(cg) {
			left = append(left, cg)
		}
	}
	if len(left) == 0 {
		return nil, nil
	}
	if procs := procsIn(left); len(procs) > 0 {
		return nil, fmt.Errorf("cgroups %v left, with processes %v", left, procs)
	}
	if _, err := rmdirTrees(left); err != nil {
		return nil, fmt.Errorf("cgroups %v left empty by the runtime, and not removable: %w", left, err)
	}
	return left, nil
}

func (k *kubelet) runtimeIDs() []string {
	if k.env.cri == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	if ps, err := k.env.cri.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
		for _, p := range ps.Items {
			ids = append(ids, p.Id)
		}
	}
	if cs, err := k.env.cri.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err == nil {
		for _, c := range cs.Containers {
			ids = append(ids, c.Id)
		}
	}
	return ids
}

// waitPodsStopped waits until /pods is empty and no container of the
// kubelet's containerd runs.
func (k *kubelet) waitPodsStopped(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) && !k.exited() {
		last = func() error {
			pods, err := k.Pods()
			if err != nil {
				return err
			}
			if len(pods) > 0 {
				return fmt.Errorf("%d pods still in /pods", len(pods))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs, err := k.env.cri.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
				State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
			if err != nil {
				return err
			}
			if len(cs.Containers) > 0 {
				return fmt.Errorf("%d containers still running", len(cs.Containers))
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the kubelet did not stop its pods within %v: %v", timeout, last)
}

// checkHostPaths reports kubelet host paths that appeared during the run.
func (k *kubelet) checkHostPaths() error {
	var errs []error
	for _, p := range kubeletHostPaths {
		if fileExists(p) && !k.hostPathsBefore[p] {
			errs = append(errs, fmt.Errorf("the kubelet created %s on the host", p))
		}
	}
	return errors.Join(errs...)
}

// requireKubeletRuntime skips t when this run has no containerd 2.2, the
// kubelet's runtime (PLEG_E2E_RUNTIMES).
func requireKubeletRuntime(t testing.TB) {
	t.Helper()
	requireRuntimeItem(t, kubeletRuntime)
}

// requireRuntimeItem skips t when this run does not include the runtime
// named by allRuntimes item (PLEG_E2E_RUNTIMES).
func requireRuntimeItem(t testing.TB, item string) {
	t.Helper()
	for _, e := range runtimes {
		if e.name() == runtimeName(item) {
			return
		}
	}
	if privateRun.selected[item] {
		return // a package of private runtimes only (Main)
	}
	t.Skipf("the kubelet runs on %s here, not in this run (%s=%q)", runtimeName(item), envRuntimes, os.Getenv(envRuntimes))
}

// getOK fetches url with client, within 10 s; any status but 200 is an
// error carrying the start of the body.
func getOK(client *http.Client, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %.300s", url, resp.Status, b)
	}
	return b, err
}

// enablePodNetwork gives the kubelet's containerd a CNI network
// configuration, as every node has, and waits until its CRI status reports
// the network ready (without one it reports NetworkReady=false, "cni
// plugin not initialized", which the kubelet and pleg turn into a node
// that is not Ready). The pods here use the host's network: no plugin
// binary ever runs.
func (k *kubelet) enablePodNetwork(t testing.TB) {
	t.Helper()
	dir := filepath.Join(k.env.dir, "cni", "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := `{"cniVersion": "1.0.0", "name": "pleg-e2e", "plugins": [{"type": "loopback"}]}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "10-pleg-e2e.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the kubelet's containerd reports its network ready", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := k.env.cri.rt.Status(ctx, &runtimeapi.StatusRequest{})
		if err != nil {
			return err
		}
		for _, c := range resp.GetStatus().GetConditions() {
			if c.Type == runtimeapi.NetworkReady {
				if !c.Status {
					return fmt.Errorf("NetworkReady false: %s: %s", c.Reason, c.Message)
				}
				return nil
			}
		}
		return errors.New("no NetworkReady condition")
	})
}

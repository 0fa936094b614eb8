package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/testport"
)

// TestDaemonSetOnKubelet runs the DaemonSet's pod template
// (deploy/kubernetes/pleg.yaml, made a static pod by daemonSet.staticPod)
// on the image built from deploy/Dockerfile, on the real kubelet, beside
// two plain static pods, and checks it as the kubelet reports it and
// through the ports the manifest gives it: it starts; pleg inside it
// reports the other static pods with the kubelet's container IDs; the
// probe paths answer on the probes' port, which does not serve the pod
// API; the node name came through the downward API and GOMEMLIMIT through
// the environment; the runtime restarts under it and it keeps up
// (runtimeRestartUnderDaemonSet); made non-root by
// deploy/kubernetes/pleg-nonroot-patch.yaml, a second one beside it
// relists through a socket of its supplemental group (nonRootOnKubelet);
// the kubelet's liveness and readiness probes pass (/metrics/probes,
// /pods: ready, restartCount 0, the same container); node-problem-
// detector's plugin finds it healthy.
func TestDaemonSetOnKubelet(t *testing.T) {
	testDaemonSetOnKubelet(t, kubeletRuntime, "")
}

// TestDaemonSetOnKubeletCRIO is TestDaemonSetOnKubelet on a node whose
// runtime is CRI-O 1.36.3: the DaemonSet patched by
// deploy/kubernetes-crio/pleg-crio-patch.yaml (CRI-O's socket directory,
// /var/run/crio, mounted read-only), as a static pod on the real kubelet
// on CRI-O, with CRI-O restarted under it. The non-root step stays
// containerd's (it gives containerd's socket a group; CRI-O's socket has
// no such setting).
func TestDaemonSetOnKubeletCRIO(t *testing.T) {
	testDaemonSetOnKubelet(t, crioKubeletRuntime, crioPatchPath)
}

// crioPatchPath is the DaemonSet's patch for CRI-O nodes.
const crioPatchPath = "deploy/kubernetes-crio/pleg-crio-patch.yaml"

func testDaemonSetOnKubelet(t *testing.T, item, patch string) {
	requireRuntimeItem(t, item)
	img := PlegImage(t)
	ds, err := loadDaemonSet(suite.repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if patch != "" {
		if ds, err = ds.patched(suite.repoRoot, patch); err != nil {
			t.Fatal(err)
		}
	}
	c := ds.container()

	// The manifest's addresses. With the host's network they are the
	// machine's: the pod API must be on loopback (we reach it there), and
	// both ports must be free, or the pod would crash for a reason that is
	// not pleg's.
	listen, ok := flagArg(c.Args, "listen-address")
	if !ok {
		t.Fatalf("%s: no --listen-address", manifestPath)
	}
	if host, _, err := net.SplitHostPort(listen); err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("%s: --listen-address %q is not on loopback", manifestPath, listen)
	}
	metricsAddr, ok := flagArg(c.Args, "metrics-address")
	if !ok {
		t.Fatalf("%s: no --metrics-address", manifestPath)
	}
	_, metricsPort, err := net.SplitHostPort(metricsAddr)
	if err != nil {
		t.Fatalf("%s: --metrics-address %q: %v", manifestPath, metricsAddr, err)
	}
	for _, addr := range []string{listen, metricsAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the manifest's address %s is taken on this machine (another pleg?): %v", addr, err)
		}
		l.Close()
	}
	api := "http://" + listen
	probes := "http://" + net.JoinHostPort("127.0.0.1", metricsPort)

	k := startKubeletWith(t, item, func(e *env) error {
		if e.kind == kindCRIO {
			e.preload = append(e.preload, ociArchive{img.archive, img.ref})
		}
		return nil
	})
	// /readyz is the node Ready condition, which needs the runtime's
	// network ready, as on any node.
	k.enablePodNetwork(t)
	k.ImportImage(t, img.archive, img.ref)
	pod, err := ds.staticPod(k.env.sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := moveLifecycleSocket(pod, t.TempDir()); err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	manifest, err := json.MarshalIndent(pod, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k.AddManifest(t, "pleg", manifest)
	var beside []string
	for _, name := range []string{"beside-a", "beside-b"} {
		beside = append(beside, k.AddPod(t, StaticPod{Name: name, Containers: []StaticContainer{{Name: "main", Args: []string{"run"}}}}))
	}
	plegPod := ds.name + "-" + kubeletNode

	// 1. It starts, and the kubelet reports it ready; the others run.
	known := map[string]kubePod{}
	for _, name := range beside {
		known[name] = k.WaitPod(t, name, 60*time.Second, podRunning)
	}
	known[plegPod] = k.WaitPod(t, plegPod, 90*time.Second, func(p kubePod) error {
		if err := podRunning(p); err != nil {
			return err
		}
		if cs, ok := p.container(c.Name); !ok || !cs.Ready || !p.ready() {
			return fmt.Errorf("container %s ready %v, Ready condition true %v", c.Name, cs.Ready, p.ready())
		}
		if p.Metadata.Namespace != ds.ns {
			return fmt.Errorf("namespace %q, want the DaemonSet's %q", p.Metadata.Namespace, ds.ns)
		}
		return nil
	})
	t.Logf("the DaemonSet's pod was ready %v after its manifest was written", time.Since(start).Round(100*time.Millisecond))

	// 2. pleg inside it reports the static pods (itself included) with
	// the kubelet's pod UIDs, names and container IDs, running.
	eventually(t, 30*time.Second, "pleg's pod API reports the static pods as the kubelet does", func() error {
		return plegReportsPods(api, known)
	})

	// 3. The probe paths answer on the probes' port; the node's name came
	// through the downward API; the pod API is not on that port.
	for _, probe := range []*k8sProbe{c.LivenessProbe, c.ReadinessProbe} {
		if probe == nil {
			t.Fatalf("%s: the container lacks a probe", manifestPath)
		}
		if _, err := httpGet(probes + probe.HTTPGet.Path); err != nil {
			t.Errorf("the probe path: %v", err)
		}
	}
	b, err := httpGet(probes + "/metrics")
	if want := fmt.Sprintf("kubelet_node_name{node=%q} 1", kubeletNode); err != nil || !bytes.Contains(b, []byte(want)) {
		t.Errorf("GET %s/metrics: %v; no %s", probes, err, want)
	}
	if code, err := httpStatus(probes + "/api/v1/pods"); err != nil || code != http.StatusNotFound {
		t.Errorf("GET %s/api/v1/pods: %d %v, want 404: the pod API stays on loopback", probes, code, err)
	}
	// GOMEMLIMIT, as the Go runtime inside the pod took it.
	if got, want := goMemLimit(t, b), ds.goMemLimitBytes(t); got != want {
		t.Errorf("the pod's Go runtime has a memory limit of %d bytes; the manifest's GOMEMLIMIT is %d", got, want)
	}

	// 4. The runtime restarts under the running pod (its liveness probe
	// keeps running meanwhile; step 6 checks that it never failed).
	runtimeRestartUnderDaemonSet(t, k, c, plegPod, api, known, [2]string{beside[0], beside[1]})

	// 5. The non-root variant, beside it: the image's user with the
	// socket's group (containerd's [grpc] gid).
	if k.env.kind == kindContainerd {
		nonRootOnKubelet(t, k, pod, ds.name+"-nonroot")
	}

	// node-problem-detector's plugin, as the patch runs it, beside the
	// DaemonSet's pod: checked at the end, after the probes' wait.
	npd, err := npdStaticPod(suite.repoRoot, img.ref)
	if err != nil {
		t.Fatal(err)
	}
	if manifest, err = json.MarshalIndent(npd, "", "  "); err != nil {
		t.Fatal(err)
	}
	k.AddManifest(t, "npd", manifest)

	// 6. The probes as the kubelet ran them: liveness (after its initial
	// delay) passed at least once and never failed, readiness passed at
	// least three times, and the container never restarted.
	var counts map[string]float64
	eventually(t, 90*time.Second, "the kubelet's probes of the DaemonSet's pod", func() error {
		b, err := k.get("/metrics/probes")
		if err != nil {
			return err
		}
		if counts, err = probeCounts(b, ds.ns, plegPod, c.Name); err != nil {
			return err
		}
		if n := counts["Liveness/failed"] + counts["Liveness/unknown"]; n > 0 {
			t.Fatalf("the kubelet's liveness probe of %s did not pass %v times: %v", plegPod, n, counts)
		}
		if counts["Liveness/successful"] < 1 || counts["Readiness/successful"] < 3 {
			return fmt.Errorf("probe results so far: %v", counts)
		}
		return nil
	})
	p := k.WaitPod(t, plegPod, 10*time.Second, nil)
	if cs, ok := p.container(c.Name); !ok || cs.RestartCount != 0 || !cs.Ready || !p.ready() || cs.ContainerID != known[plegPod].Status.ContainerStatuses[0].ContainerID {
		t.Errorf("after its probes ran, the kubelet reports %s: %+v, Ready %v", plegPod, cs, p.ready())
	}
	t.Logf("the kubelet's probes of the DaemonSet's pod: %v, %v after its manifest was written", counts, time.Since(start).Round(100*time.Millisecond))

	// 7. The NPD pod: its init container copied the binary out of the
	// image, and the plugin's commands (one a rule), run from the copy,
	// found pleg healthy and the kubelet's PLEG not at risk on the node's
	// loopback (exit 0 in NPD's plugin protocol).
	k.WaitPod(t, "npd-"+kubeletNode, 30*time.Second, func(p kubePod) error {
		for cond, name := range npdRuleContainers {
			cs, ok := p.container(name)
			if p.Status.Phase == "Failed" && (!ok || cs.State.Terminated == nil) {
				t.Fatalf("NPD's pod failed before its %s container ran (did its init container copy %s?): %+v", name, c.Command, p.Status)
			}
			if !ok || cs.State.Terminated == nil {
				return fmt.Errorf("phase %q, %s container %+v", p.Status.Phase, name, cs)
			}
			if cs.State.Terminated.ExitCode != 0 {
				t.Fatalf("NPD's %s rule exited %d (%s), pod phase %q: %s said the node has the problem, or could not run",
					cond, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason, p.Status.Phase, npdPluginPath)
			}
		}
		if p.Status.Phase != "Succeeded" {
			return fmt.Errorf("phase %q", p.Status.Phase)
		}
		return nil
	})
}

// npdPluginPath is node-problem-detector's plugin config for pleg.
const npdPluginPath = "deploy/npd/pleg-plugin-monitor.json"

// npdRuleContainers names the NPD pod's container that runs each rule of
// the plugin config, by the rule's condition: pleg's own health, and the
// forecast of the kubelet's PLEG.
var npdRuleContainers = map[string]string{"PLEGUnhealthy": "plugin", "KubeletPLEGAtRisk": "forecast"}

// npdStaticPod is node-problem-detector's patch as a static pod that runs
// the plugin's rule once, as NPD would: the patch's pod spec (host
// network, the init container that copies pleg out of its image into the
// pleg-bin emptyDir), with these changes:
//
//  1. NPD's container (NPD is not available here) becomes one container
//     of the same image for each rule of
//     deploy/npd/pleg-plugin-monitor.json ("plugin" for PLEGUnhealthy,
//     "forecast" for KubeletPLEGAtRisk), running its path and args from
//     the copied binary, with the patch's pleg-bin mount;
//  2. the ConfigMap volume and its mount are left out: static pods may not
//     reference ConfigMaps (the plugin's config is read here instead);
//  3. restartPolicy Never: the rule runs once.
//
// The init container is the patch's as it is: the DaemonSet's image,
// which the suite imported under that reference (IfNotPresent finds it).
func npdStaticPod(repoRoot, image string) (map[string]any, error) {
	maps, _, err := manifestDocs[struct{}](filepath.Join(repoRoot, npdPatchPath))
	if err != nil {
		return nil, err
	}
	if len(maps) != 1 {
		return nil, fmt.Errorf("%s: %d documents", npdPatchPath, len(maps))
	}
	spec, err := dig[map[string]any](maps[0], "spec", "template", "spec")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", npdPatchPath, err)
	}
	spec = deepCopy(spec).(map[string]any)
	inits, err := dig[[]any](spec, "initContainers")
	if err != nil || len(inits) != 1 {
		return nil, fmt.Errorf("%s: init containers %v: %v", npdPatchPath, inits, err)
	}
	ic, ok := inits[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: the init container is a %T", npdPatchPath, inits[0])
	}
	if ic["image"] != image {
		return nil, fmt.Errorf("%s: the init container's image %v is not the DaemonSet's %s", npdPatchPath, ic["image"], image)
	}

	ctrs, err := dig[[]any](spec, "containers")
	if err != nil || len(ctrs) != 1 {
		return nil, fmt.Errorf("%s: containers %v: %v", npdPatchPath, ctrs, err)
	}
	var mounts []any
	binVolume := map[string]bool{}
	npdCtr, _ := ctrs[0].(map[string]any)
	if ms, ok := npdCtr["volumeMounts"].([]any); ok {
		vols, _ := spec["volumes"].([]any)
		for _, v := range vols {
			if vm, _ := v.(map[string]any); vm["emptyDir"] != nil {
				binVolume[fmt.Sprint(vm["name"])] = true
			}
		}
		for _, m := range ms {
			if mm, _ := m.(map[string]any); binVolume[fmt.Sprint(mm["name"])] {
				mounts = append(mounts, m)
			}
		}
		var keep []any
		for _, v := range vols {
			if vm, _ := v.(map[string]any); binVolume[fmt.Sprint(vm["name"])] {
				keep = append(keep, v)
			}
		}
		spec["volumes"] = keep
	}
	if len(mounts) == 0 {
		return nil, fmt.Errorf("%s: NPD's container mounts no emptyDir for the binary", npdPatchPath)
	}

	b, err := os.ReadFile(filepath.Join(repoRoot, npdPluginPath))
	if err != nil {
		return nil, err
	}
	var plugin struct {
		Rules []struct {
			Condition string   `json:"condition"`
			Path      string   `json:"path"`
			Args      []string `json:"args"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &plugin); err != nil {
		return nil, fmt.Errorf("%s: %w", npdPluginPath, err)
	}
	// One container a rule, named by its condition (npdRuleContainers).
	var containers []any
	for _, rule := range plugin.Rules {
		name, ok := npdRuleContainers[rule.Condition]
		if !ok {
			return nil, fmt.Errorf("%s: a rule for condition %q, want one for each of %v", npdPluginPath, rule.Condition, npdRuleContainers)
		}
		cmd := []any{rule.Path}
		for _, a := range rule.Args {
			cmd = append(cmd, a)
		}
		containers = append(containers, map[string]any{
			"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "command": cmd, "volumeMounts": mounts,
		})
	}
	if len(containers) != len(npdRuleContainers) {
		return nil, fmt.Errorf("%s: %d rules, want one for each of %v", npdPluginPath, len(containers), npdRuleContainers)
	}
	spec["containers"] = containers
	spec["restartPolicy"] = "Never"
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "npd", "namespace": "kube-system"},
		"spec":     spec,
	}, nil
}

// probeCounts sums the kubelet's prober_probe_total (its /metrics/probes)
// of one container by "probe_type/result".
func probeCounts(text []byte, namespace, pod, container string) (map[string]float64, error) {
	mfs, err := parseMetrics(text)
	if err != nil {
		return nil, fmt.Errorf("/metrics/probes: %w", err)
	}
	fam, ok := mfs["prober_probe_total"]
	if !ok {
		return nil, errors.New("/metrics/probes has no prober_probe_total yet")
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["namespace"] == namespace && l["pod"] == pod && l["container"] == container {
			out[l["probe_type"]+"/"+l["result"]] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// httpGet fetches url; any status but 200 is an error.
func httpGet(url string) ([]byte, error) { return getOK(http.DefaultClient, url) }

// httpStatus returns url's status code.
func httpStatus(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The DaemonSet's pod against what a node's runtime does to it: containerd
// restarting under it (it recreates its socket), and a socket that belongs
// to a group, for pleg running as a non-root user. Steps of
// TestDaemonSetOnKubelet, on its kubelet and pod.

// kubeletSocketGID is the group the kubelet's containerd gives its socket
// once the restart step has configured it ([grpc] gid), as an operator
// following deploy/README.md's "Running as non-root" would.
const kubeletSocketGID = 2000

// relistEntry is one relist of pleg's /api/v1/relists, with its times.
type relistEntry struct {
	Start           time.Time `json:"start"`
	DurationSeconds float64   `json:"durationSeconds"`
	Pods            int       `json:"pods"`
	Error           string    `json:"error"`
}

func (r relistEntry) end() time.Time {
	return r.Start.Add(time.Duration(r.DurationSeconds * float64(time.Second)))
}

// plegRelists reads pleg's recent relists from its pod API.
func plegRelists(api string) ([]relistEntry, error) {
	b, err := httpGet(api + "/api/v1/relists")
	if err != nil {
		return nil, err
	}
	var body struct {
		Relists []relistEntry `json:"relists"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("/api/v1/relists: %w: %.300s", err, b)
	}
	return body.Relists, nil
}

// firstRelist returns the first relist that started after since and
// failed (failed true) or succeeded.
func firstRelist(api string, since time.Time, failed bool) (relistEntry, error) {
	rs, err := plegRelists(api)
	if err != nil {
		return relistEntry{}, err
	}
	var last relistEntry
	for _, r := range rs {
		if r.Start.After(since) && (r.Error != "") == failed {
			return r, nil
		}
		last = r
	}
	return relistEntry{}, fmt.Errorf("none among %d relists (the last: %+v)", len(rs), last)
}

// plegReportsPods checks pleg's pod API against the kubelet's view of the
// pods in known: same UIDs, names and container IDs, running.
func plegReportsPods(api string, known map[string]kubePod) error {
	b, err := httpGet(api + "/api/v1/pods")
	if err != nil {
		return err
	}
	var body httpapi.PodsBody
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("/api/v1/pods: %w", err)
	}
	for name, kp := range known {
		var found bool
		for _, pp := range body.Pods {
			if pp.UID != kp.Metadata.UID {
				continue
			}
			found = true
			if pp.Namespace != kp.Metadata.Namespace || pp.Name != name {
				return fmt.Errorf("pleg names pod %s %s/%s, the kubelet %s/%s", pp.UID, pp.Namespace, pp.Name, kp.Metadata.Namespace, name)
			}
			for _, kc := range kp.Status.ContainerStatuses {
				id, ok := runtimeID(kc.ContainerID), false
				for _, pc := range pp.Containers {
					if pc.ID == id {
						ok = true
						if pc.Name != kc.Name || pc.State != "running" {
							return fmt.Errorf("pleg: %s's container %s is %s %q; the kubelet: %s running", name, id, pc.Name, pc.State, kc.Name)
						}
					}
				}
				if !ok {
					return fmt.Errorf("pleg does not report %s's container %s (it has %+v)", name, id, pp.Containers)
				}
			}
		}
		if !found {
			return fmt.Errorf("pleg does not report %s (uid %s)", name, kp.Metadata.UID)
		}
	}
	return nil
}

// onlyContainer returns the ID of a pod's one container, as the runtime
// names it.
func onlyContainer(t testing.TB, p kubePod) string {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has %d containers, want 1", p.Metadata.Name, len(p.Status.ContainerStatuses))
	}
	return runtimeID(p.Status.ContainerStatuses[0].ContainerID)
}

// runtimeRestartUnderDaemonSet restarts the kubelet's containerd under
// the running DaemonSet pod as `systemctl restart containerd` does
// (SIGTERM, then a new containerd on the same root, state and socket
// path: it removes the old socket and creates a new one). While it is
// down, the process of one static pod's container dies; right after it
// answers again, another's. It checks that pleg inside the pod saw the
// outage (failed relists) without turning unhealthy, relists again within
// seconds of containerd answering (the figure is a MEASURE line), delivers
// both deaths with the exit codes the kubelet reports and the kubelet's
// restarts of both containers, agrees with the kubelet on every pod,
// reports nothing else, reconnects its event stream, and that its own
// container was neither restarted nor replaced.
//
// The new containerd's config gives its socket the group
// kubeletSocketGID ([grpc] gid), for the non-root step after it: as an
// operator would set it, with a restart.
func runtimeRestartUnderDaemonSet(t *testing.T, k *kubelet, c k8sContainer, plegPod, api string, known map[string]kubePod, victims [2]string) {
	useEnv(t, k.env)
	events := followEvents(t, api, "DaemonSet pod")

	plegBefore, _ := known[plegPod].container(c.Name)
	ids := map[string]string{} // pod -> container ID before
	pids := map[string]int{}
	for _, v := range victims {
		ids[v] = onlyContainer(t, known[v])
		pids[v] = containerPID(t, ids[v])
	}
	var readyBefore readyzBody
	if b, err := httpGet(api + "/readyz"); err != nil || json.Unmarshal(b, &readyBefore) != nil {
		t.Fatalf("pleg's /readyz before the restart: %v %s", err, b)
	}

	// The runtime stops; the first victim's process dies meanwhile. (Every
	// relist that starts after StopContainerd returned starts while
	// the runtime is down or after it answered again.)
	rt := k.env.name()
	StopContainerd(t)
	stoppedAt := time.Now()
	if err := syscall.Kill(pids[victims[0]], syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s's process %d: %v", victims[0], pids[victims[0]], err)
	}
	eventually(t, 10*time.Second, victims[0]+"'s process gone", func() error {
		if err := syscall.Kill(pids[victims[0]], 0); err == nil {
			return fmt.Errorf("pid %d still exists", pids[victims[0]])
		}
		return nil
	})
	var failed relistEntry
	eventually(t, 15*time.Second, "pleg's relists fail while the runtime is down", func() (err error) {
		failed, err = firstRelist(api, stoppedAt, true)
		return err
	})
	t.Logf("while %s was down, pleg's relist failed: %s", rt, failed.Error)
	if code, err := httpStatus(api + "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("pleg's /healthz during a short outage: %d %v, want 200 (the threshold is minutes)", code, err)
	}

	// The runtime starts again; containerd's socket now in the group
	// (nonRootOnKubelet's step).
	if k.env.kind == kindContainerd {
		k.env.socketGID = kubeletSocketGID
		if err := k.env.writeConfig(); err != nil {
			t.Fatal(err)
		}
	}
	StartContainerd(t)
	answeredAt := time.Now()
	if err := syscall.Kill(pids[victims[1]], syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s's process %d: %v", victims[1], pids[victims[1]], err)
	}
	outage := answeredAt.Sub(stoppedAt)

	// pleg relists again, within seconds of the runtime answering.
	var back relistEntry
	eventually(t, 30*time.Second, "pleg relists again after the runtime answers", func() (err error) {
		back, err = firstRelist(api, stoppedAt, false)
		return err
	})
	reconnect := back.end().Sub(answeredAt)
	measure(t, "daemonset_runtime_restart mount=directory outage=%s answering_to_relist=%s relist_started_after_answer=%s",
		ms(outage), ms(reconnect), ms(back.Start.Sub(answeredAt)))
	if reconnect > 5*time.Second {
		t.Errorf("pleg's first successful relist after the restart ended %v after %s answered, want within seconds", reconnect, rt)
	}

	// Both deaths, with the kubelet's exit codes, and both restarts.
	waitEvents(t, 30*time.Second, []*eventLog{events}, pleg.ContainerDied, ids[victims[0]], ids[victims[1]])
	newIDs := map[string]string{}
	for _, v := range victims {
		p := k.WaitPod(t, v, 60*time.Second, func(p kubePod) error {
			if err := podRunning(p); err != nil {
				return err
			}
			if cs := p.Status.ContainerStatuses[0]; runtimeID(cs.ContainerID) == ids[v] || cs.LastState.Terminated == nil {
				return fmt.Errorf("not restarted yet: %+v", cs)
			}
			return nil
		})
		known[v] = p
		newIDs[v] = onlyContainer(t, p)
		lastExit := p.Status.ContainerStatuses[0].LastState.Terminated.ExitCode
		died, _ := events.find(pleg.ContainerDied, ids[v])
		if died.ExitCode == nil || *died.ExitCode != lastExit {
			t.Errorf("%s: pleg's ContainerDied %v; the kubelet's last state: exit code %d", v, died, lastExit)
		}
	}
	waitEvents(t, 30*time.Second, []*eventLog{events}, pleg.ContainerStarted, newIDs[victims[0]], newIDs[victims[1]])
	eventually(t, 30*time.Second, "pleg's pod API agrees with the kubelet after the restart", func() error {
		return plegReportsPods(api, known)
	})

	// Nothing else: every lifecycle event is about the victims' old and
	// new containers (sandboxes kept running).
	expected := map[string]bool{}
	for _, v := range victims {
		expected[ids[v]], expected[newIDs[v]] = true, true
	}
	for _, e := range events.all() {
		if !expected[e.ContainerID] && e.Type != pleg.PodSync {
			t.Errorf("pleg delivered %v (pod %s/%s), which no restart explains", e, e.PodNamespace, e.PodName)
		}
	}

	// pleg itself: healthy, ready again, its event stream reconnected,
	// and its container neither restarted nor replaced.
	eventually(t, 30*time.Second, "pleg ready again, its event stream reconnected", func() error {
		var r readyzBody
		b, err := httpGet(api + "/readyz")
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		if es := r.Details.EventStream; es.State != "connected" || es.Connects <= readyBefore.Details.EventStream.Connects {
			return fmt.Errorf("event stream %+v (before the restart: %d connects)", es, readyBefore.Details.EventStream.Connects)
		}
		return nil
	})
	if code, err := httpStatus(api + "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("pleg's /healthz after the restart: %d %v", code, err)
	}
	p := k.WaitPod(t, plegPod, 30*time.Second, func(p kubePod) error {
		if cs, ok := p.container(c.Name); !ok || !cs.Ready || !p.ready() {
			return fmt.Errorf("container %+v, pod Ready %v", cs, p.ready())
		}
		return nil
	})
	if cs, _ := p.container(c.Name); cs.ContainerID != plegBefore.ContainerID || cs.RestartCount != plegBefore.RestartCount {
		t.Errorf("the DaemonSet's container after the restart: %s, restartCount %d; before: %s, %d",
			cs.ContainerID, cs.RestartCount, plegBefore.ContainerID, plegBefore.RestartCount)
	}
	t.Logf("%s down %v; pleg relisting %v after it answered; %d events delivered", rt, outage.Round(time.Millisecond), reconnect.Round(time.Millisecond), len(events.all()))
}

// procCreds reads a process's real uid, gid and supplementary groups.
func procCreds(pid int) (uid, gid string, groups []string, err error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return "", "", nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		switch k {
		case "Uid":
			if len(f) > 0 {
				uid = f[0]
			}
		case "Gid":
			if len(f) > 0 {
				gid = f[0]
			}
		case "Groups":
			groups = f
		}
	}
	return uid, gid, groups, sc.Err()
}

// socketGroup returns the group and permission bits of a socket file.
func socketGroup(path string) (gid uint32, perm os.FileMode, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || st.Mode()&os.ModeSocket == 0 {
		return 0, 0, fmt.Errorf("%s is not a socket (%v)", path, st.Mode())
	}
	return sys.Gid, st.Mode().Perm(), nil
}

// nonRootOnKubelet runs, beside the DaemonSet's pod, the pod that
// deploy/kubernetes/pleg-nonroot-patch.yaml makes of it, with its
// supplementalGroups set to the socket's group (which the restart step
// configured), and checks that pleg, running as the image's non-root uid
// with that group, relists the node's pods. Only its name, ports and
// lifecycle socket directory differ from what the patch makes (two plegs
// on one host network). The socket's
// directory gets the mode of a node's /run/containerd (0711: anyone may
// pass through it).
func nonRootOnKubelet(t *testing.T, k *kubelet, pod map[string]any, podName string) {
	useEnv(t, k.env) // containerPID asks the kubelet's containerd
	gid, perm, err := socketGroup(k.env.sock)
	if err != nil {
		t.Fatal(err)
	}
	if gid != kubeletSocketGID || perm != 0o660 {
		t.Fatalf("containerd's socket: group %d, mode %v; want the configured group %d, mode 0660", gid, perm, kubeletSocketGID)
	}
	if err := os.Chmod(filepath.Dir(k.env.sock), 0o711); err != nil {
		t.Fatal(err)
	}
	np, err := loadNonRootPatch(k.env.repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := np.apply(pod, kubeletSocketGID)
	if err != nil {
		t.Fatal(err)
	}
	ports := testport.ReserveT(t, 2)
	if err := movePorts(patched, ports[0], ports[1]); err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	// A lifecycle socket directory of its own, which the image's user
	// owns (as on a node where it was made for it).
	sockDir := t.TempDir()
	if err := os.Chown(sockDir, int(*np.container.SecurityContext.RunAsUser), int(*np.container.SecurityContext.RunAsGroup)); err != nil {
		t.Fatal(err)
	}
	if err := moveLifecycleSocket(patched, sockDir); err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	patched["metadata"].(map[string]any)["name"] = podName
	api := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	b, err := json.MarshalIndent(patched, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k.AddManifest(t, podName, b)
	p := k.WaitPod(t, podName+"-"+kubeletNode, 60*time.Second, podRunning)

	// The process: the image's uid and gid, with the socket's group.
	uid, pgid, groups, err := procCreds(containerPID(t, onlyContainer(t, p)))
	if err != nil {
		t.Fatal(err)
	}
	wantUID, wantGID := strconv.FormatInt(*np.container.SecurityContext.RunAsUser, 10), strconv.FormatInt(*np.container.SecurityContext.RunAsGroup, 10)
	if uid != wantUID || pgid != wantGID || !slices.Contains(groups, strconv.Itoa(kubeletSocketGID)) {
		t.Errorf("the non-root pod's pleg runs as uid %s, gid %s, groups %v; want uid %s, gid %s and group %d", uid, pgid, groups, wantUID, wantGID, kubeletSocketGID)
	}

	// It relists the node's pods, and is ready.
	var r relistEntry
	eventually(t, 30*time.Second, "the non-root pleg relists the node's pods", func() error {
		rs, err := plegRelists(api)
		if err != nil {
			return err
		}
		for _, x := range rs {
			if x.Error == "" && x.Pods >= 3 {
				r = x
				return nil
			}
		}
		if len(rs) == 0 {
			return errors.New("no relist yet")
		}
		return fmt.Errorf("no successful relist of the static pods among %d relists; the last: %+v", len(rs), rs[len(rs)-1])
	})
	if code, err := httpStatus(api + "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("the non-root pleg's /readyz: %d %v", code, err)
	}
	t.Logf("pleg as uid %s, gid %s, groups %v relisted %d pods %v after its manifest was written", uid, pgid, groups, r.Pods, time.Since(start).Round(100*time.Millisecond))
}

// goMemLimit reads the Go runtime's memory limit from a pleg's /metrics.
func goMemLimit(t testing.TB, metrics []byte) int64 {
	t.Helper()
	mfs, err := parseMetrics(metrics)
	if err != nil {
		t.Fatal(err)
	}
	fam, ok := mfs["go_gc_gomemlimit_bytes"]
	if !ok || len(fam.GetMetric()) != 1 {
		t.Fatalf("pleg's /metrics has no go_gc_gomemlimit_bytes")
	}
	return int64(fam.GetMetric()[0].GetGauge().GetValue())
}

// goMemLimitBytes is the container's GOMEMLIMIT in bytes (the Go
// runtime's syntax: an integer with an optional B, KiB, MiB, GiB or TiB).
func (ds *daemonSet) goMemLimitBytes(t testing.TB) int64 {
	t.Helper()
	for _, e := range ds.container().Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		num := strings.TrimRight(e.Value, "BKMGTi")
		n, err := strconv.ParseInt(num, 10, 64)
		shift, ok := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[e.Value[len(num):]]
		if err != nil || !ok {
			t.Fatalf("%s: GOMEMLIMIT %q is not a byte count", manifestPath, e.Value)
		}
		return n << shift
	}
	t.Fatalf("%s: no GOMEMLIMIT with a value", manifestPath)
	return 0
}

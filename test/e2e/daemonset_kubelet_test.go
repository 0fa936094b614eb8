package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestDaemonSetOnKubelet runs the DaemonSet's pod template
// (deploy/kubernetes/pleg.yaml, made a static pod by daemonSet.staticPod)
// on the image built from deploy/Dockerfile, on the real kubelet, beside
// two plain static pods, and checks it as the kubelet reports it and
// through the ports the manifest gives it: it starts; pleg inside it
// reports the other static pods with the kubelet's container IDs; the
// probe paths answer on the probes' port, which does not serve the pod
// API; the node name came through the downward API and GOMEMLIMIT through
// the environment; containerd restarts under it and it keeps up
// (runtimeRestartUnderDaemonSet); made non-root by
// deploy/kubernetes/pleg-nonroot-patch.yaml, a second one beside it
// relists through a socket of its supplemental group (nonRootOnKubelet);
// the kubelet's liveness and readiness probes pass (/metrics/probes,
// /pods: ready, restartCount 0, the same container); node-problem-
// detector's plugin finds it healthy.
func TestDaemonSetOnKubelet(t *testing.T) {
	img := PlegImage(t)
	ds, err := loadDaemonSet(suite.repoRoot)
	if err != nil {
		t.Fatal(err)
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

	k := startKubelet(t)
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

	// 4. containerd restarts under the running pod (its liveness probe
	// keeps running meanwhile; step 6 checks that it never failed).
	runtimeRestartUnderDaemonSet(t, k, c, plegPod, api, known, [2]string{beside[0], beside[1]})

	// 5. The non-root variant, beside it: the image's user with the
	// socket's group.
	nonRootOnKubelet(t, k, pod, ds.name+"-nonroot")

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
	// image, and the plugin's command, run from the copy, found pleg
	// healthy on the node's loopback (exit 0 in NPD's plugin protocol).
	k.WaitPod(t, "npd-"+kubeletNode, 30*time.Second, func(p kubePod) error {
		cs, ok := p.container("plugin")
		if p.Status.Phase == "Failed" && (!ok || cs.State.Terminated == nil) {
			t.Fatalf("NPD's pod failed before its plugin container ran (did its init container copy %s?): %+v", c.Command, p.Status)
		}
		if !ok || cs.State.Terminated == nil {
			return fmt.Errorf("phase %q, plugin container %+v", p.Status.Phase, cs)
		}
		if cs.State.Terminated.ExitCode != 0 || p.Status.Phase != "Succeeded" {
			t.Fatalf("NPD's plugin command exited %d (%s), pod phase %q: %s said the node's PLEG is not healthy, or could not run",
				cs.State.Terminated.ExitCode, cs.State.Terminated.Reason, p.Status.Phase, npdPluginPath)
		}
		return nil
	})
}

// npdPluginPath is node-problem-detector's plugin config for pleg.
const npdPluginPath = "deploy/npd/pleg-plugin-monitor.json"

// npdStaticPod is node-problem-detector's patch as a static pod that runs
// the plugin's rule once, as NPD would: the patch's pod spec (host
// network, the init container that copies pleg out of its image into the
// pleg-bin emptyDir), with these changes:
//
//  1. NPD's container (NPD is not available here) becomes a container
//     "plugin" of the same image that runs the rule of
//     deploy/npd/pleg-plugin-monitor.json (its path and args) from the
//     copied binary, with the patch's pleg-bin mount;
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
			Path string   `json:"path"`
			Args []string `json:"args"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &plugin); err != nil {
		return nil, fmt.Errorf("%s: %w", npdPluginPath, err)
	}
	if len(plugin.Rules) != 1 {
		return nil, fmt.Errorf("%s: %d rules, want the one that runs pleg", npdPluginPath, len(plugin.Rules))
	}
	rule := plugin.Rules[0]
	cmd := []any{rule.Path}
	for _, a := range rule.Args {
		cmd = append(cmd, a)
	}
	spec["containers"] = []any{map[string]any{
		"name": "plugin", "image": image, "imagePullPolicy": "IfNotPresent", "command": cmd, "volumeMounts": mounts,
	}}
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

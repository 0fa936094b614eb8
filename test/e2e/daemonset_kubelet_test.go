package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// kubeletSite is what TestDaemonSetOnKubelet needs of a running kubelet.
type kubeletSite struct {
	nodeName      string
	staticPodDir  string
	criSocket     string                                       // the socket of the kubelet's containerd
	importArchive func(archive string, images ...string) error // into that containerd
	get           func(path string) ([]byte, error)            // GET on the kubelet's server
}

// kubeletPodList is the part of the kubelet's /pods these tests read.
type kubeletPodList struct {
	Items []kubeletPod `json:"items"`
}

type kubeletPod struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		ContainerStatuses []struct {
			Name         string `json:"name"`
			Ready        bool   `json:"ready"`
			RestartCount int32  `json:"restartCount"`
			ContainerID  string `json:"containerID"`
			State        struct {
				Running *struct{} `json:"running"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func (p *kubeletPod) condition(typ string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// runDaemonSetOnKubelet runs the DaemonSet's pod as a static pod beside two
// plain static pods and checks it as the kubelet reports it and through
// the ports the manifest gives it.
func runDaemonSetOnKubelet(t *testing.T, k kubeletSite) {
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

	if err := k.importArchive(img.archive, plegImageName); err != nil {
		t.Fatal(err)
	}
	pod, err := ds.staticPod(plegImageName, k.criSocket)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	writeStaticPod(t, k.staticPodDir, "pleg.yaml", pod)
	beside := []string{"beside-a", "beside-b"}
	for _, name := range beside {
		writeStaticPod(t, k.staticPodDir, name+".yaml", map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "namespace": podNamespace},
			"spec": map[string]any{
				"hostNetwork": true,
				"containers": []any{map[string]any{
					"name": "main", "image": workloadImage, "imagePullPolicy": "Never", "args": []any{"run"},
				}},
			},
		})
	}

	// The kubelet names static pods <name>-<node name>.
	podName := func(name string) string { return name + "-" + k.nodeName }
	kubeletPods := func() (map[string]kubeletPod, error) {
		b, err := k.get("/pods")
		if err != nil {
			return nil, err
		}
		var l kubeletPodList
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("/pods: %w", err)
		}
		out := map[string]kubeletPod{}
		for _, p := range l.Items {
			out[p.Metadata.Namespace+"/"+p.Metadata.Name] = p
		}
		return out, nil
	}
	plegKey := ds.ns + "/" + podName(ds.name)

	// 1. It starts, and the kubelet reports it ready.
	var pods map[string]kubeletPod
	eventually(t, 90*time.Second, "the kubelet reports the DaemonSet's pod ready and the others running", func() error {
		var err error
		if pods, err = kubeletPods(); err != nil {
			return err
		}
		keys := []string{plegKey}
		for _, name := range beside {
			keys = append(keys, podNamespace+"/"+podName(name))
		}
		for _, key := range keys {
			p, ok := pods[key]
			if !ok {
				return fmt.Errorf("no %s in /pods", key)
			}
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
				return fmt.Errorf("%s: containers %+v", key, p.Status.ContainerStatuses)
			}
		}
		p := pods[plegKey]
		if cs := p.Status.ContainerStatuses[0]; !cs.Ready || p.condition("Ready") != "True" {
			return fmt.Errorf("%s: container ready %v, Ready condition %q", plegKey, cs.Ready, p.condition("Ready"))
		}
		return nil
	})
	t.Logf("the DaemonSet's pod was ready %v after its manifest was written", time.Since(start).Round(100*time.Millisecond))

	// 2. pleg inside it reports the other static pods, with the container
	// IDs the kubelet reports, running; and itself.
	eventually(t, 30*time.Second, "pleg's pod API reports the static pods as the kubelet does", func() error {
		b, err := httpGet(api + "/api/v1/pods")
		if err != nil {
			return err
		}
		var body podsBody
		if err := json.Unmarshal(b, &body); err != nil {
			return fmt.Errorf("/api/v1/pods: %w", err)
		}
		byUID := map[string]int{}
		for i, p := range body.Pods {
			byUID[p.UID] = i
		}
		for _, key := range append([]string{plegKey}, podNamespace+"/"+podName(beside[0]), podNamespace+"/"+podName(beside[1])) {
			kp := pods[key]
			i, ok := byUID[kp.Metadata.UID]
			if !ok {
				return fmt.Errorf("pleg does not report %s (uid %s)", key, kp.Metadata.UID)
			}
			pp := body.Pods[i]
			if pp.Namespace+"/"+pp.Name != key {
				return fmt.Errorf("pleg names pod %s %s/%s, the kubelet %s", kp.Metadata.UID, pp.Namespace, pp.Name, key)
			}
			kc := kp.Status.ContainerStatuses[0]
			want := strings.TrimPrefix(kc.ContainerID, "containerd://")
			found := false
			for _, pc := range pp.Containers {
				if pc.ID == want {
					found = true
					if pc.Name != kc.Name || pc.State != "running" {
						return fmt.Errorf("pleg reports %s's container %s as %s %q, the kubelet as %s running", key, want, pc.Name, pc.State, kc.Name)
					}
				}
			}
			if !found {
				return fmt.Errorf("pleg does not report %s's container %s (it has %+v)", key, want, pp.Containers)
			}
		}
		return nil
	})

	// 3. The probe paths answer on the port the probes use; the node's
	// name came through the downward API; the pod API is not there.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": `"status":"True"`} {
		b, err := httpGet(probes + path)
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("GET %s%s: %v %q, want %q", probes, path, err, b, want)
		}
	}
	b, err := httpGet(probes + "/metrics")
	if want := fmt.Sprintf("kubelet_node_name{node=%q} 1", k.nodeName); err != nil || !bytes.Contains(b, []byte(want)) {
		t.Errorf("GET %s/metrics: %v; no %s", probes, err, want)
	}
	if code, err := httpStatus(probes + "/api/v1/pods"); err != nil || code != http.StatusNotFound {
		t.Errorf("GET %s/api/v1/pods: %d %v, want 404: the pod API must stay on loopback", probes, code, err)
	}

	// 4. The probes as the kubelet ran them: liveness (30 s initial delay)
	// passed at least once, readiness three times, none failed, and the
	// container never restarted.
	ctr := c.Name
	eventually(t, 90*time.Second, "the kubelet's probes of the DaemonSet's pod have run", func() error {
		b, err := k.get("/metrics/probes")
		if err != nil {
			return err
		}
		got, err := probeCounts(b, ctr, ds.ns)
		if err != nil {
			return err
		}
		for key, n := range got {
			if !strings.HasSuffix(key, "/successful") && n > 0 {
				t.Fatalf("the kubelet's %s probe of %s: %v results", key, ctr, n)
			}
		}
		if got["Liveness/successful"] < 1 || got["Readiness/successful"] < 3 {
			return fmt.Errorf("probe results so far: %v", got)
		}
		return nil
	})
	if pods, err = kubeletPods(); err != nil {
		t.Fatal(err)
	}
	p := pods[plegKey]
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 0 || !cs[0].Ready || p.condition("Ready") != "True" {
		t.Errorf("after its probes ran, the kubelet reports %s: containers %+v, Ready %q", plegKey, cs, p.condition("Ready"))
	}
	t.Logf("liveness and readiness passed as the kubelet ran them, %v after the manifest was written", time.Since(start).Round(100*time.Millisecond))
}

// probeCounts sums the kubelet's prober_probe_total for one container by
// "probe_type/result".
func probeCounts(text []byte, container, namespace string) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("/metrics/probes: %w", err)
	}
	fam, ok := fams["prober_probe_total"]
	if !ok {
		return nil, errors.New("/metrics/probes has no prober_probe_total yet")
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["container"] == container && l["namespace"] == namespace {
			out[l["probe_type"]+"/"+l["result"]] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// writeStaticPod writes a manifest into the kubelet's static pod
// directory atomically (the kubelet ignores dot files) and removes it at
// cleanup, which makes the kubelet stop the pod.
func writeStaticPod(t *testing.T, dir, name string, pod map[string]any) {
	t.Helper()
	b, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
	})
}

func httpGet(url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return b, err
}

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

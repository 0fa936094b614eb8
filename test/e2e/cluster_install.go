package e2e

// ClusterInstall: pleg installed on a real cluster as a user installs it
// (deploy/README.md, "Install on a cluster"), its verdicts on the Node
// objects through node-problem-detector, and the forecast of the
// kubelet's "PLEG is not healthy" on a Node minutes before the kubelet
// says it there.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/test/e2e/images/ocilayout"
)

// ClusterRuntimes are the runtimes of ClusterInstall's two nodes.
var ClusterRuntimes = []string{"2.4.2", crioKubeletRuntime}

// The cluster's nodes, and the label deploy/README.md has CRI-O nodes
// carry.
const (
	clusterContainerdNode = "node-containerd"
	clusterCRIONode       = "node-crio"
	crioNodeLabel         = "pleg.podlifecycle.io/runtime=cri-o"
	npdManifestDir        = "deploy/npd"
	npdManifest           = "deploy/npd/node-problem-detector.yaml"
)

// k8sNode is the part of a Node object the tests read.
type k8sNode struct {
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Status struct {
		Conditions []nodeCondition `json:"conditions"`
		NodeInfo   struct {
			ContainerRuntimeVersion string `json:"containerRuntimeVersion"`
			KubeletVersion          string `json:"kubeletVersion"`
		} `json:"nodeInfo"`
	} `json:"status"`
}

type nodeCondition struct {
	Type, Status, Reason, Message string
	LastTransitionTime            time.Time `json:"lastTransitionTime"`
}

func (n k8sNode) condition(typ string) (nodeCondition, bool) {
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return nodeCondition{}, false
}

// k8sPodList is the part of a pod list the tests read.
type k8sPodList struct {
	Items []struct {
		Metadata struct {
			Name            string `json:"name"`
			Namespace       string `json:"namespace"`
			OwnerReferences []struct {
				Kind, Name string
			} `json:"ownerReferences"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
		Status struct {
			Phase      string `json:"phase"`
			Conditions []struct{ Type, Status string }
		} `json:"status"`
	} `json:"items"`
}

// node reads one Node.
func (c *cluster) node(name string) (k8sNode, error) {
	var n k8sNode
	return n, c.getJSON(&n, "node", name)
}

// ClusterInstall: a control plane and two nodes (a kubelet on containerd
// 2.4.2, one on CRI-O 1.36.3, in namespaces of their own); then, as
// deploy/README.md tells a user, with the repository's files unchanged:
//
//  1. kubectl apply -f deploy/kubernetes/pleg.yaml, the CRI-O node
//     labelled and kubectl apply -k deploy/kubernetes-crio: one pleg pod
//     on each node, placed by the DaemonSet controller and the
//     scheduler, Ready by its probes (MEASURE: apply to both Ready);
//  2. kubectl apply -k deploy/npd: node-problem-detector on each node
//     posts PLEGUnhealthy and KubeletPLEGAtRisk, both False, on both Node
//     objects (kubectl describe node in the log);
//  3. Prometheus (Debian's) with deploy/prometheus/scrape-config.yaml's
//     job discovers pleg on both nodes from the API server and evaluates
//     deploy/prometheus/pleg-rules.yaml without error;
//  4. the CRI-O node's pleg pod deleted and not replaced (the DaemonSet
//     held off the node);
//  5. meanwhile, the containerd node's runtime stopped (SIGSTOP):
//     KubeletPLEGAtRisk turns True on that Node, then the kubelet's own
//     Ready condition says "PLEG is not healthy" (MEASURE: how much
//     earlier the forecast was on the Node); the runtime continued, both
//     clear;
//  6. PlegDown fires for the CRI-O node, never for the other (MEASURE:
//     from the pod's deletion); the hold released, the pod comes back and
//     the alert resolves.
func ClusterInstall(t *testing.T) {
	p := installPleg(t)
	c, a, b, owners := p.c, p.a, p.b, p.owners
	t.Logf("kubectl get pods -n pleg-system -o wide:\n%s", c.Kubectl(t, "get", "pods", "-n", "pleg-system", "-o", "wide"))

	// 2. node-problem-detector posts pleg's verdicts on the Nodes.
	t.Logf("kubectl apply -k deploy/npd:\n%s", c.Kubectl(t, "apply", "-k", npdManifestDir))
	npdApplied := time.Now()
	healthy := map[string]string{"PLEGUnhealthy": "False", "KubeletPLEGAtRisk": "False"}
	for _, n := range []*clusterNode{a, b} {
		waitFor(t, 3*time.Minute, "node-problem-detector's conditions on "+n.name, func() error {
			return nodeConditions(c, n.name, healthy)
		})
	}
	posted := time.Since(npdApplied)
	for _, n := range []*clusterNode{a, b} {
		t.Logf("kubectl describe node %s:\n%s", n.name, c.Kubectl(t, "describe", "node", n.name))
	}
	measureOn(t, a.k.env, "cluster_install apply_to_both_pleg_pods_ready=%v npd_apply_to_conditions_on_both_nodes=%v nodes=%s(%s),%s(%s)",
		p.ready.Round(100*time.Millisecond), posted.Round(100*time.Millisecond), a.name, a.k.env.name(), b.name, b.k.env.name())

	// 3. Prometheus discovers both nodes' pleg from the API server and
	// evaluates the rules without error.
	prom := c.startPrometheus(t)
	promStart := time.Now()
	prom.waitTargetsUp(t, a.name, b.name)
	discovered := time.Since(promStart)
	waitFor(t, time.Minute, "Prometheus evaluates every rule of "+rulesPath+" without error", func() error {
		n, bad, err := prom.ruleHealth()
		if err != nil {
			return err
		}
		if len(bad) > 0 {
			t.Fatalf("rules that failed to evaluate: %v", bad)
		}
		if n == 0 {
			return errNotYet
		}
		return nil
	})

	// 4. The CRI-O node's pleg pod deleted and not replaced: the
	// DaemonSet's pods held off every node (a node selector nothing
	// matches); PlegDown's 5m runs meanwhile (step 5 waits minutes).
	c.Kubectl(t, "-n", "pleg-system", "patch", "daemonset", "pleg-crio", "--type", "merge",
		"-p", `{"spec":{"template":{"spec":{"nodeSelector":{"pleg-e2e/hold":"true"}}}}}`)
	waitFor(t, 2*time.Minute, "the pleg pod on "+b.name+" deleted", func() error {
		var pods k8sPodList
		if err := c.getJSON(&pods, "pods", "-n", "pleg-system", "--field-selector", "spec.nodeName="+b.name); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left on %s", len(pods.Items), b.name)
		}
		return nil
	})
	gone := time.Now()

	// 5. The forecast on the Node, before the kubelet's own verdict.
	clusterForecastOnNode(t, c, a)

	// 6. PlegDown fires for the node that lost its pleg, and for no other.
	// The rule's for: 5m, a 15 s scrape and a 5 s evaluation, with room;
	// at least 2 more minutes whatever step 5 took.
	waitFor(t, max(8*time.Minute-time.Since(gone), 2*time.Minute), "PlegDown firing for "+b.name, func() error {
		if st, err := prom.alertState("PlegDown", a.name); err != nil || st != "" {
			t.Fatalf("PlegDown %q for %s, whose pleg kept answering (%v)", st, a.name, err)
		}
		st, err := prom.alertState("PlegDown", b.name)
		if err != nil {
			return err
		}
		if st != "firing" {
			return fmt.Errorf("PlegDown %q", st)
		}
		return nil
	})
	fired := time.Since(gone)
	c.Kubectl(t, "-n", "pleg-system", "patch", "daemonset", "pleg-crio", "--type", "json",
		"-p", `[{"op": "remove", "path": "/spec/template/spec/nodeSelector/pleg-e2e~1hold"}]`)
	back := time.Now()
	waitFor(t, 3*time.Minute, "the pleg pod back on "+b.name+", PlegDown resolved", func() error {
		if err := podsReadyOnNodes(c, "pleg-system", owners); err != nil {
			return err
		}
		st, err := prom.alertState("PlegDown", b.name)
		if err != nil {
			return err
		}
		if st != "" {
			return fmt.Errorf("PlegDown %q", st)
		}
		return nil
	})
	measureOn(t, b.k.env, "cluster_prometheus discovery_to_both_targets_up=%v pleg_pod_gone_to_PlegDown_firing=%v (rule: for 5m, scrape 15s) hold_released_to_pod_ready_and_resolved=%v node=%s",
		discovered.Round(100*time.Millisecond), fired.Round(time.Second), time.Since(back).Round(100*time.Millisecond), b.name)
}

// clusterForecastOnNode stops n's runtime and waits for the forecast's
// condition, then the kubelet's "PLEG is not healthy", on n's Node.
func clusterForecastOnNode(t *testing.T, c *cluster, n *clusterNode) {
	pid := containerdPid(t, n.k.env)
	stopped := time.Now()
	sigstop(t, pid)
	var atRisk nodeCondition
	waitFor(t, 2*time.Minute, "KubeletPLEGAtRisk True on "+n.name, func() error {
		node, err := c.node(n.name)
		if err != nil {
			return err
		}
		cond, _ := node.condition("KubeletPLEGAtRisk")
		if cond.Status != "True" {
			return fmt.Errorf("KubeletPLEGAtRisk %q (%s: %s)", cond.Status, cond.Reason, cond.Message)
		}
		atRisk = cond
		return nil
	})
	forecastAfter := time.Since(stopped)
	t.Logf("on the Node %s, %v after its runtime stopped: KubeletPLEGAtRisk True, %s: %s", n.name, forecastAfter.Round(100*time.Millisecond), atRisk.Reason, atRisk.Message)
	if atRisk.Reason != "KubeletPLEGWillReportNotHealthy" {
		t.Errorf("KubeletPLEGAtRisk reason %q, want the plugin's KubeletPLEGWillReportNotHealthy", atRisk.Reason)
	}
	var notReady nodeCondition
	var firstNotReady time.Duration // when the Node was first seen not Ready, for whatever reason
	// The Node's Ready message lags the kubelet's 3m threshold: with the
	// runtime stopped, the kubelet's node status update waits on runtime
	// calls of its own (2m request timeout). Seen at 4m11s-4m16s.
	waitFor(t, 8*time.Minute, "the kubelet's Ready condition on "+n.name+" saying PLEG is not healthy", func() error {
		node, err := c.node(n.name)
		if err != nil {
			return err
		}
		cond, _ := node.condition("Ready")
		if cond.Status != "True" && firstNotReady == 0 {
			firstNotReady = time.Since(stopped)
			t.Logf("the Node %s not Ready %v after its runtime stopped: %s", n.name, firstNotReady.Round(100*time.Millisecond), cond.Message)
		}
		if cond.Status == "True" || !strings.Contains(cond.Message, "PLEG is not healthy") {
			return fmt.Errorf("Ready %q: %s", cond.Status, cond.Message)
		}
		notReady = cond
		return nil
	})
	kubeletAfter := time.Since(stopped)
	t.Logf("kubectl describe node %s (runtime stopped %v ago):\n%s", n.name, kubeletAfter.Round(time.Second), c.Kubectl(t, "describe", "node", n.name))
	sigcont(t, pid)
	continued := time.Now()
	waitFor(t, 3*time.Minute, "the forecast and the kubelet clear on "+n.name, func() error {
		return nodeConditions(c, n.name, map[string]string{"KubeletPLEGAtRisk": "False", "Ready": "True"})
	})
	measureOn(t, n.k.env, "cluster_forecast_on_node node=%s case=runtime-stopped node_condition_KubeletPLEGAtRisk_after=%v node_not_Ready_after=%v node_Ready_says_PLEG_not_healthy_after=%v lead=%v both_clear_after_continue=%v ready_message=%q",
		n.name, forecastAfter.Round(100*time.Millisecond), firstNotReady.Round(100*time.Millisecond), kubeletAfter.Round(100*time.Millisecond), (kubeletAfter - forecastAfter).Round(100*time.Millisecond),
		time.Since(continued).Round(100*time.Millisecond), notReady.Message)
}

// podsReadyOnNodes checks that namespace ns has exactly one pod on each
// node of owners, owned by the DaemonSet owners names, Running and Ready.
func podsReadyOnNodes(c *cluster, ns string, owners map[string]string) error {
	var pods k8sPodList
	if err := c.getJSON(&pods, "pods", "-n", ns); err != nil {
		return err
	}
	seen := map[string]int{}
	for _, p := range pods.Items {
		node := p.Spec.NodeName
		want, ok := owners[node]
		if !ok {
			return fmt.Errorf("pod %s on node %q, which is none of ours", p.Metadata.Name, node)
		}
		seen[node]++
		if len(p.Metadata.OwnerReferences) != 1 || p.Metadata.OwnerReferences[0].Kind != "DaemonSet" || p.Metadata.OwnerReferences[0].Name != want {
			return fmt.Errorf("pod %s on %s is owned by %+v, want DaemonSet %s", p.Metadata.Name, node, p.Metadata.OwnerReferences, want)
		}
		ready := false
		for _, cond := range p.Status.Conditions {
			ready = ready || (cond.Type == "Ready" && cond.Status == "True")
		}
		if p.Status.Phase != "Running" || !ready {
			return fmt.Errorf("pod %s on %s: phase %s, Ready %v", p.Metadata.Name, node, p.Status.Phase, ready)
		}
	}
	for node := range owners {
		if seen[node] != 1 {
			return fmt.Errorf("%d pods on node %s, want 1", seen[node], node)
		}
	}
	return nil
}

// nodeConditions checks the Node's conditions' statuses.
func nodeConditions(c *cluster, name string, want map[string]string) error {
	n, err := c.node(name)
	if err != nil {
		return err
	}
	for typ, status := range want {
		cond, ok := n.condition(typ)
		if !ok {
			return fmt.Errorf("no %s condition", typ)
		}
		if cond.Status != status {
			return fmt.Errorf("%s %s (%s: %s), want %s", typ, cond.Status, cond.Reason, cond.Message, status)
		}
	}
	return nil
}

// npdImage is a stand-in for node-problem-detector's image, under the
// reference deploy/npd's DaemonSet names: the real node-problem-detector
// (test/npd/provision.sh builds it) at /node-problem-detector, on busybox
// (the plugin's rules run /bin/sh, which NPD's image has).
func npdImage(t testing.TB) ociArchive {
	t.Helper()
	root := baseEnv.repoRoot
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "npd", "provision.sh"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("test/npd/provision.sh: %v\n%s", err, out.String())
	}
	cache := os.Getenv("PLEG_NPD_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache", "npd")
	}
	bin, err := os.ReadFile(filepath.Join(cache, "bin", "node-problem-detector"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, npdManifest))
	if err != nil {
		t.Fatal(err)
	}
	var ref string
	for _, line := range strings.Split(string(manifest), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "image:"); ok && strings.Contains(v, "node-problem-detector:") {
			ref = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	if ref == "" {
		t.Fatalf("%s names no node-problem-detector image", npdManifest)
	}
	files, _, err := busyboxBase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, ocilayout.File{Path: "/node-problem-detector", Mode: 0o755, Data: bin})
	archive := filepath.Join(runHome().dir, "npd-image.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	err = ocilayout.Write(f, ocilayout.Options{
		Architecture: goruntime.GOARCH,
		Files:        files,
		Images:       []ocilayout.Image{{Name: ref, Entrypoint: []string{"/node-problem-detector"}}},
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return ociArchive{archive, ref}
}

// plegCluster is a cluster with pleg installed: the containerd node a,
// the CRI-O node b, and the DaemonSet owning pleg's pod on each node.
type plegCluster struct {
	c      *cluster
	a, b   *clusterNode
	owners map[string]string // node -> DaemonSet
	ready  time.Duration     // from kubectl apply to both pods Ready
}

// installPleg starts the cluster and its two nodes (with the pleg image
// and node-problem-detector's preloaded) and installs pleg as
// deploy/README.md does: the CRI-O node labelled, pleg.yaml and the
// overlay deploy/kubernetes-crio applied; it waits until one pleg pod per
// node is Ready. tags are more references of the pleg image, in both
// runtimes beside its own (the same archive: CRI-O's storage gets it
// under each before CRI-O starts, containerd tags the imported image),
// for a DaemonSet's image changed to another tag of the same build.
func installPleg(t *testing.T, tags ...string) plegCluster {
	t.Helper()
	img := PlegImage(t)
	npd := npdImage(t)
	c := startCluster(t)
	preload := []ociArchive{{img.archive, img.ref}, npd}
	crioPreload := slices.Clone(preload)
	for _, tag := range tags {
		crioPreload = append(crioPreload, ociArchive{img.archive, tag})
	}
	a := c.addNode(t, 0, clusterContainerdNode, ClusterRuntimes[0], preload)
	for _, tag := range tags {
		if err := a.k.env.tagImage(img.ref, tag); err != nil {
			t.Fatalf("node %s: %v", a.name, err)
		}
	}
	b := c.addNode(t, 1, clusterCRIONode, ClusterRuntimes[1], crioPreload)
	if len(tags) > 0 {
		// importArchive checks that CRI-O's storage has them.
		if err := b.k.env.importArchive(img.archive, tags...); err != nil {
			t.Fatalf("node %s: %v", b.name, err)
		}
	}
	for _, n := range []*clusterNode{a, b} {
		if err := nodeReachable(n); err != nil {
			t.Fatalf("node %s is not reachable from the host: %v", n.name, err)
		}
	}
	waitNodesReady(t, c, a, b)
	t.Logf("kubectl get nodes -o wide:\n%s", c.Kubectl(t, "get", "nodes", "-o", "wide"))

	// 1. pleg, as deploy/README.md installs it.
	c.Kubectl(t, "label", "node", b.name, crioNodeLabel)
	applied := time.Now()
	t.Logf("kubectl apply -f deploy/kubernetes/pleg.yaml:\n%s", c.Kubectl(t, "apply", "-f", manifestPath))
	t.Logf("kubectl apply -k deploy/kubernetes-crio:\n%s", c.Kubectl(t, "apply", "-k", "deploy/kubernetes-crio"))
	owners := map[string]string{a.name: "pleg", b.name: "pleg-crio"}
	waitFor(t, 3*time.Minute, "one pleg pod per node, Ready", func() error {
		return podsReadyOnNodes(c, "pleg-system", owners)
	})
	return plegCluster{c: c, a: a, b: b, owners: owners, ready: time.Since(applied)}
}

// cadvisorGaveUp is what the kubelet's cAdvisor logs for each container
// cgroup on the machine that it could not make a handler for.
const cadvisorGaveUp = "Failed to create existing container"

// waitNodesReady waits until every node is registered and Ready: within
// 2 minutes, or for as long as a node's kubelet's cAdvisor keeps making
// progress on its start, up to 15 minutes.
//
// On a machine of its own a node is Ready in seconds. Here the nodes
// share the machine's cgroup tree with the other suites' runtimes, and a
// kubelet counts its runtime as up only once its cAdvisor has started:
// that start walks the whole tree twice (its recovery, then its watcher's
// first pass), and on the CRI-O node its CRI-O handler asks the node's
// CRI-O about every crio-<id> cgroup, 3.1 s for each the node's CRI-O does
// not know (five tries). With the e2e suite's CRI-O tests beside (40+
// containers), that was minutes of NotReady ("container runtime status
// check may not have completed yet"): TestClusterUpgrade failed in CI.
// Turning cAdvisor's discovery off (PodAndContainerStatsFromCRI) is no
// way out with CRI-O 1.36.3: its ListPodSandboxStats dereferences the
// stats of a container whose cgroup is gone, and it crashed under the
// churn of TestClusterUpgrade (cri-o/cri-o#10206, fixed after 1.36.3).
// So the wait is bounded by the cause's progress, and its length logged.
func waitNodesReady(t testing.TB, c *cluster, nodes ...*clusterNode) {
	t.Helper()
	const stall, limit = 2 * time.Minute, 15 * time.Minute
	start := time.Now()
	progress, given := start, 0
	logs := make([]logCount, len(nodes))
	for i, n := range nodes {
		logs[i] = logCount{path: n.k.logPath, marker: []byte(cadvisorGaveUp)}
	}
	for {
		var notReady error
		for _, n := range nodes {
			node, err := c.node(n.name)
			if err != nil {
				notReady = err
				break
			}
			if r, _ := node.condition("Ready"); r.Status != "True" {
				notReady = fmt.Errorf("node %s Ready %q: %s", n.name, r.Status, r.Message)
				break
			}
		}
		gaveUp := 0
		for i := range logs {
			gaveUp += logs[i].update()
		}
		if gaveUp > given {
			given, progress = gaveUp, time.Now()
		}
		switch {
		case notReady == nil:
			if d := time.Since(start); given > 0 || d > 30*time.Second {
				t.Logf("both nodes Ready after %v; their kubelets' cAdvisor gave up %d container cgroups their runtimes do not know (other suites' CRI-O containers, 3.1 s each on the CRI-O node)", d.Round(time.Second), given)
			}
			return
		case time.Since(progress) > stall:
			t.Fatalf("both nodes registered and Ready: still not so %v after the last progress of the kubelets' cAdvisor start (%d containers given up): %v", stall, given, notReady)
		case time.Since(start) > limit:
			t.Fatalf("both nodes registered and Ready: still not so after %v (%d containers given up by the kubelets' cAdvisor): %v", limit, given, notReady)
		}
		time.Sleep(time.Second)
	}
}

// logCount counts a marker's lines in a growing log, reading on from
// where it stopped: a kubelet's log at -v=4 grows by megabytes a minute.
type logCount struct {
	path   string
	marker []byte
	off    int64
	part   []byte // the last line read, not ended yet
	n      int
}

// update reads what the log gained and returns the count so far.
func (c *logCount) update() int {
	f, err := os.Open(c.path)
	if err != nil {
		return c.n
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, c.off, 1<<62))
	c.off += int64(len(b))
	b = append(c.part, b...)
	end := bytes.LastIndexByte(b, '\n') + 1
	c.n += bytes.Count(b[:end], c.marker)
	c.part = append(c.part[:0], b[end:]...)
	return c.n
}

package deploy

// npd/node-problem-detector.yaml and npd/kustomization.yaml: NPD as a
// DaemonSet with its RBAC and the ConfigMap of pleg's plugin, for clusters
// without NPD (`kubectl apply -k deploy/npd`).

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// npdImage is the image the DaemonSet runs: NPD's release whose plugin
// protocol and exporter the plugin config and the RBAC were checked
// against (test/npd builds the same version).
const npdImage = "registry.k8s.io/node-problem-detector/node-problem-detector:v1.36.0"

// npdObjects returns npd/node-problem-detector.yaml's objects by kind.
func npdObjects(t *testing.T) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, d := range decodeYAML(t, "npd/node-problem-detector.yaml") {
		kind := str(t, d, "kind")
		if out[kind] != nil {
			t.Fatalf("npd/node-problem-detector.yaml: two %s objects", kind)
		}
		out[kind] = d
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"} {
		if out[kind] == nil {
			t.Fatalf("no %s in npd/node-problem-detector.yaml (kinds: %v)", kind, slices.Sorted(maps.Keys(out)))
		}
	}
	return out
}

// byName returns the member of a list of named objects (containers,
// volumes, mounts) named name, or nil.
func byName(l []any, name string) object {
	for _, x := range l {
		if o, ok := x.(object); ok && o["name"] == name {
			return o
		}
	}
	return nil
}

// containsPatch reports where got lacks something patch sets, as a
// strategic merge of patch into got would find it: maps by key, lists of
// named objects by name (the merge key of containers, volumes and mounts),
// lists of strings as sets (args: the DaemonSet may have more).
func containsPatch(got, patch any, where string) []string {
	switch p := patch.(type) {
	case object:
		g, ok := got.(object)
		if !ok {
			return []string{fmt.Sprintf("%s: %v, want a mapping", where, got)}
		}
		var diffs []string
		for _, k := range slices.Sorted(maps.Keys(p)) {
			if _, ok := g[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s.%s: missing, the patch sets %v", where, k, p[k]))
				continue
			}
			diffs = append(diffs, containsPatch(g[k], p[k], where+"."+k)...)
		}
		return diffs
	case []any:
		g, ok := got.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v, want a list", where, got)}
		}
		var diffs []string
		for _, x := range p {
			if o, ok := x.(object); ok && o["name"] != nil {
				name := fmt.Sprint(o["name"])
				if m := byName(g, name); m == nil {
					diffs = append(diffs, fmt.Sprintf("%s: no %s", where, name))
				} else {
					diffs = append(diffs, containsPatch(m, o, where+"["+name+"]")...)
				}
				continue
			}
			if !slices.ContainsFunc(g, func(y any) bool { return reflect.DeepEqual(x, y) }) {
				diffs = append(diffs, fmt.Sprintf("%s: no %v", where, x))
			}
		}
		return diffs
	default:
		if !reflect.DeepEqual(got, patch) {
			return []string{fmt.Sprintf("%s: %v, the patch sets %v", where, got, patch)}
		}
		return nil
	}
}

// TestNPDDaemonSetHasPatch: the DaemonSet has everything
// node-problem-detector-patch.yaml adds to an NPD already running, so that
// the two installs run the plugin alike.
func TestNPDDaemonSetHasPatch(t *testing.T) {
	ds := npdObjects(t)["DaemonSet"]
	patch := decodeYAML(t, "npd/node-problem-detector-patch.yaml")[0]
	for _, d := range containsPatch(ds, patch, "DaemonSet") {
		t.Error(d)
	}
	// The patch's own comment names the DaemonSet it patches.
	b, err := os.ReadFile("npd/node-problem-detector-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("kubectl -n %s patch daemonset %s", str(t, ds, "metadata.namespace"), str(t, ds, "metadata.name"))
	if !strings.Contains(string(b), cmd) {
		t.Errorf("node-problem-detector-patch.yaml does not say %q: it patches another DaemonSet than this one", cmd)
	}
}

// TestNPDDaemonSet: NPD runs the plugin config where the ConfigMap puts
// it, the plugin's pleg binary where the init container copies it, on
// every node's network, named after its node, reporting to the API server
// with its service account.
func TestNPDDaemonSet(t *testing.T) {
	objs := npdObjects(t)
	ds := objs["DaemonSet"]
	if str(t, ds, "apiVersion") != "apps/v1" || str(t, ds, "metadata.name") != "node-problem-detector" ||
		str(t, ds, "metadata.namespace") != "kube-system" {
		t.Errorf("the DaemonSet is %s %s/%s, want apps/v1 kube-system/node-problem-detector", at(t, ds, "apiVersion"),
			at(t, ds, "metadata.namespace"), at(t, ds, "metadata.name"))
	}
	pod := at(t, ds, "spec.template").(object)
	podLabels := at(t, pod, "metadata.labels").(object)
	for k, v := range at(t, ds, "spec.selector.matchLabels").(object) {
		if podLabels[k] != v {
			t.Errorf("the selector %s=%v does not match the pods' labels %v", k, v, podLabels)
		}
	}
	spec := at(t, pod, "spec").(object)
	if spec["hostNetwork"] != true {
		t.Error("NPD is not on the host's network: its plugin cannot reach pleg on 127.0.0.1")
	}
	// On every node: a toleration of every taint (not-ready, unreachable,
	// control plane, ...).
	everything := false
	for _, tol := range list(t, spec, "tolerations") {
		o := tol.(object)
		if o["operator"] == "Exists" && o["key"] == nil && o["effect"] == nil {
			everything = true
		}
	}
	if !everything {
		t.Errorf("tolerations %v: want one of every taint (operator Exists, no key, no effect)", spec["tolerations"])
	}

	// The service account the RBAC binds, its token mounted.
	sa := objs["ServiceAccount"]
	if str(t, spec, "serviceAccountName") != str(t, sa, "metadata.name") ||
		str(t, sa, "metadata.namespace") != str(t, ds, "metadata.namespace") {
		t.Error("the pods do not run as the ServiceAccount defined")
	}
	if spec["automountServiceAccountToken"] == false || sa["automountServiceAccountToken"] == false {
		t.Error("the service account's token is not mounted: NPD's exporter has no credentials")
	}

	containers := list(t, spec, "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers, want NPD's", len(containers))
	}
	c := containers[0].(object)
	if got := str(t, c, "image"); got != npdImage {
		t.Errorf("NPD's image %q, want %s", got, npdImage)
	}
	if got := fmt.Sprint(list(t, c, "command")); got != "[/node-problem-detector]" {
		t.Errorf("command %s, want NPD's binary /node-problem-detector", got)
	}
	args := list(t, c, "args")
	// In-cluster configuration and the exporter on (NPD's defaults).
	for _, a := range args {
		s := fmt.Sprint(a)
		if strings.HasPrefix(s, "--apiserver-override") || strings.HasPrefix(s, "--enable-k8s-exporter") ||
			strings.HasPrefix(s, "--k8s-exporter-update-node-conditions") || strings.HasPrefix(s, "--hostname-override") {
			t.Errorf("arg %s: the exporter is to run with its defaults (in-cluster config, conditions on, NODE_NAME)", s)
		}
	}
	var nodeName object
	for _, e := range list(t, c, "env") {
		if str(t, e, "name") == "NODE_NAME" {
			nodeName = e.(object)
		}
	}
	if nodeName == nil || str(t, nodeName, "valueFrom.fieldRef.fieldPath") != "spec.nodeName" {
		t.Errorf("env %v does not give NODE_NAME the node's name (NPD names its node after it)", c["env"])
	}

	// The plugin config: --config.custom-plugin-monitor names the file the
	// ConfigMap volume holds under the key the generator makes.
	cfg, ok := flagValue(args, "config.custom-plugin-monitor")
	if !ok {
		t.Fatalf("args %v: no --config.custom-plugin-monitor", args)
	}
	if strings.Contains(cfg, ",") {
		t.Errorf("--config.custom-plugin-monitor=%s: want pleg's config alone", cfg)
	}
	cfgDir, cfgKey := path.Split(cfg)
	cfgVol := mountedVolume(t, spec, c, path.Clean(cfgDir))
	cmName := str(t, cfgVol, "configMap.name")
	gen := npdGenerator(t, cmName)
	keys := []string{}
	for _, f := range gen.Files {
		key, file, ok := strings.Cut(f, "=")
		if !ok {
			key, file = filepath.Base(f), f
		}
		keys = append(keys, key)
		if key == cfgKey && filepath.Clean(filepath.Join("npd", file)) != filepath.Clean("npd/pleg-plugin-monitor.json") {
			t.Errorf("the ConfigMap's %s is %s, not pleg-plugin-monitor.json", key, file)
		}
	}
	if !slices.Contains(keys, cfgKey) {
		t.Errorf("NPD reads %s; the ConfigMap %s holds %v", cfg, cmName, keys)
	}

	// The plugin's pleg binary: in the volume the init container copies
	// it into, from the pleg image's path.
	c0 := loadNPD(t)
	bin, _ := npdPlegCommand(c0.Rules[0].Path, c0.Rules[0].Args)
	binVol := mountedVolume(t, spec, c, path.Dir(bin))
	inits := list(t, spec, "initContainers")
	copied := false
	for _, ic := range inits {
		cmd := list(t, ic, "command")
		if fmt.Sprint(cmd) != fmt.Sprintf("[cp /usr/local/bin/pleg %s]", bin) {
			continue
		}
		for _, m := range list(t, ic, "volumeMounts") {
			if m.(object)["name"] == binVol["name"] && m.(object)["mountPath"] == path.Dir(bin) {
				copied = true
			}
		}
	}
	if !copied {
		t.Errorf("no init container copies pleg to %s in the volume %s", bin, binVol["name"])
	}

	// No privilege: the plugin only runs a program.
	for _, x := range append(slices.Clone(containers), inits...) {
		sc, _ := x.(object)["securityContext"].(object)
		if sc["privileged"] == true || sc["allowPrivilegeEscalation"] != false || fmt.Sprint(at(t, sc, "capabilities.drop")) != "[ALL]" {
			t.Errorf("%s: securityContext %v, want unprivileged, no escalation, every capability dropped", x.(object)["name"], sc)
		}
	}
	if psc, _ := spec["securityContext"].(object); psc["runAsNonRoot"] != true {
		t.Errorf("the pod's securityContext %v: want runAsNonRoot", psc)
	}

	// Its Prometheus endpoint on the node's addresses, on NPD's default
	// port, which the container port and the annotations name.
	if a, _ := flagValue(args, "prometheus-address"); a != "0.0.0.0" {
		t.Errorf("--prometheus-address=%q, want 0.0.0.0 (NPD's default, 127.0.0.1, is the node's loopback here)", a)
	}
	port := "20257"
	if p, ok := flagValue(args, "prometheus-port"); ok {
		port = p
	}
	ports := list(t, c, "ports")
	if len(ports) != 1 || fmt.Sprint(num(t, ports[0], "containerPort")) != port {
		t.Errorf("container ports %v, want NPD's Prometheus port %s", ports, port)
	}
	if ann := at(t, pod, "metadata.annotations").(object); ann["prometheus.io/port"] != port {
		t.Errorf("prometheus.io/port %v, want %s", ann["prometheus.io/port"], port)
	}
}

// mountedVolume returns the volume mounted in c at dir.
func mountedVolume(t *testing.T, spec, c object, dir string) object {
	t.Helper()
	for _, m := range list(t, c, "volumeMounts") {
		if str(t, m, "mountPath") == dir {
			v := byName(list(t, spec, "volumes"), str(t, m, "name"))
			if v == nil {
				t.Fatalf("no volume %s (mounted at %s)", str(t, m, "name"), dir)
			}
			return v
		}
	}
	t.Fatalf("nothing is mounted at %s", dir)
	return nil
}

// npdGenerator returns npd/kustomization.yaml's generator of the
// ConfigMap name, in the DaemonSet's namespace, named without a hash.
func npdGenerator(t *testing.T, name string) configMapGenerator {
	t.Helper()
	k := loadKustomization(t, "npd")
	for _, g := range k.ConfigMapGenerator {
		if g.Name != name {
			continue
		}
		if ns := str(t, npdObjects(t)["DaemonSet"], "metadata.namespace"); g.Namespace != ns {
			t.Errorf("the ConfigMap %s is generated in the namespace %q, the DaemonSet is in %s", name, g.Namespace, ns)
		}
		if !g.Options.DisableNameSuffixHash {
			t.Errorf("the ConfigMap %s gets a hash suffix: the DaemonSet and node-problem-detector-patch.yaml name it %s", name, name)
		}
		for _, f := range g.Files {
			_, file, ok := strings.Cut(f, "=")
			if !ok {
				file = f
			}
			if !filepath.IsLocal(file) {
				t.Errorf("the ConfigMap's file %s is not in npd/ (kustomize refuses it)", file)
			} else if _, err := os.Stat(filepath.Join("npd", file)); err != nil {
				t.Errorf("the ConfigMap's file: %v", err)
			}
		}
		return g
	}
	t.Fatalf("npd/kustomization.yaml generates no ConfigMap %s", name)
	return configMapGenerator{}
}

// TestNPDKustomization: `kubectl apply -k deploy/npd` applies
// node-problem-detector.yaml and the ConfigMap of pleg-plugin-monitor.json.
func TestNPDKustomization(t *testing.T) {
	k := loadKustomization(t, "npd")
	if !slices.Equal(k.Resources, []string{"node-problem-detector.yaml"}) {
		t.Errorf("npd's resources %v, want [node-problem-detector.yaml]", k.Resources)
	}
	if len(k.Patches) != 0 || len(k.ConfigMapGenerator) != 1 {
		t.Errorf("npd/kustomization.yaml: %d patches, %d generators; want no patch and the ConfigMap", len(k.Patches), len(k.ConfigMapGenerator))
	}
	// The name node-problem-detector-patch.yaml's volume uses, too.
	patch := decodeYAML(t, "npd/node-problem-detector-patch.yaml")[0]
	name := str(t, byName(list(t, patch, "spec.template.spec.volumes"), "pleg-config"), "configMap.name")
	npdGenerator(t, name)
}

// TestNPDKustomize: kubectl's kustomize renders npd/ into the objects of
// node-problem-detector.yaml and the ConfigMap holding
// pleg-plugin-monitor.json as it is.
func TestNPDKustomize(t *testing.T) {
	objs := kubectlKustomize(t, "npd")
	want := map[string]object{}
	for _, o := range decodeYAML(t, "npd/node-problem-detector.yaml") {
		want[objectID(o)] = o
	}
	cfg, err := os.ReadFile("npd/pleg-plugin-monitor.json")
	if err != nil {
		t.Fatal(err)
	}
	configMaps := 0
	for _, o := range objs {
		if o["kind"] == "ConfigMap" {
			configMaps++
			if id := objectID(o); id != "v1 ConfigMap kube-system/npd-pleg" {
				t.Errorf("the ConfigMap is %s, want kube-system/npd-pleg", id)
			}
			if got := at(t, o, "data").(object)["pleg-plugin-monitor.json"]; got != string(cfg) {
				t.Errorf("the ConfigMap's pleg-plugin-monitor.json differs from the file")
			}
			continue
		}
		w, ok := want[objectID(o)]
		if !ok {
			t.Errorf("kubectl kustomize npd renders %s, which node-problem-detector.yaml does not have", objectID(o))
			continue
		}
		delete(want, objectID(o))
		if !reflect.DeepEqual(o, w) {
			t.Errorf("kubectl kustomize npd changed %s", objectID(o))
		}
	}
	if configMaps != 1 || len(want) != 0 {
		t.Errorf("%d ConfigMaps; missing %v", configMaps, slices.Sorted(maps.Keys(want)))
	}
}

// npdAPICalls are the calls NPD v1.36.0's Kubernetes exporter makes, as
// (resource, verb) in the core API group. Read from the source, not
// copied: pkg/exporters/k8sexporter/problemclient/problem_client.go gets
// its node (GetNode, at start and for GetConditions), patches the node's
// status (SetConditions: Nodes().PatchStatus) and records events through
// client-go's tools/record, whose sink creates an event and patches it
// when it repeats (recordEvent in k8s.io/client-go v0.35.6, which v1.36.0 requires;
// tools/record/event.go: sink.Create and sink.Patch, never Update).
var npdAPICalls = [][2]string{
	{"nodes", "get"},
	{"nodes/status", "patch"},
	{"events", "create"},
	{"events", "patch"},
}

// TestNPDRBAC: the ClusterRole grants the exporter's calls and nothing
// more, and is bound to the DaemonSet's service account.
func TestNPDRBAC(t *testing.T) {
	objs := npdObjects(t)
	role := objs["ClusterRole"]
	granted := map[[2]string]bool{}
	for _, r := range list(t, role, "rules") {
		groups := list(t, r, "apiGroups")
		if len(groups) != 1 || groups[0] != "" {
			t.Errorf("rule %v: apiGroups %v, want the core group alone", r, groups)
		}
		for _, res := range list(t, r, "resources") {
			for _, v := range list(t, r, "verbs") {
				if res == "*" || v == "*" {
					t.Errorf("rule %v grants *", r)
				}
				granted[[2]string{fmt.Sprint(res), fmt.Sprint(v)}] = true
			}
		}
	}
	for _, call := range npdAPICalls {
		if !granted[call] {
			t.Errorf("the ClusterRole does not grant %s on %s, which NPD's exporter does", call[1], call[0])
		}
		delete(granted, call)
	}
	for g := range granted {
		t.Errorf("the ClusterRole grants %s on %s, which NPD's exporter does not do", g[1], g[0])
	}

	b := objs["ClusterRoleBinding"]
	if str(t, b, "roleRef.kind") != "ClusterRole" || str(t, b, "roleRef.name") != str(t, role, "metadata.name") ||
		str(t, b, "roleRef.apiGroup") != "rbac.authorization.k8s.io" {
		t.Errorf("the binding's roleRef %v is not the ClusterRole %s", at(t, b, "roleRef"), str(t, role, "metadata.name"))
	}
	sa := objs["ServiceAccount"]
	subjects := list(t, b, "subjects")
	if len(subjects) != 1 || str(t, subjects[0], "kind") != "ServiceAccount" ||
		str(t, subjects[0], "name") != str(t, sa, "metadata.name") ||
		str(t, subjects[0], "namespace") != str(t, sa, "metadata.namespace") {
		t.Errorf("the binding's subjects %v, want the ServiceAccount %s/%s alone", subjects,
			str(t, sa, "metadata.namespace"), str(t, sa, "metadata.name"))
	}
}

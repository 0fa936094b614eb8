package deploy

// The overlay kubernetes-crio: the DaemonSet pleg-crio, pleg.yaml's
// DaemonSet on CRI-O's socket for the nodes labelled
// pleg.podlifecycle.io/runtime=cri-o, beside pleg.yaml's own, which stays
// off those nodes. Its base is the directory kubernetes (whose
// kustomization lists pleg.yaml). These tests render the overlay as
// kustomize would (the few kinds of resource and patch it uses, below) and
// check that the two DaemonSets split the nodes between them; when kubectl
// is at hand they also render it with kubectl's kustomize and compare.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/podlifecycle/pleg/internal/jsonpatch"
)

// runtimeLabel is the node label that marks CRI-O's nodes.
const (
	runtimeLabel = "pleg.podlifecycle.io/runtime"
	crioValue    = "cri-o"
)

// kustomization is the part of kustomization.yaml the deploy files use;
// decoding it with KnownFields catches a misspelt field, which kustomize
// would refuse.
type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Resources  []string `yaml:"resources"`
	Patches    []struct {
		Path   string `yaml:"path"`
		Patch  string `yaml:"patch"`
		Target *struct {
			Group     string `yaml:"group"`
			Version   string `yaml:"version"`
			Kind      string `yaml:"kind"`
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"target"`
		Options map[string]bool `yaml:"options"`
	} `yaml:"patches"`
	ConfigMapGenerator []configMapGenerator `yaml:"configMapGenerator"`
}

// configMapGenerator is one ConfigMap a kustomization generates.
type configMapGenerator struct {
	Name      string   `yaml:"name"`
	Namespace string   `yaml:"namespace"`
	Files     []string `yaml:"files"` // file or key=file
	Options   struct {
		DisableNameSuffixHash bool              `yaml:"disableNameSuffixHash"`
		Labels                map[string]string `yaml:"labels"`
	} `yaml:"options"`
}

func loadKustomization(t *testing.T, dir string) kustomization {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("%s/kustomization.yaml: apiVersion %q, kind %q", dir, k.APIVersion, k.Kind)
	}
	// A file it loads is inside its directory: kustomize refuses any
	// other. A directory is a base, which may be elsewhere but not contain
	// this directory: kustomize refuses that as a cycle.
	for _, f := range k.Resources {
		if isDir(filepath.Join(dir, f)) {
			if rel, err := filepath.Rel(filepath.Join(dir, f), dir); err == nil && filepath.IsLocal(rel) {
				t.Errorf("%s/kustomization.yaml: the base %s contains the directory (kustomize refuses it: a cycle)", dir, f)
			}
		} else if !filepath.IsLocal(f) {
			t.Errorf("%s/kustomization.yaml: resource %s is not in the directory (kustomize refuses it)", dir, f)
		}
	}
	return k
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// decodeDocs decodes every document of YAML text.
func decodeDocs(t *testing.T, where string, b []byte) []object {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []object
	for {
		var doc object
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

// objectID is how kustomize tells resources apart.
func objectID(o object) string {
	meta, _ := o["metadata"].(object)
	ns, _ := meta["namespace"].(string)
	return fmt.Sprintf("%v %v %s/%v", o["apiVersion"], o["kind"], ns, meta["name"])
}

// mergePatch merges a strategic-merge patch that holds no lists into dst:
// maps merge, null removes the field, anything else replaces it.
func mergePatch(t *testing.T, dst, patch object) {
	t.Helper()
	for k, v := range patch {
		switch v := v.(type) {
		case nil:
			delete(dst, k)
		case object:
			d, ok := dst[k].(object)
			if !ok {
				d = object{}
				dst[k] = d
			}
			mergePatch(t, d, v)
		case []any:
			t.Fatalf("the patch sets the list %s: lists merge by their own rules, which this test does not know", k)
		default:
			dst[k] = v
		}
	}
}

// renderKustomization renders dir's kustomization as kustomize does, for
// what the deploy files use: resources (a file's objects, a directory's
// kustomization rendered), then patches in order, each
// JSON patch (a list of operations) or strategic-merge patch applied to its
// target (the patch's own object without one), "$patch: delete" removing
// its object.
func renderKustomization(t *testing.T, dir string) []object {
	t.Helper()
	k := loadKustomization(t, dir)
	var objs []object
	for _, r := range k.Resources {
		if r := filepath.Join(dir, r); isDir(r) {
			objs = append(objs, renderKustomization(t, r)...)
		} else {
			objs = append(objs, decodeYAML(t, r)...)
		}
	}
	find := func(apiVersion, kind, ns, name string) int {
		for i, o := range objs {
			meta, _ := o["metadata"].(object)
			objNS, _ := meta["namespace"].(string)
			if (apiVersion == "" || o["apiVersion"] == apiVersion) && o["kind"] == kind &&
				objNS == ns && meta["name"] == name {
				return i
			}
		}
		return -1
	}
	for i, p := range k.Patches {
		where := fmt.Sprintf("%s/kustomization.yaml patch %d", dir, i)
		text := []byte(p.Patch)
		if p.Path != "" {
			if !filepath.IsLocal(p.Path) {
				t.Fatalf("%s: %s is not in the directory (kustomize refuses it)", where, p.Path)
			}
			b, err := os.ReadFile(filepath.Join(dir, p.Path))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			text, where = b, where+" ("+p.Path+")"
		}
		target := -1
		if p.Target != nil {
			apiVersion := p.Target.Version
			if p.Target.Group != "" {
				apiVersion = p.Target.Group + "/" + p.Target.Version
			}
			ns := p.Target.Namespace
			if ns == "" {
				// The targets here are namespaced; their namespace is
				// their own file's.
				for _, o := range objs {
					meta, _ := o["metadata"].(object)
					if o["kind"] == p.Target.Kind && meta["name"] == p.Target.Name {
						ns, _ = meta["namespace"].(string)
					}
				}
			}
			if target = find(apiVersion, p.Target.Kind, ns, p.Target.Name); target < 0 {
				t.Fatalf("%s: no %s %s/%s to patch", where, p.Target.Kind, ns, p.Target.Name)
			}
		}
		if ops, err := jsonpatch.Parse(text); err == nil {
			if target < 0 {
				t.Fatalf("%s: a JSON patch needs a target", where)
			}
			if err := jsonpatch.Apply(objs[target], ops); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			continue
		}
		docs := decodeDocs(t, where, text)
		if len(docs) != 1 {
			t.Fatalf("%s: %d documents; one a patch, please (kustomize has mishandled deletions among several)", where, len(docs))
		}
		sm := docs[0]
		if target < 0 {
			ns, _ := at(t, sm, "metadata").(object)["namespace"].(string)
			if target = find(fmt.Sprint(sm["apiVersion"]), fmt.Sprint(sm["kind"]), ns, str(t, sm, "metadata.name")); target < 0 {
				t.Fatalf("%s: no %s to patch", where, objectID(sm))
			}
		}
		if sm["$patch"] == "delete" {
			objs = slices.Delete(objs, target, target+1)
			continue
		}
		if !p.Options["allowNameChange"] {
			at(t, sm, "metadata").(object)["name"] = at(t, objs[target], "metadata.name")
		}
		mergePatch(t, objs[target], sm)
	}
	return objs
}

// kubectlKustomize runs `kubectl kustomize dir` and decodes its output, or
// skips the test without a kubectl: $PLEG_KUBECTL, else the one the
// end-to-end suite builds (../.cache/e2e/kubelet/kubectl), else one on
// $PATH.
func kubectlKustomize(t *testing.T, dir string) []object {
	t.Helper()
	kubectl := os.Getenv("PLEG_KUBECTL")
	if kubectl == "" {
		if _, err := os.Stat("../.cache/e2e/kubelet/kubectl"); err == nil {
			kubectl = "../.cache/e2e/kubelet/kubectl"
		} else if p, err := exec.LookPath("kubectl"); err == nil {
			kubectl = p
		} else {
			t.Skip("no kubectl ($PLEG_KUBECTL, ../.cache/e2e/kubelet/kubectl or on $PATH) to render the kustomization with")
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s kustomize %s: %v\n%s", kubectl, dir, err, stderr.Bytes())
	}
	if v, err := exec.Command(kubectl, "version", "--client").Output(); err == nil {
		t.Logf("%s: %s", kubectl, strings.Join(strings.Fields(string(v)), " "))
	}
	return decodeDocs(t, kubectl+" kustomize "+dir, out)
}

// crioOverlayDir is the overlay, beside its base kubernetes: kustomize
// refuses a base whose directory contains the overlay.
const crioOverlayDir = "kubernetes-crio"

// crioOverlay is the overlay's output, which must be pleg-crio alone.
func crioOverlay(t *testing.T) object {
	t.Helper()
	objs := renderKustomization(t, crioOverlayDir)
	if len(objs) != 1 || objs[0]["kind"] != "DaemonSet" {
		ids := []string{}
		for _, o := range objs {
			ids = append(ids, objectID(o))
		}
		t.Fatalf("%s renders %v, want the DaemonSet pleg-crio alone (pleg.yaml's other objects are pleg.yaml's)", crioOverlayDir, ids)
	}
	return objs[0]
}

// TestCRIOOverlayBase: the overlay's one resource is the directory
// kubernetes, whose kustomization is pleg.yaml alone (no copy of it, no
// patch: `kubectl apply -k kubernetes` is `kubectl apply -f
// kubernetes/pleg.yaml`).
func TestCRIOOverlayBase(t *testing.T) {
	if k := loadKustomization(t, crioOverlayDir); !slices.Equal(k.Resources, []string{"../kubernetes"}) {
		t.Errorf("%s's resources %v, want [../kubernetes]", crioOverlayDir, k.Resources)
	}
	k := loadKustomization(t, "kubernetes")
	if !slices.Equal(k.Resources, []string{"pleg.yaml"}) {
		t.Errorf("kubernetes' resources %v, want [pleg.yaml]", k.Resources)
	}
	if len(k.Patches) != 0 || len(k.ConfigMapGenerator) != 0 {
		t.Error("kubernetes/kustomization.yaml patches or generates objects: it must render pleg.yaml as it is")
	}
}

// TestCRIOOverlay: pleg-crio is pleg.yaml's DaemonSet with the CRI-O patch
// applied, renamed, with a selector of its own, on the nodes labelled
// cri-o; pleg.yaml's DaemonSet is on every other node. Each node runs
// exactly one of the two.
func TestCRIOOverlay(t *testing.T) {
	plegDS := manifestObjects(t)["DaemonSet"]
	ds := crioOverlay(t)

	// What pleg-crio must be: pleg.yaml's DaemonSet with the JSON patch
	// (kubectl patch's too) and the changes below, and nothing else.
	want := deepCopyObject(plegDS)
	b, err := os.ReadFile(crioPatchPath)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := jsonpatch.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := jsonpatch.Apply(want, ops); err != nil {
		t.Fatalf("%s on pleg.yaml: %v", crioPatchPath, err)
	}
	name := str(t, plegDS, "metadata.name") + "-crio"
	at(t, want, "metadata").(object)["name"] = name
	at(t, want, "metadata.labels").(object)[runtimeLabel] = crioValue
	at(t, want, "spec.selector.matchLabels").(object)[runtimeLabel] = crioValue
	at(t, want, "spec.template.metadata.labels").(object)[runtimeLabel] = crioValue
	spec := at(t, want, "spec.template.spec").(object)
	delete(spec, "affinity")
	spec["nodeSelector"] = object{runtimeLabel: crioValue}
	if !reflect.DeepEqual(ds, want) {
		gy, _ := yaml.Marshal(ds)
		wy, _ := yaml.Marshal(want)
		t.Errorf("%s renders\n%s\nwant\n%s", crioOverlayDir, gy, wy)
	}
	if str(t, ds, "metadata.namespace") != str(t, plegDS, "metadata.namespace") {
		t.Error("pleg-crio is not in pleg's namespace")
	}

	// pleg.yaml's DaemonSet: on every node but the labelled ones.
	terms := list(t, plegDS, "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms")
	if len(terms) != 1 {
		t.Fatalf("pleg.yaml's node affinity has %d terms, want one", len(terms))
	}
	exprs := list(t, terms[0], "matchExpressions")
	if len(exprs) != 1 || str(t, exprs[0], "key") != runtimeLabel || str(t, exprs[0], "operator") != "NotIn" ||
		fmt.Sprint(list(t, exprs[0], "values")) != "["+crioValue+"]" {
		t.Errorf("pleg.yaml's node affinity %v, want %s NotIn [%s] alone (a node without the label runs pleg)", exprs, runtimeLabel, crioValue)
	}
	if _, ok := at(t, plegDS, "spec.template.spec").(object)["nodeSelector"]; ok {
		t.Error("pleg.yaml's DaemonSet has a nodeSelector: nodes would run neither DaemonSet")
	}
	// Both select the nodes by the same label the README tells to set.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if cmd := "kubectl label node <name> " + runtimeLabel + "=" + crioValue; !strings.Contains(string(readme), cmd) {
		t.Errorf("README.md does not say %q", cmd)
	}

	// Each DaemonSet's pods carry its selector's labels; pleg-crio's
	// selector is its own, and the pods stay pleg's for the Service.
	for _, d := range []object{plegDS, ds} {
		labels := at(t, d, "spec.template.metadata.labels").(object)
		for k, v := range at(t, d, "spec.selector.matchLabels").(object) {
			if labels[k] != v {
				t.Errorf("%s: selector %s=%v does not match its pods' labels %v", str(t, d, "metadata.name"), k, v, labels)
			}
		}
	}
	if reflect.DeepEqual(at(t, ds, "spec.selector"), at(t, plegDS, "spec.selector")) {
		t.Error("pleg-crio's selector is pleg's")
	}
	svc := manifestObjects(t)["Service"]
	podLabels := at(t, ds, "spec.template.metadata.labels").(object)
	for k, v := range at(t, svc, "spec.selector").(object) {
		if podLabels[k] != v {
			t.Errorf("the Service's selector %s=%v leaves out pleg-crio's pods", k, v)
		}
	}
}

// TestCRIOOverlayDeletes: the overlay leaves out exactly pleg.yaml's
// other objects, so that applying pleg.yaml and the overlay makes one
// Namespace, ServiceAccount and Service and two DaemonSets, and deleting
// the overlay deletes pleg-crio alone.
func TestCRIOOverlayDeletes(t *testing.T) {
	k := loadKustomization(t, crioOverlayDir)
	deleted := map[string]bool{}
	for i, p := range k.Patches {
		if p.Patch == "" {
			continue
		}
		docs := decodeDocs(t, fmt.Sprintf("patch %d", i), []byte(p.Patch))
		if len(docs) == 1 && docs[0]["$patch"] == "delete" {
			deleted[objectID(docs[0])] = true
		}
	}
	var others []string
	for _, o := range decodeYAML(t, "kubernetes/pleg.yaml") {
		if o["kind"] != "DaemonSet" {
			others = append(others, objectID(o))
		}
	}
	if got := slices.Sorted(maps.Keys(deleted)); !slices.Equal(got, slices.Sorted(slices.Values(others))) {
		t.Errorf("the overlay deletes %v; pleg.yaml's objects besides the DaemonSet are %v", got, others)
	}
}

// TestCRIOOverlayKustomize: kubectl's kustomize renders the overlay as
// renderKustomization does.
func TestCRIOOverlayKustomize(t *testing.T) {
	got := kubectlKustomize(t, crioOverlayDir)
	want := crioOverlay(t)
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		gy, _ := yaml.Marshal(got)
		wy, _ := yaml.Marshal(want)
		t.Errorf("kubectl kustomize %s:\n%s\nwant\n%s", crioOverlayDir, gy, wy)
	}
}

// deepCopyObject copies a decoded document.
func deepCopyObject(o object) object {
	var cp func(v any) any
	cp = func(v any) any {
		switch v := v.(type) {
		case object:
			m := object{}
			for k, x := range v {
				m[k] = cp(x)
			}
			return m
		case []any:
			l := make([]any, len(v))
			for i, x := range v {
				l[i] = cp(x)
			}
			return l
		default:
			return v
		}
	}
	return cp(o).(object)
}

package deploy

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// jsonPatchOp is one operation of an RFC 6902 JSON patch.
type jsonPatchOp struct {
	Op    string `yaml:"op"`
	Path  string `yaml:"path"`
	Value any    `yaml:"value"`
}

// applyJSONPatch applies test and replace operations (the only ones the
// CRI-O patch uses) to doc, as kubectl patch --type json does.
func applyJSONPatch(doc any, ops []jsonPatchOp) error {
	for i, op := range ops {
		keys := strings.Split(strings.TrimPrefix(op.Path, "/"), "/")
		parent := doc
		for _, k := range keys[:len(keys)-1] {
			next, err := child(parent, k)
			if err != nil {
				return fmt.Errorf("op %d (%s %s): %w", i, op.Op, op.Path, err)
			}
			parent = next
		}
		last := keys[len(keys)-1]
		cur, err := child(parent, last)
		if err != nil {
			return fmt.Errorf("op %d (%s %s): %w", i, op.Op, op.Path, err)
		}
		switch op.Op {
		case "test":
			if !reflect.DeepEqual(cur, op.Value) {
				return fmt.Errorf("op %d: test %s: %v, want %v", i, op.Path, cur, op.Value)
			}
		case "replace":
			switch p := parent.(type) {
			case map[string]any:
				p[last] = op.Value
			case []any:
				n, _ := strconv.Atoi(last)
				p[n] = op.Value
			}
		default:
			return fmt.Errorf("op %d: %q is not supported here", i, op.Op)
		}
	}
	return nil
}

func child(v any, key string) (any, error) {
	switch c := v.(type) {
	case map[string]any:
		next, ok := c[key]
		if !ok {
			return nil, fmt.Errorf("no %q", key)
		}
		return next, nil
	case []any:
		n, err := strconv.Atoi(key)
		if err != nil || n < 0 || n >= len(c) {
			return nil, fmt.Errorf("no index %q", key)
		}
		return c[n], nil
	}
	return nil, fmt.Errorf("cannot descend into %T at %q", v, key)
}

// TestCRIOPatch: kubernetes/pleg-crio-patch.yaml, applied to the
// DaemonSet, points pleg at CRI-O's socket inside a read-only mount of the
// socket's directory, /var/run/crio, and changes nothing else; its tests
// hold on today's manifest (they make kubectl refuse the patch if the
// args or mounts move).
func TestCRIOPatch(t *testing.T) {
	b, err := os.ReadFile("kubernetes/pleg-crio-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ops []jsonPatchOp
	if err := yaml.Unmarshal(b, &ops); err != nil {
		t.Fatalf("pleg-crio-patch.yaml: %v", err)
	}
	ds := manifestObjects(t)["DaemonSet"]
	before := fmt.Sprint(ds)
	if err := applyJSONPatch(ds, ops); err != nil {
		t.Fatalf("applying pleg-crio-patch.yaml to the DaemonSet: %v", err)
	}
	c := plegContainer(t, ds)
	if ep, _ := flagValue(list(t, c, "args"), "container-runtime-endpoint"); ep != "unix:///var/run/crio/crio.sock" {
		t.Errorf("endpoint %q after the patch, want unix:///var/run/crio/crio.sock", ep)
	}
	m := at(t, c, "volumeMounts.0").(object)
	if m["name"] != "cri-run" || m["mountPath"] != "/var/run/crio" || m["readOnly"] != true {
		t.Errorf("the socket's mount after the patch: %v, want cri-run at /var/run/crio, read-only", m)
	}
	v := at(t, ds, "spec.template.spec.volumes.0").(object)
	if str(t, v, "name") != "cri-run" || str(t, v, "hostPath.path") != "/var/run/crio" || str(t, v, "hostPath.type") != "Directory" {
		t.Errorf("the socket's volume after the patch: %v, want the host's /var/run/crio directory", v)
	}
	if n := strings.Count(fmt.Sprint(ds), "containerd"); n != 0 {
		t.Errorf("the patched DaemonSet still names containerd %d times", n)
	}
	if fmt.Sprint(ds) == before {
		t.Error("the patch changed nothing")
	}
}

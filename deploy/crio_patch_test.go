package deploy

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/jsonpatch"
)

// crioPatchPath is the JSON patch that moves the DaemonSet to CRI-O's
// socket: the overlay kubernetes-crio applies it, and `kubectl patch --type
// json` can.
const crioPatchPath = "kubernetes-crio/pleg-crio-patch.yaml"

// TestCRIOPatch: kubernetes-crio/pleg-crio-patch.yaml, applied to the
// DaemonSet, points pleg at CRI-O's socket inside a read-only mount of the
// socket's directory, /var/run/crio, and changes nothing else; its tests
// hold on today's manifest (they make kubectl refuse the patch if the
// args or mounts move).
func TestCRIOPatch(t *testing.T) {
	b, err := os.ReadFile(crioPatchPath)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := jsonpatch.Parse(b)
	if err != nil {
		t.Fatalf("pleg-crio-patch.yaml: %v", err)
	}
	ds := manifestObjects(t)["DaemonSet"]
	before := fmt.Sprint(ds)
	if err := jsonpatch.Apply(ds, ops); err != nil {
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

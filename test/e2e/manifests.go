package e2e

// The deploy/ manifests the DaemonSet tests run, read into small structs
// and turned into static pods for the real kubelet: the DaemonSet of
// deploy/kubernetes/pleg.yaml (loadDaemonSet, daemonSet.staticPod), the
// non-root patch (loadNonRootPatch, nonRootPatch.apply) and the rewrites
// that let such a pod run beside another (moveLifecycleSocket, movePorts).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/podlifecycle/pleg/internal/jsonpatch"
)

// manifestPath is the DaemonSet manifest, relative to the repository.
const manifestPath = "deploy/kubernetes/pleg.yaml"

// npdPatchPath is node-problem-detector's patch, whose init container
// copies the binary out of the same image.
const npdPatchPath = "deploy/npd/node-problem-detector-patch.yaml"

// k8sContainer is the part of a manifest's container these tests read.
type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	LivenessProbe   *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe  *k8sProbe `yaml:"readinessProbe"`
	SecurityContext struct {
		RunAsUser    *int64 `yaml:"runAsUser"`
		RunAsGroup   *int64 `yaml:"runAsGroup"`
		RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
	} `yaml:"httpGet"`
}

// k8sPodSpec is the part of a pod spec these tests read.
type k8sPodSpec struct {
	HostNetwork    bool           `yaml:"hostNetwork"`
	InitContainers []k8sContainer `yaml:"initContainers"`
	Containers     []k8sContainer `yaml:"containers"`
	Volumes        []struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
		} `yaml:"hostPath"`
	} `yaml:"volumes"`
}

// manifestDocs decodes every document of a YAML file, twice: as generic
// maps (to copy them whole) and through typed, the reader's struct.
func manifestDocs[T any](path string) ([]map[string]any, []T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var maps []map[string]any
	var typed []T
	for dec, dec2 := yaml.NewDecoder(bytes.NewReader(b)), yaml.NewDecoder(bytes.NewReader(b)); ; {
		var m map[string]any
		var v T
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return maps, typed, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := dec2.Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		maps, typed = append(maps, m), append(typed, v)
	}
}

// daemonSet is the manifest's DaemonSet: the generic document and what the
// tests read of it.
type daemonSet struct {
	doc  map[string]any
	name string
	ns   string
	spec k8sPodSpec
}

func loadDaemonSet(repoRoot string) (*daemonSet, error) {
	type doc struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
		Spec struct {
			Template struct {
				Spec k8sPodSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	maps, docs, err := manifestDocs[doc](filepath.Join(repoRoot, manifestPath))
	if err != nil {
		return nil, err
	}
	for i, d := range docs {
		if d.Kind != "DaemonSet" {
			continue
		}
		if n := len(d.Spec.Template.Spec.Containers); n != 1 {
			return nil, fmt.Errorf("%s: the DaemonSet has %d containers, these tests know one", manifestPath, n)
		}
		return &daemonSet{doc: maps[i], name: d.Metadata.Name, ns: d.Metadata.Namespace, spec: d.Spec.Template.Spec}, nil
	}
	return nil, fmt.Errorf("%s: no DaemonSet", manifestPath)
}

func (ds *daemonSet) container() k8sContainer { return ds.spec.Containers[0] }

// patched is the DaemonSet with the JSON patch at patchPath (relative to
// the repository, e.g. deploy/kubernetes-crio/pleg-crio-patch.yaml) applied, as
// `kubectl patch --type json` would: its tests must hold on the manifest.
// ds is unchanged.
func (ds *daemonSet) patched(repoRoot, patchPath string) (*daemonSet, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, patchPath))
	if err != nil {
		return nil, err
	}
	ops, err := jsonpatch.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", patchPath, err)
	}
	doc := deepCopy(ds.doc).(map[string]any)
	if err := jsonpatch.Apply(doc, ops); err != nil {
		return nil, fmt.Errorf("%s on %s: %w", patchPath, manifestPath, err)
	}
	// The typed view again, from the patched document.
	y, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var typed struct {
		Spec struct {
			Template struct {
				Spec k8sPodSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(y, &typed); err != nil {
		return nil, err
	}
	return &daemonSet{doc: doc, name: ds.name, ns: ds.ns, spec: typed.Spec.Template.Spec}, nil
}

// staticPod turns the DaemonSet's pod template into a static pod for a
// standalone kubelet, changing only what must change:
//
//  1. apiVersion v1, kind Pod, metadata.name and namespace taken from the
//     DaemonSet's (a DaemonSet names its pods itself), labels and
//     annotations from the template;
//  2. the hostPath of the volume that holds the runtime endpoint's socket:
//     the kubelet's containerd's. The manifest mounts the socket's
//     directory, so hostPath becomes the directory of criSocket, which
//     must hold the socket under the manifest's name (containerd.sock);
//     the container still sees it at the manifest's path, so the flags
//     are unchanged. (A manifest that mounts the socket file itself gets
//     criSocket.)
//  3. no serviceAccountName: the kubelet refuses static pods that name an
//     API object ("static pods may not reference serviceaccounts"); pleg
//     never uses it (automountServiceAccountToken: false stays).
//
// Everything else — the image and its pull policy (the suite imports the
// image built from deploy/Dockerfile under the manifest's reference, so
// IfNotPresent finds it without a registry), command, args, env, ports,
// probes, resources, securityContext, priority class, tolerations — is
// the manifest's.
func (ds *daemonSet) staticPod(criSocket string) (map[string]any, error) {
	tmpl, err := dig[map[string]any](ds.doc, "spec", "template")
	if err != nil {
		return nil, err
	}
	meta, err := dig[map[string]any](tmpl, "metadata")
	if err != nil {
		return nil, err
	}
	spec, err := dig[map[string]any](tmpl, "spec")
	if err != nil {
		return nil, err
	}
	pm, ps := deepCopy(meta).(map[string]any), deepCopy(spec).(map[string]any)
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": pm, "spec": ps}
	pm["name"], pm["namespace"] = ds.name, ds.ns
	delete(ps, "serviceAccountName")

	volName, hostPath, err := ds.socketVolume(criSocket)
	if err != nil {
		return nil, err
	}
	vols, err := dig[[]any](ps, "volumes")
	if err != nil {
		return nil, err
	}
	found := false
	for _, v := range vols {
		vm, _ := v.(map[string]any)
		if vm["name"] != volName {
			continue
		}
		hp, err := dig[map[string]any](vm, "hostPath")
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", volName, err)
		}
		hp["path"] = hostPath
		found = true
	}
	if !found {
		return nil, fmt.Errorf("%s: no volume %s", manifestPath, volName)
	}
	return pod, nil
}

// moveLifecycleSocket gives a pod made from the DaemonSet's template
// another host directory for its lifecycle socket (--lifecycle-socket):
// the hostPath of the volume mounted at the socket's directory becomes
// hostDir, so that the test leaves nothing on the host and two plegs on
// one host do not share a socket. The container still sees the socket
// at the manifest's path.
func moveLifecycleSocket(pod map[string]any, hostDir string) error {
	cs, err := dig[[]any](pod, "spec", "containers")
	if err != nil || len(cs) != 1 {
		return fmt.Errorf("containers %v: %v", cs, err)
	}
	c, _ := cs[0].(map[string]any)
	var sock string
	args, _ := c["args"].([]any)
	for _, a := range args {
		if v, ok := strings.CutPrefix(fmt.Sprint(a), "--lifecycle-socket="); ok {
			sock = v
		}
	}
	if sock == "" {
		return fmt.Errorf("no --lifecycle-socket= in %v", args)
	}
	var volName string
	mounts, _ := c["volumeMounts"].([]any)
	for _, m := range mounts {
		mm, _ := m.(map[string]any)
		if mm["mountPath"] == filepath.Dir(sock) {
			volName, _ = mm["name"].(string)
		}
	}
	vols, _ := dig[[]any](pod, "spec", "volumes")
	for _, v := range vols {
		vm, _ := v.(map[string]any)
		if volName != "" && vm["name"] == volName {
			hp, err := dig[map[string]any](vm, "hostPath")
			if err != nil {
				return fmt.Errorf("volume %s: %w", volName, err)
			}
			hp["path"] = hostDir
			return nil
		}
	}
	return fmt.Errorf("no hostPath volume mounted at %s, the lifecycle socket's directory", filepath.Dir(sock))
}

// socketVolume finds the volume mounted where the runtime endpoint's
// socket is (the socket's directory, or the socket itself) and the host
// path that puts criSocket there.
func (ds *daemonSet) socketVolume(criSocket string) (name, hostPath string, err error) {
	sock, err := ds.runtimeSocket()
	if err != nil {
		return "", "", err
	}
	var mountPath string
	for _, m := range ds.container().VolumeMounts {
		if (m.MountPath == sock || strings.HasPrefix(sock, strings.TrimSuffix(m.MountPath, "/")+"/")) && len(m.MountPath) > len(mountPath) {
			name, mountPath = m.Name, m.MountPath
		}
	}
	if name == "" {
		return "", "", fmt.Errorf("%s: no volume is mounted at the runtime socket %s or a directory holding it", manifestPath, sock)
	}
	if mountPath == sock {
		return name, criSocket, nil
	}
	rel := strings.TrimPrefix(sock, strings.TrimSuffix(mountPath, "/")+"/")
	dir, ok := strings.CutSuffix(criSocket, "/"+rel)
	if !ok {
		return "", "", fmt.Errorf("%s mounts %s for the socket %s; the test's socket %s is not at %s under a directory", manifestPath, mountPath, sock, criSocket, rel)
	}
	return name, dir, nil
}

// runtimeSocket is the socket path of the container's
// --container-runtime-endpoint.
func (ds *daemonSet) runtimeSocket() (string, error) {
	ep, ok := flagArg(ds.container().Args, "container-runtime-endpoint")
	if !ok || !strings.HasPrefix(ep, "unix://") {
		return "", fmt.Errorf("%s: no unix:// --container-runtime-endpoint in %v", manifestPath, ds.container().Args)
	}
	return strings.TrimPrefix(ep, "unix://"), nil
}

// flagArg finds --name=value or --name value in args.
func flagArg(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// dig walks nested maps by key and returns the value as a T.
func dig[T any](v any, keys ...string) (T, error) {
	var zero T
	for i, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return zero, fmt.Errorf("%s is not a map", strings.Join(keys[:i], "."))
		}
		if v, ok = m[k]; !ok {
			return zero, fmt.Errorf("no %s", strings.Join(keys[:i+1], "."))
		}
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%s is a %T", strings.Join(keys, "."), v)
	}
	return t, nil
}

// deepCopy copies decoded YAML (maps, lists and scalars).
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = deepCopy(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = deepCopy(x)
		}
		return out
	default:
		return v
	}
}

// nonRootPatchPath is the patch that runs the DaemonSet's pleg as the
// image's non-root user with the socket's group.
const nonRootPatchPath = "deploy/kubernetes/pleg-nonroot-patch.yaml"

// nonRootPatch is deploy/kubernetes/pleg-nonroot-patch.yaml.
type nonRootPatch struct {
	doc       map[string]any // the whole patch
	container k8sContainer   // its one container
}

func loadNonRootPatch(repoRoot string) (*nonRootPatch, error) {
	type doc struct {
		Spec struct {
			Template struct {
				Spec k8sPodSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	maps, docs, err := manifestDocs[doc](filepath.Join(repoRoot, nonRootPatchPath))
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 || len(docs[0].Spec.Template.Spec.Containers) != 1 {
		return nil, fmt.Errorf("%s: want one document patching one container", nonRootPatchPath)
	}
	return &nonRootPatch{doc: maps[0], container: docs[0].Spec.Template.Spec.Containers[0]}, nil
}

// apply merges the patch's pod template into a pod (a static pod made by
// daemonSet.staticPod) as `kubectl patch` merges it into the DaemonSet:
// maps merge key by key, containers by name, other lists are replaced;
// then supplementalGroups is set to the socket's group, the value the
// operator puts there.
func (np *nonRootPatch) apply(pod map[string]any, socketGID int) (map[string]any, error) {
	tmpl, err := dig[map[string]any](np.doc, "spec", "template")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nonRootPatchPath, err)
	}
	out := deepCopy(pod).(map[string]any)
	if err := strategicMerge(out, tmpl); err != nil {
		return nil, fmt.Errorf("%s: %w", nonRootPatchPath, err)
	}
	psc, err := dig[map[string]any](out, "spec", "securityContext")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nonRootPatchPath, err)
	}
	if _, ok := psc["supplementalGroups"]; !ok {
		return nil, fmt.Errorf("%s: no supplementalGroups", nonRootPatchPath)
	}
	psc["supplementalGroups"] = []any{socketGID}
	return out, nil
}

// strategicMerge merges src into dst the way a strategic merge patch does
// for what pod specs hold: maps key by key, lists of containers by name,
// anything else replaced.
func strategicMerge(dst, src map[string]any) error {
	for k, sv := range src {
		switch s := sv.(type) {
		case map[string]any:
			d, ok := dst[k].(map[string]any)
			if !ok {
				dst[k] = deepCopy(s)
				continue
			}
			if err := strategicMerge(d, s); err != nil {
				return err
			}
		case []any:
			d, ok := dst[k].([]any)
			if !ok || (k != "containers" && k != "initContainers") {
				dst[k] = deepCopy(s)
				continue
			}
			for _, item := range s {
				im, _ := item.(map[string]any)
				name, _ := im["name"].(string)
				if name == "" {
					return fmt.Errorf("an item of %s without a name", k)
				}
				merged := false
				for _, di := range d {
					if dm, _ := di.(map[string]any); dm["name"] == name {
						if err := strategicMerge(dm, im); err != nil {
							return err
						}
						merged = true
					}
				}
				if !merged {
					return fmt.Errorf("the patch's %s %q is not in the pod", k, name)
				}
			}
		default:
			dst[k] = s
		}
	}
	return nil
}

// movePorts gives a pod made from the DaemonSet's template other
// --listen-address and --metrics-address ports (the container port, which
// the probes and the scrape annotation name, with it), so that it can run
// beside the manifest's pod on the host's network.
func movePorts(pod map[string]any, listenPort, metricsPort int) error {
	cs, err := dig[[]any](pod, "spec", "containers")
	if err != nil || len(cs) != 1 {
		return fmt.Errorf("containers %v: %v", cs, err)
	}
	c, _ := cs[0].(map[string]any)
	args, _ := c["args"].([]any)
	moved := 0
	for i, a := range args {
		s, _ := a.(string)
		for flag, port := range map[string]int{"--listen-address=": listenPort, "--metrics-address=": metricsPort} {
			if v, ok := strings.CutPrefix(s, flag); ok {
				host, _, err := net.SplitHostPort(v)
				if err != nil {
					return fmt.Errorf("%s%s: %w", flag, v, err)
				}
				args[i] = flag + net.JoinHostPort(host, strconv.Itoa(port))
				moved++
			}
		}
	}
	ports, _ := c["ports"].([]any)
	if moved != 2 || len(ports) != 1 {
		return fmt.Errorf("args %v, ports %v: want both addresses and one port", args, ports)
	}
	pm, _ := ports[0].(map[string]any)
	pm["containerPort"], pm["hostPort"] = metricsPort, metricsPort
	if ann, ok := pod["metadata"].(map[string]any)["annotations"].(map[string]any); ok {
		ann["prometheus.io/port"] = strconv.Itoa(metricsPort)
	}
	return nil
}

package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// The model. Everything here is guarded by Runtime.mu.

type pod struct {
	uid, name, namespace string
	app                  string // workload app name (rolling updates keep it)
	hostNetwork          bool
	behaviour            Behaviour
	names                []string     // container names, in spec order
	sandboxes            []*sandbox   // oldest first; the last one is current
	containers           []*container // creation order
	doneStep             uint64       // step the pod was stopped by the workload (0: not)
}

type sandbox struct {
	id          string
	pod         *pod
	attempt     uint32
	state       runtimeapi.PodSandboxState
	createdAt   int64
	ip          string
	hostNetwork bool
	handler     string
	labels      map[string]string
	annotations map[string]string
	stoppedStep uint64 // step at which it stopped being current or ready
}

type container struct {
	id          string
	pod         *pod
	sandbox     *sandbox
	name        string
	attempt     uint32
	image       string
	state       runtimeapi.ContainerState
	createdAt   int64
	startedAt   int64
	finishedAt  int64
	exitCode    int32
	reason      string
	message     string
	labels      map[string]string
	annotations map[string]string
	superseded  uint64 // step at which a newer attempt replaced it (0: current)
}

const (
	alphabet     = "bcdfghjklmnpqrstvwxz2456789" // the Kubernetes name suffix alphabet
	exitedOK     = "Completed"
	exitedFailed = "Error"
)

var (
	appNames   = []string{"web", "api", "cache", "worker", "frontend", "auth", "search", "billing", "metrics", "queue", "checkout", "gateway"}
	jobNames   = []string{"backup", "report", "migrate", "cleanup", "index", "export"}
	namespaces = []string{"default", "prod", "staging", "monitoring", "kube-system"}
	ctrNames   = []string{"main", "sidecar", "proxy", "logger", "exporter"}
	images     = []string{
		"docker.io/library/nginx:1.27",
		"docker.io/library/redis:7.4",
		"docker.io/library/busybox:1.36",
		"quay.io/prometheus/node-exporter:v1.8.2",
		"docker.io/envoyproxy/envoy:v1.31.0",
		"ghcr.io/example/api:v2.3.1",
	}
)

func (r *Runtime) now() int64 { return r.clock.Now().UnixNano() }

// newID returns 64 hex characters from the model generator, like containerd.
func (r *Runtime) newID() string {
	for {
		id := fmt.Sprintf("%016x%016x%016x%016x", r.rng.Uint64(), r.rng.Uint64(), r.rng.Uint64(), r.rng.Uint64())
		if r.sandboxes[id] == nil && r.containers[id] == nil {
			return id
		}
	}
}

// newUID returns a random (version 4 shaped) UUID from the model generator.
func (r *Runtime) newUID() string {
	a, b := r.rng.Uint64(), r.rng.Uint64()
	a = a&^0xf000 | 0x4000                   // version 4
	b = b&^(0xc000<<48) | uint64(0x8000)<<48 // variant 10
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", a>>32, (a>>16)&0xffff, a&0xffff, b>>48, b&0xffffffffffff)
}

func (r *Runtime) randString(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.rng.IntN(len(alphabet))]
	}
	return string(b)
}

func (r *Runtime) nextIP() string {
	for {
		n := r.ipNext
		r.ipNext++
		if x, y := (n>>8)&0xff, n&0xff; y != 0 && y != 255 {
			return fmt.Sprintf("10.88.%d.%d", x, y)
		}
	}
}

func imageID(image string) string {
	s := sha256.Sum256([]byte("id:" + image))
	return "sha256:" + hex.EncodeToString(s[:])
}

func imageDigestRef(image string) string {
	repo := image
	for i := len(image) - 1; i >= 0 && image[i] != '/'; i-- {
		if image[i] == ':' {
			repo = image[:i]
			break
		}
	}
	s := sha256.Sum256([]byte("digest:" + image))
	return repo + "@sha256:" + hex.EncodeToString(s[:])
}

func podLabels(p *pod) map[string]string {
	return map[string]string{
		cruntime.LabelPodUID:       p.uid,
		cruntime.LabelPodName:      p.name,
		cruntime.LabelPodNamespace: p.namespace,
	}
}

// addPodLocked registers a new pod (no sandbox yet).
func (r *Runtime) addPodLocked(uid, name, namespace string, hostNetwork bool, b Behaviour, names []string) *pod {
	p := &pod{uid: uid, name: name, namespace: namespace, hostNetwork: hostNetwork, behaviour: b, names: slices.Clone(names)}
	r.pods[uid] = p
	r.order = append(r.order, p)
	return p
}

func (r *Runtime) dropPodLocked(p *pod) {
	delete(r.pods, p.uid)
	if i := slices.Index(r.order, p); i >= 0 {
		r.order = slices.Delete(r.order, i, i+1)
	}
}

// runSandboxLocked creates a ready sandbox for p and emits CREATED and
// STARTED for it.
func (r *Runtime) runSandboxLocked(p *pod, attempt uint32, hostNetwork bool, handler string, labels, annotations map[string]string) *sandbox {
	sb := &sandbox{
		id:          r.newID(),
		pod:         p,
		attempt:     attempt,
		state:       runtimeapi.PodSandboxState_SANDBOX_READY,
		createdAt:   r.now(),
		hostNetwork: hostNetwork,
		handler:     handler,
		labels:      podLabels(p),
		annotations: map[string]string{"kubernetes.io/config.source": "api"},
	}
	maps.Copy(sb.labels, labels)
	maps.Copy(sb.annotations, annotations)
	if !hostNetwork {
		sb.ip = r.nextIP()
	}
	if n := len(p.sandboxes); n > 0 && p.sandboxes[n-1].stoppedStep == 0 {
		p.sandboxes[n-1].stoppedStep = r.step + 1
	}
	p.sandboxes = append(p.sandboxes, sb)
	r.sandboxes[sb.id] = sb
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, sb.id, sb)
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, sb.id, sb)
	return sb
}

func (r *Runtime) stopSandboxLocked(sb *sandbox) {
	for _, c := range sb.pod.containers {
		if c.sandbox == sb {
			r.exitContainerLocked(c, 0, "")
		}
	}
	if sb.state == runtimeapi.PodSandboxState_SANDBOX_READY {
		sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		if sb.stoppedStep == 0 {
			sb.stoppedStep = r.step + 1
		}
		r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, sb.id, sb)
	}
}

// removeSandboxLocked removes sb and its containers; the pod goes when
// nothing of it is left.
func (r *Runtime) removeSandboxLocked(sb *sandbox) {
	for _, c := range slices.Clone(sb.pod.containers) {
		if c.sandbox == sb {
			r.removeContainerLocked(c)
		}
	}
	if sb.state == runtimeapi.PodSandboxState_SANDBOX_READY {
		sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, sb.id, sb)
	}
	p := sb.pod
	if i := slices.Index(p.sandboxes, sb); i >= 0 {
		p.sandboxes = slices.Delete(p.sandboxes, i, i+1)
	}
	delete(r.sandboxes, sb.id)
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, sb.id, sb)
	r.dropIfEmptyLocked(p)
}

func (r *Runtime) dropIfEmptyLocked(p *pod) {
	if len(p.sandboxes) == 0 && len(p.containers) == 0 && r.pods[p.uid] == p {
		r.dropPodLocked(p)
	}
}

// removePodLocked removes everything of p.
func (r *Runtime) removePodLocked(p *pod) {
	for _, c := range slices.Clone(p.containers) {
		r.removeContainerLocked(c)
	}
	for _, sb := range slices.Clone(p.sandboxes) {
		r.removeSandboxLocked(sb)
	}
	if r.pods[p.uid] == p {
		r.dropPodLocked(p)
	}
}

// createContainerLocked creates a container in state CREATED and emits
// CREATED.
func (r *Runtime) createContainerLocked(sb *sandbox, name string, attempt uint32, image string, labels, annotations map[string]string) *container {
	p := sb.pod
	c := &container{
		id:        r.newID(),
		pod:       p,
		sandbox:   sb,
		name:      name,
		attempt:   attempt,
		image:     image,
		state:     runtimeapi.ContainerState_CONTAINER_CREATED,
		createdAt: r.now(),
		labels:    podLabels(p),
		annotations: map[string]string{
			"io.kubernetes.container.restartCount":           strconv.FormatUint(uint64(attempt), 10),
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
			"io.kubernetes.pod.terminationGracePeriod":       "30",
		},
	}
	c.labels[cruntime.LabelContainerName] = name
	maps.Copy(c.labels, labels)
	maps.Copy(c.annotations, annotations)
	// An older attempt of the same name is superseded now.
	for _, o := range p.containers {
		if o.name == name && o.superseded == 0 {
			o.superseded = r.step + 1
		}
	}
	p.containers = append(p.containers, c)
	r.containers[c.id] = c
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, c.id, sb)
	return c
}

func (r *Runtime) startContainerLocked(c *container) {
	c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.startedAt = r.now()
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, c.id, c.sandbox)
}

// exitContainerLocked exits a created or running container; an exited one
// is left alone. An empty reason is derived from the exit code.
func (r *Runtime) exitContainerLocked(c *container, code int32, reason string) {
	if c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
		return
	}
	if reason == "" {
		reason = exitedFailed
		if code == 0 {
			reason = exitedOK
		}
	}
	c.state = runtimeapi.ContainerState_CONTAINER_EXITED
	c.finishedAt = r.now()
	c.exitCode = code
	c.reason = reason
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, c.id, c.sandbox)
}

func (r *Runtime) removeContainerLocked(c *container) {
	if c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		r.exitContainerLocked(c, 137, exitedFailed)
	}
	p := c.pod
	if i := slices.Index(p.containers, c); i >= 0 {
		p.containers = slices.Delete(p.containers, i, i+1)
	}
	delete(r.containers, c.id)
	r.emitLocked(runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, c.id, c.sandbox)
	r.dropIfEmptyLocked(p)
}

// latest returns the newest attempt of a container name in p, or nil.
func (p *pod) latest(name string) *container {
	var best *container
	for _, c := range p.containers {
		if c.name == name && (best == nil || c.attempt >= best.attempt) {
			best = c
		}
	}
	return best
}

func (p *pod) currentSandbox() *sandbox {
	if n := len(p.sandboxes); n > 0 {
		return p.sandboxes[n-1]
	}
	return nil
}

func (p *pod) nextAttempt(name string) uint32 {
	var n uint32
	found := false
	for _, c := range p.containers {
		if c.name == name && (!found || c.attempt >= n) {
			n, found = c.attempt, true
		}
	}
	if !found {
		return 0
	}
	return n + 1
}

// startPodLocked creates a ready sandbox and one started container per name.
func (r *Runtime) startPodLocked(p *pod, attempt uint32, start bool) {
	var sbLabels, sbAnnotations map[string]string
	if r.kubeletMeta {
		sbLabels, sbAnnotations = kubeletSandboxMeta(p, r.clock.Now())
	}
	if r.sbAnnBytes > 0 {
		if sbAnnotations == nil {
			sbAnnotations = map[string]string{}
		}
		sbAnnotations[NetworkStatusAnnotation] = networkStatus(p, r.sbAnnBytes)
	}
	sb := r.runSandboxLocked(p, attempt, p.hostNetwork, "", sbLabels, sbAnnotations)
	for i, name := range p.names {
		img := images[(len(p.app)+i)%len(images)]
		if old := p.latest(name); old != nil {
			img = old.image
		}
		var annotations map[string]string
		if r.kubeletMeta {
			annotations = kubeletContainerMeta(p, name, img, i)
		}
		c := r.createContainerLocked(sb, name, p.nextAttempt(name), img, nil, annotations)
		if start {
			r.startContainerLocked(c)
		}
	}
}

// NetworkStatusAnnotation is the sandbox annotation of
// Config.SandboxAnnotationBytes.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// networkStatus is a network status of about n bytes that only p has.
func networkStatus(p *pod, n int) string {
	s := fmt.Sprintf(`[{"name":"cbr0","interface":"eth0","pod":%q,"dns":{},"extra":"`, p.uid)
	return s + strings.Repeat("x", max(n-len(s)-3, 0)) + `"}]`
}

// kubeletSandboxMeta returns the labels and annotations, beyond
// podLabels', a kubelet gives the sandbox of a workload's pod at now: the
// pod's labels and annotations. The replicas of one workload (its app in
// its namespace) share every value but kubernetes.io/config.seen.
func kubeletSandboxMeta(p *pod, now time.Time) (labels, annotations map[string]string) {
	hash := shortHash(p.namespace + "/" + p.app)
	labels = map[string]string{
		"app":                       p.app,
		"app.kubernetes.io/name":    p.app,
		"app.kubernetes.io/part-of": p.namespace + "-platform",
		"pod-template-hash":         hash[:10],
	}
	annotations = map[string]string{
		"kubernetes.io/config.seen":         now.UTC().Format(time.RFC3339Nano),
		"kubernetes.io/config.source":       "api",
		"kubectl.kubernetes.io/restartedAt": "2026-11-01T08:00:00Z",
		"prometheus.io/scrape":              "true",
		"prometheus.io/port":                "9090",
		"checksum/config":                   shortHash("config:" + p.namespace + "/" + p.app),
	}
	return labels, annotations
}

// kubeletContainerMeta returns the annotations, beyond
// createContainerLocked's, a kubelet gives container i (name, image) of a
// workload's pod: the same for every replica.
func kubeletContainerMeta(p *pod, name, image string, i int) map[string]string {
	a := map[string]string{
		"io.kubernetes.container.hash":                     shortHash(p.namespace + "/" + p.app + "/" + name + "/" + image)[:8],
		"io.kubernetes.container.terminationMessagePolicy": "File",
	}
	if i == 0 {
		a["io.kubernetes.container.ports"] = `[{"name":"http","containerPort":8080,"protocol":"TCP"},{"name":"metrics","containerPort":9090,"protocol":"TCP"}]`
	}
	return a
}

// shortHash is a stable hex digest of s.
func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

// Proto conversions.

func (r *Runtime) sandboxMeta(sb *sandbox) *runtimeapi.PodSandboxMetadata {
	return &runtimeapi.PodSandboxMetadata{Name: sb.pod.name, Uid: sb.pod.uid, Namespace: sb.pod.namespace, Attempt: sb.attempt}
}

func (r *Runtime) sandboxItem(sb *sandbox) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id:             sb.id,
		Metadata:       r.sandboxMeta(sb),
		State:          sb.state,
		CreatedAt:      sb.createdAt,
		Labels:         maps.Clone(sb.labels),
		Annotations:    maps.Clone(sb.annotations),
		RuntimeHandler: sb.handler,
	}
}

func (r *Runtime) sandboxStatus(sb *sandbox) *runtimeapi.PodSandboxStatus {
	mode := runtimeapi.NamespaceMode_POD
	if sb.hostNetwork {
		mode = runtimeapi.NamespaceMode_NODE
	}
	st := &runtimeapi.PodSandboxStatus{
		Id:        sb.id,
		Metadata:  r.sandboxMeta(sb),
		State:     sb.state,
		CreatedAt: sb.createdAt,
		Network:   &runtimeapi.PodSandboxNetworkStatus{},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{
			Network: mode, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD,
		}}},
		Labels:         maps.Clone(sb.labels),
		Annotations:    maps.Clone(sb.annotations),
		RuntimeHandler: sb.handler,
	}
	if sb.state == runtimeapi.PodSandboxState_SANDBOX_READY && sb.ip != "" {
		st.Network.Ip = sb.ip
	}
	return st
}

func containerMeta(c *container) *runtimeapi.ContainerMetadata {
	return &runtimeapi.ContainerMetadata{Name: c.name, Attempt: c.attempt}
}

func imageSpec(c *container) *runtimeapi.ImageSpec {
	return &runtimeapi.ImageSpec{Image: c.image, UserSpecifiedImage: c.image}
}

func containerItem(c *container) *runtimeapi.Container {
	id := imageID(c.image)
	return &runtimeapi.Container{
		Id:           c.id,
		PodSandboxId: c.sandbox.id,
		Metadata:     containerMeta(c),
		Image:        imageSpec(c),
		ImageRef:     id,
		ImageId:      id,
		State:        c.state,
		CreatedAt:    c.createdAt,
		Labels:       maps.Clone(c.labels),
		Annotations:  maps.Clone(c.annotations),
	}
}

func containerStatus(c *container) *runtimeapi.ContainerStatus {
	p := c.pod
	return &runtimeapi.ContainerStatus{
		Id:          c.id,
		Metadata:    containerMeta(c),
		State:       c.state,
		CreatedAt:   c.createdAt,
		StartedAt:   c.startedAt,
		FinishedAt:  c.finishedAt,
		ExitCode:    c.exitCode,
		Image:       imageSpec(c),
		ImageRef:    imageDigestRef(c.image),
		ImageId:     imageID(c.image),
		Reason:      c.reason,
		Message:     c.message,
		Labels:      maps.Clone(c.labels),
		Annotations: maps.Clone(c.annotations),
		LogPath:     fmt.Sprintf("/var/log/pods/%s_%s_%s/%s/%d.log", p.namespace, p.name, p.uid, c.name, c.attempt),
	}
}

func podContainerStatuses(p *pod) []*runtimeapi.ContainerStatus {
	out := make([]*runtimeapi.ContainerStatus, 0, len(p.containers))
	for _, c := range p.containers {
		out = append(out, containerStatus(c))
	}
	return out
}

// verboseInfo is the info of a verbose ContainerStatus, as containerd
// gives it: JSON under "info" with the init process's PID (while it runs)
// and the OCI spec's cgroup path.
func verboseInfo(c *container) map[string]string {
	var pid uint32
	if c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		h := fnv.New32a()
		h.Write([]byte(c.id))
		pid = 1000 + h.Sum32()%4000000
	}
	info, _ := json.Marshal(map[string]any{
		"pid": pid,
		"runtimeSpec": map[string]any{
			"linux": map[string]any{"cgroupsPath": fmt.Sprintf("/kubepods/pod%s/%s", c.pod.uid, c.id)},
		},
	})
	return map[string]string{"info": string(info)}
}

package sim

import (
	"errors"
	"fmt"
	"slices"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Errors of the direct mutation API. Through CRI they become codes.NotFound,
// codes.InvalidArgument, codes.AlreadyExists and codes.FailedPrecondition.
var (
	ErrNotFound = errors.New("not found")
	errInvalid  = errors.New("invalid argument")
	errExists   = errors.New("already exists")
	errState    = errors.New("wrong state")
)

// PodSpec describes a pod for AddPod.
type PodSpec struct {
	Name      string // "" generates one
	Namespace string // "" means "default"
	UID       string // "" generates one
	// Containers are the container names, one container each.
	Containers []string
	// Image of every container ("" picks a common one).
	Image       string
	HostNetwork bool
	// CreatedOnly leaves the containers CREATED instead of RUNNING.
	CreatedOnly bool
	// Behaviour lets the workload drive the pod (default Steady: it does
	// not touch it).
	Behaviour Behaviour
}

// PodInfo is a snapshot of one pod of the model.
type PodInfo struct {
	UID, Name, Namespace string
	HostNetwork          bool
	Behaviour            Behaviour
	Sandboxes            []SandboxInfo   // oldest first; the last is current
	Containers           []ContainerInfo // creation order
}

// SandboxInfo is a snapshot of one sandbox.
type SandboxInfo struct {
	ID        string
	Attempt   uint32
	State     runtimeapi.PodSandboxState
	CreatedAt int64 // ns
	IP        string
}

// ContainerInfo is a snapshot of one container.
type ContainerInfo struct {
	ID, SandboxID, PodUID, Name string
	Attempt                     uint32
	State                       runtimeapi.ContainerState
	Image                       string
	CreatedAt, StartedAt        int64 // ns
	FinishedAt                  int64 // ns
	ExitCode                    int32
	Reason                      string
}

// SandboxID returns the ID of the pod's current (newest) sandbox.
func (p PodInfo) SandboxID() string {
	if n := len(p.Sandboxes); n > 0 {
		return p.Sandboxes[n-1].ID
	}
	return ""
}

// ContainerIDs returns the IDs of the pod's containers, in creation order.
func (p PodInfo) ContainerIDs() []string {
	ids := make([]string, len(p.Containers))
	for i, c := range p.Containers {
		ids[i] = c.ID
	}
	return ids
}

// Container returns the newest attempt of the named container.
func (p PodInfo) Container(name string) (ContainerInfo, bool) {
	var best ContainerInfo
	found := false
	for _, c := range p.Containers {
		if c.Name == name && (!found || c.Attempt >= best.Attempt) {
			best, found = c, true
		}
	}
	return best, found
}

func podInfo(p *pod) PodInfo {
	pi := PodInfo{UID: p.uid, Name: p.name, Namespace: p.namespace, HostNetwork: p.hostNetwork, Behaviour: p.behaviour}
	for _, sb := range p.sandboxes {
		si := SandboxInfo{ID: sb.id, Attempt: sb.attempt, State: sb.state, CreatedAt: sb.createdAt}
		if sb.state == runtimeapi.PodSandboxState_SANDBOX_READY {
			si.IP = sb.ip
		}
		pi.Sandboxes = append(pi.Sandboxes, si)
	}
	for _, c := range p.containers {
		pi.Containers = append(pi.Containers, containerInfo(c))
	}
	return pi
}

func containerInfo(c *container) ContainerInfo {
	return ContainerInfo{
		ID: c.id, SandboxID: c.sandbox.id, PodUID: c.pod.uid, Name: c.name, Attempt: c.attempt,
		State: c.state, Image: c.image, CreatedAt: c.createdAt, StartedAt: c.startedAt,
		FinishedAt: c.finishedAt, ExitCode: c.exitCode, Reason: c.reason,
	}
}

// Pods returns a snapshot of every pod, in creation order.
func (r *Runtime) Pods() []PodInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PodInfo, 0, len(r.order))
	for _, p := range r.order {
		out = append(out, podInfo(p))
	}
	return out
}

// Pod returns a snapshot of one pod.
func (r *Runtime) Pod(uid string) (PodInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pods[uid]
	if p == nil {
		return PodInfo{}, false
	}
	return podInfo(p), true
}

// Container returns a snapshot of one container.
func (r *Runtime) Container(id string) (ContainerInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.containers[id]
	if c == nil {
		return ContainerInfo{}, false
	}
	return containerInfo(c), true
}

// AddPod creates a pod with a ready sandbox and its containers (started
// unless spec.CreatedOnly), emitting the CRI events, and returns it.
func (r *Runtime) AddPod(spec PodSpec) (PodInfo, error) {
	seen := map[string]bool{}
	for _, n := range spec.Containers {
		if n == "" || seen[n] {
			return PodInfo{}, fmt.Errorf("sim: container names must be unique and not empty: %q: %w", spec.Containers, errInvalid)
		}
		seen[n] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	uid := spec.UID
	if uid == "" {
		uid = r.newUID()
	} else if r.pods[uid] != nil {
		return PodInfo{}, fmt.Errorf("sim: pod %s: %w", uid, errExists)
	}
	name := spec.Name
	if name == "" {
		name = "pod-" + r.randString(5)
	}
	ns := spec.Namespace
	if ns == "" {
		ns = "default"
	}
	p := r.addPodLocked(uid, name, ns, spec.HostNetwork, spec.Behaviour, spec.Containers)
	p.app = name
	sb := r.runSandboxLocked(p, 0, spec.HostNetwork, "", nil, nil)
	for i, n := range spec.Containers {
		img := spec.Image
		if img == "" {
			img = images[i%len(images)]
		}
		c := r.createContainerLocked(sb, n, 0, img, nil, nil)
		if !spec.CreatedOnly {
			r.startContainerLocked(c)
		}
	}
	return podInfo(p), nil
}

func (r *Runtime) containerLocked(id string) (*container, error) {
	c := r.containers[id]
	if c == nil {
		return nil, fmt.Errorf("sim: container %q: %w", id, ErrNotFound)
	}
	return c, nil
}

func (r *Runtime) podLocked(uid string) (*pod, error) {
	p := r.pods[uid]
	if p == nil {
		return nil, fmt.Errorf("sim: pod %q: %w", uid, ErrNotFound)
	}
	return p, nil
}

// StartContainer starts a CREATED container.
func (r *Runtime) StartContainer(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.containerLocked(id)
	if err != nil {
		return err
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_CREATED {
		return fmt.Errorf("sim: container %q is %s, not created: %w", id, c.state, errState)
	}
	if c.sandbox.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return fmt.Errorf("sim: sandbox of container %q is not ready: %w", id, errState)
	}
	r.startContainerLocked(c)
	return nil
}

// ExitContainer makes a created or running container exit with exitCode
// (reason "Completed" for 0, else "Error"). An exited one is an error.
func (r *Runtime) ExitContainer(id string, exitCode int32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.containerLocked(id)
	if err != nil {
		return err
	}
	if c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
		return fmt.Errorf("sim: container %q already exited: %w", id, errState)
	}
	r.exitContainerLocked(c, exitCode, "")
	return nil
}

// RestartContainer starts a new attempt of the named container of pod
// podUID in the pod's current sandbox, with a new ID, and returns the ID.
// The previous attempt stays, exited (a running one is killed first with
// exit code 137).
func (r *Runtime) RestartContainer(podUID, name string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.podLocked(podUID)
	if err != nil {
		return "", err
	}
	old := p.latest(name)
	if old == nil {
		return "", fmt.Errorf("sim: container %s of pod %s: %w", name, podUID, ErrNotFound)
	}
	sb := p.currentSandbox()
	if sb == nil || sb.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return "", fmt.Errorf("sim: pod %s has no ready sandbox: %w", podUID, errState)
	}
	r.exitContainerLocked(old, 137, exitedFailed)
	var annotations map[string]string
	if r.kubeletMeta {
		annotations = kubeletContainerMeta(p, name, old.image, slices.Index(p.names, name))
	}
	c := r.createContainerLocked(sb, name, p.nextAttempt(name), old.image, nil, annotations)
	r.startContainerLocked(c)
	return c.id, nil
}

// RemoveContainer removes a container (a running one is killed first).
func (r *Runtime) RemoveContainer(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.containerLocked(id)
	if err != nil {
		return err
	}
	r.removeContainerLocked(c)
	return nil
}

// StopPod exits every container of the pod (exit code 0) and makes its
// sandboxes NOTREADY.
func (r *Runtime) StopPod(uid string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.podLocked(uid)
	if err != nil {
		return err
	}
	for _, sb := range p.sandboxes {
		r.stopSandboxLocked(sb)
	}
	for _, c := range p.containers {
		r.exitContainerLocked(c, 0, "")
	}
	return nil
}

// RemovePod removes every container and sandbox of the pod.
func (r *Runtime) RemovePod(uid string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.podLocked(uid)
	if err != nil {
		return err
	}
	r.removePodLocked(p)
	return nil
}

// RecreateSandbox stops the pod's current sandbox and its containers, then
// starts a new sandbox (attempt + 1) with a new attempt of every container,
// as the kubelet does when a sandbox dies. The old sandbox stays, not ready.
// It returns the new sandbox's ID.
func (r *Runtime) RecreateSandbox(uid string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.podLocked(uid)
	if err != nil {
		return "", err
	}
	var attempt uint32
	if sb := p.currentSandbox(); sb != nil {
		r.stopSandboxLocked(sb)
		attempt = sb.attempt + 1
	}
	for _, c := range p.containers {
		r.exitContainerLocked(c, 0, "")
	}
	names := slices.Clone(p.names)
	for _, c := range p.containers {
		if !slices.Contains(names, c.name) {
			names = append(names, c.name)
		}
	}
	p.names = names
	r.startPodLocked(p, attempt, true)
	return p.currentSandbox().id, nil
}

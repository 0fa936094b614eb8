package e2e

// The suite's own CRI client and the helpers tests drive containerd with
// (RunPod, CreateContainer, StartContainer, ..., ContainerEvents), which
// label pods and containers as the kubelet does and bound each unary call
// by criTimeout.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criTimeout bounds every CRI call the helpers make.
const criTimeout = 30 * time.Second

// Kubelet labels and annotations put on sandboxes and containers.
const (
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelContainerName = "io.kubernetes.container.name"
	annotRestartCount  = "io.kubernetes.container.restartCount"
)

// criClient is a plain CRI v1 client on the suite's socket.
type criClient struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
	img  runtimeapi.ImageServiceClient

	mu       sync.Mutex
	pods     map[string]*runtimeapi.PodSandboxConfig // by sandbox ID, from RunPod
	attempts map[string]uint32                       // next attempt by sandboxID/containerName
}

// dialCRI connects to a CRI socket with a short reconnect backoff, so the
// connection comes back quickly after a containerd restart.
func dialCRI(sock string) (*criClient, error) {
	conn, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return nil, err
	}
	return &criClient{
		conn:     conn,
		rt:       runtimeapi.NewRuntimeServiceClient(conn),
		img:      runtimeapi.NewImageServiceClient(conn),
		pods:     map[string]*runtimeapi.PodSandboxConfig{},
		attempts: map[string]uint32{},
	}, nil
}

func (c *criClient) close() { c.conn.Close() }

// removeAllPods stops and removes every sandbox (and with them their
// containers) and any container left outside one.
func (c *criClient) removeAllPods(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pods, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods.Items {
		if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, err)
		}
	}
	ctrs, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err == nil {
		for _, ct := range ctrs.Containers {
			c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ct.Id, Timeout: 1})
			if _, err := c.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ct.Id}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RuntimeClient returns the suite's CRI runtime client. The connection
// survives containerd restarts (it reconnects within about a second).
func RuntimeClient() runtimeapi.RuntimeServiceClient { return suite.cri.rt }

// ImageClient returns the suite's CRI image client.
func ImageClient() runtimeapi.ImageServiceClient { return suite.cri.img }

func criCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), criTimeout)
	t.Cleanup(cancel)
	return ctx
}

func newUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// namespaceOptions are a kubelet's for a hostNetwork pod: node network (so
// no CNI is needed), a pid namespace per container, a pod IPC namespace.
func namespaceOptions() *runtimeapi.NamespaceOption {
	return &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_NODE,
		Pid:     runtimeapi.NamespaceMode_CONTAINER,
		Ipc:     runtimeapi.NamespaceMode_POD,
	}
}

func (e *env) podSandboxConfig(name, uid string, labels, annotations map[string]string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: podNamespace},
		LogDirectory: filepath.Join(e.dir, "logs", podNamespace+"_"+name+"_"+uid),
		Labels:       labels,
		Annotations:  annotations,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent:    e.cgroupParent + "/pod" + uid,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: namespaceOptions()},
		},
	}
}

// RunPod runs a host-network pod sandbox named name in namespace "e2e"
// with a fresh UID, labelled like a kubelet does (io.kubernetes.pod.uid,
// .name, .namespace), and returns its sandbox ID and UID. The pause
// container is docker.io/pleg/pause:e2e. A cleanup stops and removes the
// pod if the test has not.
func RunPod(t testing.TB, name string) (sandboxID, podUID string) {
	t.Helper()
	return suite.runPod(t, name)
}

// runPod is RunPod on e.
func (e *env) runPod(t testing.TB, name string) (sandboxID, podUID string) {
	t.Helper()
	podUID = newUID()
	labels := map[string]string{labelPodUID: podUID, labelPodName: name, labelPodNamespace: podNamespace}
	cfg := e.podSandboxConfig(name, podUID, labels, map[string]string{"kubernetes.io/config.source": "e2e"})
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	resp, err := e.cri.rt.RunPodSandbox(criCtx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	sandboxID = resp.PodSandboxId
	e.cri.mu.Lock()
	e.cri.pods[sandboxID] = cfg
	e.cri.mu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), criTimeout)
		defer cancel()
		if _, err := e.cri.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil && status.Code(err) != codes.NotFound {
			t.Logf("cleanup: StopPodSandbox %s: %v", name, err)
		}
		if _, err := e.cri.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil && status.Code(err) != codes.NotFound {
			t.Logf("cleanup: RemovePodSandbox %s: %v", name, err)
		}
	})
	return sandboxID, podUID
}

// sandboxConfig returns the config a sandbox was run with: RunPod's record,
// or one rebuilt from PodSandboxStatus for sandboxes run by raw CRI calls.
func sandboxConfig(t testing.TB, sandboxID string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	return suite.sandboxConfigOf(t, sandboxID)
}

// sandboxConfigOf is sandboxConfig on e.
func (e *env) sandboxConfigOf(t testing.TB, sandboxID string) *runtimeapi.PodSandboxConfig {
	t.Helper()
	e.cri.mu.Lock()
	cfg := e.cri.pods[sandboxID]
	e.cri.mu.Unlock()
	if cfg != nil {
		return cfg
	}
	st, err := e.cri.rt.PodSandboxStatus(criCtx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", sandboxID, err)
	}
	m := st.Status.Metadata
	cfg = e.podSandboxConfig(m.Name, m.Uid, st.Status.Labels, st.Status.Annotations)
	cfg.Metadata.Namespace = m.Namespace
	return cfg
}

// CreateContainer creates (does not start) a container named name in the
// sandbox, from docker.io/pleg/workload:e2e with args as its arguments
// (nil: the image default, "run"). See images/workload for the modes:
// run, sleep <dur>, exit <code>, pause. Labels are a kubelet's
// (io.kubernetes.container.name and the pod's labels); the attempt number
// counts up per sandbox and name, so a name can be reused after the
// previous container exited (its log is <pod log dir>/<name>/<attempt>.log).
func CreateContainer(t testing.TB, sandboxID, name string, args []string) string {
	t.Helper()
	return suite.createContainer(t, sandboxID, name, args)
}

// createContainer is CreateContainer on e.
func (e *env) createContainer(t testing.TB, sandboxID, name string, args []string) string {
	t.Helper()
	sb := e.sandboxConfigOf(t, sandboxID)
	key := sandboxID + "/" + name
	e.cri.mu.Lock()
	attempt := e.cri.attempts[key]
	e.cri.attempts[key] = attempt + 1
	e.cri.mu.Unlock()
	labels := map[string]string{
		labelContainerName: name,
		labelPodName:       sb.Metadata.Name,
		labelPodNamespace:  sb.Metadata.Namespace,
		labelPodUID:        sb.Metadata.Uid,
	}
	if err := os.MkdirAll(filepath.Join(sb.LogDirectory, name), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		Image:       &runtimeapi.ImageSpec{Image: workloadImage, UserSpecifiedImage: workloadImage}, // CRI-O 1.36 refuses a container without it ("cannot verify image signature")
		Args:        args,
		Labels:      labels,
		Annotations: map[string]string{annotRestartCount: strconv.FormatUint(uint64(attempt), 10)},
		LogPath:     filepath.Join(name, strconv.FormatUint(uint64(attempt), 10)+".log"),
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaceOptions()},
		},
	}
	resp, err := e.cri.rt.CreateContainer(criCtx(t), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: cfg, SandboxConfig: sb,
	})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", name, err)
	}
	return resp.ContainerId
}

// StartContainer starts a created container.
func StartContainer(t testing.TB, containerID string) {
	t.Helper()
	suite.startContainer(t, containerID)
}

// startContainer is StartContainer on e.
func (e *env) startContainer(t testing.TB, containerID string) {
	t.Helper()
	if _, err := e.cri.rt.StartContainer(criCtx(t), &runtimeapi.StartContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatalf("StartContainer %s: %v", containerID, err)
	}
}

// CreateAndStart creates and starts a container (see CreateContainer) and
// returns its ID.
func CreateAndStart(t testing.TB, sandboxID, name string, args []string) string {
	t.Helper()
	return suite.createAndStart(t, sandboxID, name, args)
}

// createAndStart is CreateAndStart on e.
func (e *env) createAndStart(t testing.TB, sandboxID, name string, args []string) string {
	t.Helper()
	id := e.createContainer(t, sandboxID, name, args)
	e.startContainer(t, id)
	return id
}

// StopContainer stops a container: SIGTERM, then SIGKILL after timeout
// seconds (0: at once).
func StopContainer(t testing.TB, containerID string, timeout int64) {
	t.Helper()
	if _, err := suite.cri.rt.StopContainer(criCtx(t), &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: timeout}); err != nil {
		t.Fatalf("StopContainer %s: %v", containerID, err)
	}
}

// RemoveContainer removes a container (stopping it first if needed).
func RemoveContainer(t testing.TB, containerID string) {
	t.Helper()
	suite.removeContainer(t, containerID)
}

// removeContainer is RemoveContainer on e.
func (e *env) removeContainer(t testing.TB, containerID string) {
	t.Helper()
	if _, err := e.cri.rt.RemoveContainer(criCtx(t), &runtimeapi.RemoveContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatalf("RemoveContainer %s: %v", containerID, err)
	}
}

// StopPod stops a pod sandbox and all its containers.
func StopPod(t testing.TB, sandboxID string) {
	t.Helper()
	suite.stopPod(t, sandboxID)
}

// stopPod is StopPod on e.
func (e *env) stopPod(t testing.TB, sandboxID string) {
	t.Helper()
	if _, err := e.cri.rt.StopPodSandbox(criCtx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatalf("StopPodSandbox %s: %v", sandboxID, err)
	}
}

// RemovePod removes a pod sandbox and all its containers.
func RemovePod(t testing.TB, sandboxID string) {
	t.Helper()
	suite.removePod(t, sandboxID)
}

// removePod is RemovePod on e.
func (e *env) removePod(t testing.TB, sandboxID string) {
	t.Helper()
	if _, err := e.cri.rt.RemovePodSandbox(criCtx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatalf("RemovePodSandbox %s: %v", sandboxID, err)
	}
	e.cri.mu.Lock()
	delete(e.cri.pods, sandboxID)
	e.cri.mu.Unlock()
}

// PodState returns the sandbox's state (SANDBOX_READY or SANDBOX_NOTREADY).
func PodState(t testing.TB, sandboxID string) runtimeapi.PodSandboxState {
	t.Helper()
	st, err := suite.cri.rt.PodSandboxStatus(criCtx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", sandboxID, err)
	}
	return st.Status.State
}

// ContainerStatus returns the CRI status of a container.
func ContainerStatus(t testing.TB, containerID string) *runtimeapi.ContainerStatus {
	t.Helper()
	return suite.containerStatus(t, containerID)
}

// containerStatus is ContainerStatus on e.
func (e *env) containerStatus(t testing.TB, containerID string) *runtimeapi.ContainerStatus {
	t.Helper()
	st, err := e.cri.rt.ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: containerID})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", containerID, err)
	}
	return st.Status
}

// ContainerState returns the state of a container (CONTAINER_CREATED,
// _RUNNING, _EXITED or _UNKNOWN).
func ContainerState(t testing.TB, containerID string) runtimeapi.ContainerState {
	t.Helper()
	return ContainerStatus(t, containerID).State
}

// WaitContainerState polls until the container is in state (or fails the
// test after timeout) and returns its status.
func WaitContainerState(t testing.TB, containerID string, state runtimeapi.ContainerState, timeout time.Duration) *runtimeapi.ContainerStatus {
	t.Helper()
	return suite.waitContainerState(t, containerID, state, timeout)
}

// waitContainerState is WaitContainerState on e.
func (e *env) waitContainerState(t testing.TB, containerID string, state runtimeapi.ContainerState, timeout time.Duration) *runtimeapi.ContainerStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := e.containerStatus(t, containerID)
		if st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s (%s) is %v after %v, want %v", st.Metadata.GetName(), containerID, st.State, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ContainerEvents opens a GetContainerEvents stream and returns its events
// on a channel, closed when the stream ends (e.g. containerd restarts) or
// the test ends. containerd 2.x replays its buffered recent events to the
// first subscriber, so the channel may start with events from before the
// call.
func ContainerEvents(t testing.TB) <-chan *runtimeapi.ContainerEventResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := suite.cri.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		cancel()
		t.Fatalf("GetContainerEvents: %v", err)
	}
	ch := make(chan *runtimeapi.ContainerEventResponse, 1024)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		defer close(ch)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// containerPID returns the host PID of a running container's process (CRI
// verbose status: info.pid).
func containerPID(t testing.TB, id string) int {
	t.Helper()
	return suite.containerPID(t, id)
}

// containerPID is containerPID on e's runtime.
func (e *env) containerPID(t testing.TB, id string) int {
	t.Helper()
	resp, err := e.cri.rt.ContainerStatus(criCtx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("container %s: no pid in verbose status (%v): %.200s", id, err, resp.Info["info"])
	}
	return info.Pid
}

package sim

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// RuntimeName and RuntimeVersion are what Version reports.
const (
	RuntimeName    = "pleg-sim"
	RuntimeVersion = "0.1.0"
)

// service implements the CRI RuntimeService over a Runtime.
type service struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	r *Runtime
}

// begin counts a call, admits it (not after Stop), applies the base latency
// and the error rate. The caller must call end when begin returns nil.
func (r *Runtime) begin(ctx context.Context, method string) error {
	r.countCall(method)
	if !r.handlers.enter() {
		return status.Error(codes.Unavailable, "sim: runtime stopped")
	}
	r.kmu.Lock()
	l := r.latency
	var jitter time.Duration
	if l.Jitter > 0 {
		switch l.JitterDist {
		case Exponential:
			jitter = time.Duration(r.frng.ExpFloat64() * float64(l.Jitter))
		default:
			jitter = time.Duration(r.frng.Int64N(int64(l.Jitter)))
		}
	}
	fail := r.errorRate > 0 && r.frng.Float64() < r.errorRate
	code := codes.Unavailable
	if fail && r.frng.IntN(2) == 1 {
		code = codes.Internal
	}
	r.kmu.Unlock()
	if err := r.sleep(ctx, l.Base+jitter); err != nil {
		r.handlers.exit()
		return err
	}
	if fail {
		r.handlers.exit()
		return status.Errorf(code, "sim: injected %s fault in %s", code, method)
	}
	return nil
}

func (r *Runtime) end() { r.handlers.exit() }

// perItem applies the per-item latency of a list call returning n items.
func (r *Runtime) perItem(ctx context.Context, n int) error {
	r.kmu.Lock()
	d := r.latency.PerItem
	r.kmu.Unlock()
	return r.sleep(ctx, d*time.Duration(n))
}

// sleep waits d of real time, or until ctx is done or the server goes away.
func (r *Runtime) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-r.stopCh:
		return status.Error(codes.Unavailable, "sim: runtime stopped")
	case <-r.quitChan():
		return status.Error(codes.Unavailable, "sim: runtime went away")
	}
}

// waitHung blocks while pod uid's status calls are hung.
func (r *Runtime) waitHung(ctx context.Context, uid string) error {
	return r.waitWhile(ctx, r.hung, uid)
}

// waitHungLists blocks while pod uid's filtered list calls are hung.
func (r *Runtime) waitHungLists(ctx context.Context, uid string) error {
	return r.waitWhile(ctx, r.hungLists, uid)
}

// waitWhile blocks while set (r.hung or r.hungLists, read under kmu) holds
// uid.
func (r *Runtime) waitWhile(ctx context.Context, set map[string]bool, uid string) error {
	quit := r.quitChan()
	for {
		r.kmu.Lock()
		hung, changed := set[uid], r.hungChanged
		r.kmu.Unlock()
		if !hung {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-r.stopCh:
			return status.Error(codes.Unavailable, "sim: runtime stopped")
		case <-quit:
			return status.Error(codes.Unavailable, "sim: runtime went away")
		}
	}
}

// grpcError maps model errors to gRPC status errors.
func grpcError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errExists):
		return status.Error(codes.AlreadyExists, err.Error())
	default:
		return status.Error(codes.FailedPrecondition, err.Error())
	}
}

func (s *service) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if err := s.r.begin(ctx, "Version"); err != nil {
		return nil, err
	}
	defer s.r.end()
	return &runtimeapi.VersionResponse{
		Version:           "0.1.0",
		RuntimeName:       RuntimeName,
		RuntimeVersion:    RuntimeVersion,
		RuntimeApiVersion: "v1",
	}, nil
}

func (s *service) Status(ctx context.Context, _ *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	r := s.r
	if err := r.begin(ctx, "Status"); err != nil {
		return nil, err
	}
	defer r.end()
	r.kmu.Lock()
	ready := &runtimeapi.RuntimeCondition{Type: cruntime.RuntimeReady, Status: r.runtimeReady}
	if !r.runtimeReady {
		ready.Reason, ready.Message = r.notReadyReason, r.notReadyMsg
	}
	r.kmu.Unlock()
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		ready,
		{Type: cruntime.NetworkReady, Status: true},
	}}}, nil
}

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// listTarget returns the pod a list filter selects (by the pod UID label,
// by a sandbox ID, or by a container ID), "" when it selects none in
// particular; and the pods whose items can match the filter (every pod,
// only the selected one, or none when the selected pod is unknown). uid is
// set even for a pod the model does not know, so that a hung UID hangs
// whether or not its pod exists. Called with mu held.
func (r *Runtime) listTargetLocked(id, sandboxID string, labels map[string]string) (uid string, pods []*pod) {
	var p *pod
	switch {
	case labels[cruntime.LabelPodUID] != "":
		uid = labels[cruntime.LabelPodUID]
		p = r.pods[uid]
	case sandboxID != "":
		if sb := r.sandboxes[sandboxID]; sb != nil {
			p = sb.pod
		}
	case id != "":
		if sb := r.sandboxes[id]; sb != nil {
			p = sb.pod
		} else if c := r.containers[id]; c != nil {
			p = c.pod
		}
	default:
		return "", r.order
	}
	if p == nil {
		return uid, nil
	}
	return p.uid, []*pod{p}
}

// holdList makes a list call filtered to pod uid wait while that pod's
// lists are hung (SetHungLists), after counting it for the pod.
func (r *Runtime) holdList(ctx context.Context, method, uid string) error {
	if uid == "" {
		return nil
	}
	r.countPodCall(uid, method)
	return r.waitHungLists(ctx, uid)
}

func (s *service) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	items, err := s.r.listSandboxes(ctx, "ListPodSandbox", req.GetFilter())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

// StreamPodSandboxes sends what ListPodSandbox answers, in batches of the
// configured size (KEP-5825).
func (s *service) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	batch := s.r.listStreamingBatch()
	if batch == 0 {
		s.r.countCall("StreamPodSandboxes")
		return status.Error(codes.Unimplemented, "sim: streaming lists are disabled")
	}
	items, err := s.r.listSandboxes(stream.Context(), "StreamPodSandboxes", req.GetFilter())
	if err != nil {
		return err
	}
	return sendBatches(items, batch, func(b []*runtimeapi.PodSandbox) error {
		return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: b})
	})
}

// StreamContainers sends what ListContainers answers, in batches of the
// configured size (KEP-5825).
func (s *service) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	batch := s.r.listStreamingBatch()
	if batch == 0 {
		s.r.countCall("StreamContainers")
		return status.Error(codes.Unimplemented, "sim: streaming lists are disabled")
	}
	items, err := s.r.listContainers(stream.Context(), "StreamContainers", req.GetFilter())
	if err != nil {
		return err
	}
	return sendBatches(items, batch, func(b []*runtimeapi.Container) error {
		return stream.Send(&runtimeapi.StreamContainersResponse{Containers: b})
	})
}

// sendBatches sends items, batch at a time; nothing when there are none
// (the stream then ends at once, as containerd's does).
func sendBatches[T any](items []*T, batch int, send func([]*T) error) error {
	for i := 0; i < len(items); i += batch {
		if err := send(items[i:min(i+batch, len(items))]); err != nil {
			return err
		}
	}
	return nil
}

// listSandboxes answers a sandbox listing; method names it for the call
// counts and hung lists.
func (r *Runtime) listSandboxes(ctx context.Context, method string, f *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	if err := r.begin(ctx, method); err != nil {
		return nil, err
	}
	defer r.end()
	r.mu.Lock()
	uid, _ := r.listTargetLocked(f.GetId(), "", f.GetLabelSelector())
	r.mu.Unlock()
	if err := r.holdList(ctx, method, uid); err != nil {
		return nil, err
	}
	var items []*runtimeapi.PodSandbox
	r.mu.Lock()
	_, pods := r.listTargetLocked(f.GetId(), "", f.GetLabelSelector())
	for _, p := range pods {
		for _, sb := range p.sandboxes {
			if f != nil {
				if f.Id != "" && f.Id != sb.id ||
					f.State != nil && f.State.State != sb.state ||
					!labelsMatch(sb.labels, f.LabelSelector) {
					continue
				}
			}
			items = append(items, r.sandboxItem(sb))
		}
	}
	r.mu.Unlock()
	if err := r.perItem(ctx, len(items)); err != nil {
		return nil, err
	}
	return items, nil
}

func (s *service) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	items, err := s.r.listContainers(ctx, "ListContainers", req.GetFilter())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListContainersResponse{Containers: items}, nil
}

// listContainers answers a container listing; method names it for the
// call counts and hung lists.
func (r *Runtime) listContainers(ctx context.Context, method string, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	if err := r.begin(ctx, method); err != nil {
		return nil, err
	}
	defer r.end()
	r.mu.Lock()
	uid, _ := r.listTargetLocked(f.GetId(), f.GetPodSandboxId(), f.GetLabelSelector())
	r.mu.Unlock()
	if err := r.holdList(ctx, method, uid); err != nil {
		return nil, err
	}
	var items []*runtimeapi.Container
	r.mu.Lock()
	_, pods := r.listTargetLocked(f.GetId(), f.GetPodSandboxId(), f.GetLabelSelector())
	for _, p := range pods {
		for _, c := range p.containers {
			if f != nil {
				if f.Id != "" && f.Id != c.id ||
					f.State != nil && f.State.State != c.state ||
					f.PodSandboxId != "" && f.PodSandboxId != c.sandbox.id ||
					!labelsMatch(c.labels, f.LabelSelector) {
					continue
				}
			}
			items = append(items, containerItem(c))
		}
	}
	r.mu.Unlock()
	if err := r.perItem(ctx, len(items)); err != nil {
		return nil, err
	}
	return items, nil
}

func (s *service) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	r := s.r
	if err := r.begin(ctx, "PodSandboxStatus"); err != nil {
		return nil, err
	}
	defer r.end()
	id := req.GetPodSandboxId()
	return statusCall(ctx, r, "PodSandboxStatus", func() (string, *runtimeapi.PodSandboxStatusResponse, error) {
		sb := r.sandboxes[id]
		if sb == nil {
			return "", nil, status.Errorf(codes.NotFound, "sim: pod sandbox %q not found", id)
		}
		return sb.pod.uid, &runtimeapi.PodSandboxStatusResponse{
			Status:             r.sandboxStatus(sb),
			ContainersStatuses: podContainerStatuses(sb.pod),
			Timestamp:          r.now(),
		}, nil
	})
}

func (s *service) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	r := s.r
	if err := r.begin(ctx, "ContainerStatus"); err != nil {
		return nil, err
	}
	defer r.end()
	id := req.GetContainerId()
	return statusCall(ctx, r, "ContainerStatus", func() (string, *runtimeapi.ContainerStatusResponse, error) {
		c := r.containers[id]
		if c == nil {
			return "", nil, status.Errorf(codes.NotFound, "sim: container %q not found", id)
		}
		resp := &runtimeapi.ContainerStatusResponse{Status: containerStatus(c)}
		if req.GetVerbose() {
			resp.Info = verboseInfo(c)
		}
		return c.pod.uid, resp, nil
	})
}

// statusCall answers a status call with what answer (run under r.mu)
// says of the item asked for and the pod it belongs to. The call counts
// against that pod; while the pod is hung, it waits until the pod is
// released, then answers with the state at that time.
func statusCall[T any](ctx context.Context, r *Runtime, method string, answer func() (uid string, resp T, err error)) (T, error) {
	var zero T
	for first := true; ; first = false {
		r.mu.Lock()
		uid, resp, err := answer()
		if err != nil {
			r.mu.Unlock()
			return zero, err
		}
		if first {
			r.countPodCall(uid, method)
		}
		if !first || !r.isHung(uid) {
			r.mu.Unlock()
			return resp, nil
		}
		r.mu.Unlock()
		if err := r.waitHung(ctx, uid); err != nil {
			return zero, err
		}
	}
}

func (r *Runtime) isHung(uid string) bool {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return r.hung[uid]
}

func (s *service) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	r := s.r
	ctx := stream.Context()
	if err := r.begin(ctx, "GetContainerEvents"); err != nil {
		return err
	}
	defer r.end()
	r.kmu.Lock()
	on := r.events
	r.kmu.Unlock()
	if !on {
		return status.Error(codes.Unimplemented, "sim: container events are disabled")
	}
	sub, first := r.subscribe()
	defer r.unsubscribe(sub)
	// What a runtime sends a new subscriber before the live events: the
	// events kept while nobody subscribed, and replayed old ones. Live
	// events emitted meanwhile wait in the subscriber's queue.
	for _, ev := range first {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	quit := r.quitChan()
	for {
		select {
		case ev := <-sub.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-sub.closed:
			return status.Error(codes.Unimplemented, "sim: container events are disabled")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-r.stopCh:
			return status.Error(codes.Unavailable, "sim: runtime stopped")
		case <-quit:
			return status.Error(codes.Unavailable, "sim: runtime went away")
		}
	}
}

// Lifecycle calls (simple model semantics).

func (s *service) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	r := s.r
	if err := r.begin(ctx, "RunPodSandbox"); err != nil {
		return nil, err
	}
	defer r.end()
	cfg := req.GetConfig()
	md := cfg.GetMetadata()
	if md == nil || md.Name == "" || md.Uid == "" {
		return nil, status.Error(codes.InvalidArgument, "sim: sandbox config needs metadata with name and uid")
	}
	host := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pods[md.Uid]
	if p == nil {
		p = r.addPodLocked(md.Uid, md.Name, md.Namespace, host, Steady, nil)
		p.app = md.Name
	}
	sb := r.runSandboxLocked(p, md.Attempt, host, req.GetRuntimeHandler(), cfg.GetLabels(), cfg.GetAnnotations())
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb.id}, nil
}

func (s *service) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	r := s.r
	if err := r.begin(ctx, "StopPodSandbox"); err != nil {
		return nil, err
	}
	defer r.end()
	if err := r.withSandbox(req.GetPodSandboxId(), r.stopSandboxLocked); err != nil {
		return nil, err
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (s *service) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r := s.r
	if err := r.begin(ctx, "RemovePodSandbox"); err != nil {
		return nil, err
	}
	defer r.end()
	if err := r.withSandbox(req.GetPodSandboxId(), r.removeSandboxLocked); err != nil {
		return nil, err
	}
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (s *service) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	r := s.r
	if err := r.begin(ctx, "CreateContainer"); err != nil {
		return nil, err
	}
	defer r.end()
	cfg := req.GetConfig()
	md := cfg.GetMetadata()
	if md == nil || md.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "sim: container config needs metadata with a name")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[req.GetPodSandboxId()]
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "sim: pod sandbox %q not found", req.GetPodSandboxId())
	}
	if sb.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "sim: pod sandbox %q is not ready", sb.id)
	}
	for _, c := range sb.pod.containers {
		if c.sandbox == sb && c.name == md.Name && c.attempt == md.Attempt {
			return nil, status.Errorf(codes.AlreadyExists, "sim: container %s attempt %d already exists in sandbox %q as %q", md.Name, md.Attempt, sb.id, c.id)
		}
	}
	p := sb.pod
	if !slices.Contains(p.names, md.Name) {
		p.names = append(p.names, md.Name)
	}
	annotations := maps.Clone(cfg.GetAnnotations())
	c := r.createContainerLocked(sb, md.Name, md.Attempt, cfg.GetImage().GetImage(), cfg.GetLabels(), annotations)
	return &runtimeapi.CreateContainerResponse{ContainerId: c.id}, nil
}

func (s *service) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	r := s.r
	if err := r.begin(ctx, "StartContainer"); err != nil {
		return nil, err
	}
	defer r.end()
	if err := r.StartContainer(req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (s *service) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r := s.r
	if err := r.begin(ctx, "StopContainer"); err != nil {
		return nil, err
	}
	defer r.end()
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.containers[req.GetContainerId()]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "sim: container %q not found", req.GetContainerId())
	}
	r.exitContainerLocked(c, 0, exitedOK)
	return &runtimeapi.StopContainerResponse{}, nil
}

// withSandbox runs do on sandbox id under r.mu, or answers NotFound.
func (r *Runtime) withSandbox(id string, do func(*sandbox)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil {
		return status.Errorf(codes.NotFound, "sim: pod sandbox %q not found", id)
	}
	do(sb)
	return nil
}

func (s *service) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r := s.r
	if err := r.begin(ctx, "RemoveContainer"); err != nil {
		return nil, err
	}
	defer r.end()
	if err := r.RemoveContainer(req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

package criserve

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// runtimeServer is runtime.v1.RuntimeService. The embedded
// UnimplementedRuntimeServiceServer only satisfies the interface: the
// methods it would answer are refused by the guarded service description
// before they reach it.
type runtimeServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	s *Server
}

// streamBatch is how many items a streamed listing sends per message.
const streamBatch = 500

// nanos is t as CRI's nanoseconds since the epoch (0 for the zero time).
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func sandboxState(s cruntime.State) runtimeapi.PodSandboxState {
	if s == cruntime.StateRunning {
		return runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return runtimeapi.PodSandboxState_SANDBOX_NOTREADY
}

func containerState(s cruntime.State) runtimeapi.ContainerState {
	switch s {
	case cruntime.StateCreated:
		return runtimeapi.ContainerState_CONTAINER_CREATED
	case cruntime.StateRunning:
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	case cruntime.StateExited:
		return runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return runtimeapi.ContainerState_CONTAINER_UNKNOWN
}

func sandboxMeta(p *journal.Pod, sb *journal.Sandbox) *runtimeapi.PodSandboxMetadata {
	name := sb.Name
	if name == "" {
		name = p.Name
	}
	return &runtimeapi.PodSandboxMetadata{Name: name, Uid: string(p.UID), Namespace: p.Namespace, Attempt: sb.Attempt}
}

// podSandbox is a sandbox as ListPodSandbox gives it.
func podSandbox(p *journal.Pod, sb *journal.Sandbox) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: sb.ID, Metadata: sandboxMeta(p, sb), State: sandboxState(sb.State),
		CreatedAt: nanos(sb.CreatedAt), Labels: sb.Labels.Map(), Annotations: sb.Annotations.Map()}
}

// sandboxStatus is a sandbox as a non-verbose PodSandboxStatus gives it.
func sandboxStatus(p *journal.Pod, sb *journal.Sandbox) *runtimeapi.PodSandboxStatus {
	mode := runtimeapi.NamespaceMode_POD
	if sb.HostNetwork {
		mode = runtimeapi.NamespaceMode_NODE
	}
	net := &runtimeapi.PodSandboxNetworkStatus{}
	if len(sb.IPs) > 0 {
		net.Ip = sb.IPs[0]
		for _, ip := range sb.IPs[1:] {
			net.AdditionalIps = append(net.AdditionalIps, &runtimeapi.PodIP{Ip: ip})
		}
	}
	return &runtimeapi.PodSandboxStatus{Id: sb.ID, Metadata: sandboxMeta(p, sb), State: sandboxState(sb.State),
		CreatedAt: nanos(sb.CreatedAt), Network: net,
		Linux:  &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{Network: mode}}},
		Labels: sb.Labels.Map(), Annotations: sb.Annotations.Map()}
}

// sandboxOf is the sandbox container c belongs to: the journal does not
// record it, so it is the newest of p's sandboxes created no later than c
// (the kubelet creates a pod's containers in its newest sandbox), or the
// newest when c is older than every one. Nil when p has none.
func sandboxOf(p *journal.Pod, c *journal.Container) *journal.Sandbox {
	var best, newest *journal.Sandbox
	for i := range p.Sandboxes {
		sb := p.Sandboxes[i]
		if newest == nil || sb.CreatedAt.After(newest.CreatedAt) {
			newest = sb
		}
		if !sb.CreatedAt.After(c.CreatedAt()) && (best == nil || sb.CreatedAt.After(best.CreatedAt)) {
			best = sb
		}
	}
	if best == nil {
		return newest
	}
	return best
}

func sandboxID(p *journal.Pod, c *journal.Container) string {
	if sb := sandboxOf(p, c); sb != nil {
		return sb.ID
	}
	return ""
}

// container is a container as ListContainers gives it: with the
// listing's creation time, which on CRI-O is not the status's.
func container(p *journal.Pod, c *journal.Container) *runtimeapi.Container {
	created := c.ListCreatedAt
	if created == 0 {
		created = nanos(c.CreatedAt())
	}
	return &runtimeapi.Container{Id: c.ID, PodSandboxId: sandboxID(p, c),
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		Image:    &runtimeapi.ImageSpec{Image: c.Image}, ImageRef: c.ImageRef(),
		State: containerState(c.State), CreatedAt: created, Labels: c.Labels().Map(), Annotations: c.Annotations().Map()}
}

// containerStatus is a container as a non-verbose ContainerStatus gives
// it.
func containerStatus(c *journal.Container) *runtimeapi.ContainerStatus {
	st := &runtimeapi.ContainerStatus{Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		State: containerState(c.State), CreatedAt: nanos(c.CreatedAt()), StartedAt: nanos(c.StartedAt()), FinishedAt: nanos(c.FinishedAt()),
		Image: &runtimeapi.ImageSpec{Image: c.Image}, ImageRef: c.ImageRef(),
		Reason: c.Reason(), Message: c.Message(), Labels: c.Labels().Map(), Annotations: c.Annotations().Map()}
	if code, ok := c.ExitCode(); ok {
		st.ExitCode = code
	}
	return st
}

// labelsMatch reports whether every pair of sel is in labels.
func labelsMatch(labels cruntime.Labels, sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels.Lookup(k); !ok || got != v {
			return false
		}
	}
	return true
}

// idMatcher matches an ID filter as the runtimes do: the ID itself or,
// when no item has it, the one item whose ID it prefixes (none when it
// prefixes several).
type idMatcher struct {
	want string
	id   string // resolved
}

func newIDMatcher(want string, ids func(yield func(string) bool)) idMatcher {
	m := idMatcher{want: want}
	if want == "" {
		return m
	}
	n := 0
	for id := range ids {
		if id == want {
			m.id = id
			return m
		}
		if strings.HasPrefix(id, want) {
			n++
			m.id = id
		}
	}
	if n != 1 {
		m.id = "\x00none"
	}
	return m
}

func (m idMatcher) match(id string) bool { return m.want == "" || id == m.id }

// sandboxIDs yields the sandbox IDs of pods.
func sandboxIDs(pods []*journal.Pod) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, p := range pods {
			for i := range p.Sandboxes {
				if !yield(p.Sandboxes[i].ID) {
					return
				}
			}
		}
	}
}

func containerIDs(pods []*journal.Pod) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, p := range pods {
			for i := range p.Containers {
				if !yield(p.Containers[i].ID) {
					return
				}
			}
		}
	}
}

// listSandboxes answers a sandbox listing from state.
func (s *Server) listSandboxes(ctx context.Context, f *runtimeapi.PodSandboxFilter) []*runtimeapi.PodSandbox {
	pods := s.pods(s.viewOf(ctx))
	ids := newIDMatcher(f.GetId(), sandboxIDs(pods))
	var out []*runtimeapi.PodSandbox
	for _, p := range pods {
		for i := range p.Sandboxes {
			sb := p.Sandboxes[i]
			if !ids.match(sb.ID) || f.GetState() != nil && f.GetState().GetState() != sandboxState(sb.State) ||
				!labelsMatch(sb.Labels, f.GetLabelSelector()) {
				continue
			}
			out = append(out, podSandbox(p, sb))
		}
	}
	sortByID(out, (*runtimeapi.PodSandbox).GetId)
	return out
}

// listContainers answers a container listing from state.
func (s *Server) listContainers(ctx context.Context, f *runtimeapi.ContainerFilter) []*runtimeapi.Container {
	pods := s.pods(s.viewOf(ctx))
	ids := newIDMatcher(f.GetId(), containerIDs(pods))
	sbs := newIDMatcher(f.GetPodSandboxId(), sandboxIDs(pods))
	var out []*runtimeapi.Container
	for _, p := range pods {
		for i := range p.Containers {
			c := p.Containers[i]
			if !ids.match(c.ID) || f.GetState() != nil && f.GetState().GetState() != containerState(c.State) ||
				!labelsMatch(c.Labels(), f.GetLabelSelector()) {
				continue
			}
			item := container(p, c)
			if !sbs.match(item.PodSandboxId) {
				continue
			}
			out = append(out, item)
		}
	}
	sortByID(out, (*runtimeapi.Container).GetId)
	return out
}

func (r *runtimeServer) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: r.s.listSandboxes(ctx, req.GetFilter())}, nil
}

func (r *runtimeServer) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: r.s.listContainers(ctx, req.GetFilter())}, nil
}

// sendBatches sends items streamBatch at a time (nothing when none).
func sendBatches[T any](items []T, send func([]T) error) error {
	for len(items) > 0 {
		n := min(len(items), streamBatch)
		if err := send(items[:n]); err != nil {
			return err
		}
		items = items[n:]
	}
	return nil
}

func (r *runtimeServer) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	return sendBatches(r.s.listSandboxes(stream.Context(), req.GetFilter()), func(b []*runtimeapi.PodSandbox) error {
		return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: b})
	})
}

func (r *runtimeServer) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	return sendBatches(r.s.listContainers(stream.Context(), req.GetFilter()), func(b []*runtimeapi.Container) error {
		return stream.Send(&runtimeapi.StreamContainersResponse{Containers: b})
	})
}

// findSandbox finds a current sandbox by ID (or unique prefix) that v
// sees.
func (s *Server) findSandbox(v view, id string) (*journal.Pod, *journal.Sandbox, bool) {
	pods := s.pods(v)
	m := newIDMatcher(id, sandboxIDs(pods))
	for _, p := range pods {
		for i := range p.Sandboxes {
			if m.match(p.Sandboxes[i].ID) {
				return p, p.Sandboxes[i], true
			}
		}
	}
	return nil, nil, false
}

// findContainer finds a current container by ID (or unique prefix) that
// v sees.
func (s *Server) findContainer(v view, id string) (*journal.Pod, *journal.Container, bool) {
	pods := s.pods(v)
	m := newIDMatcher(id, containerIDs(pods))
	for _, p := range pods {
		for i := range p.Containers {
			if m.match(p.Containers[i].ID) {
				return p, p.Containers[i], true
			}
		}
	}
	return nil, nil, false
}

func (r *runtimeServer) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, status.Error(codes.InvalidArgument, "pod_sandbox_id is required")
	}
	s := r.s
	p, sb, ok := s.findSandbox(s.viewOf(ctx), req.GetPodSandboxId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pleg: no pod sandbox %q (as of pleg's last relist)", req.GetPodSandboxId())
	}
	if req.GetVerbose() {
		req.PodSandboxId = sb.ID
		return typed[*runtimeapi.PodSandboxStatusResponse](s.verbose.get(ctx, verboseKey("PodSandboxStatus", sb.ID, sb.State), func(ctx context.Context) (any, error) {
			return passUnary(s, ctx, "PodSandboxStatus", func(ctx context.Context) (*runtimeapi.PodSandboxStatusResponse, error) {
				return s.cfg.Runtime.PodSandboxStatus(ctx, req)
			})
		}))
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: sandboxStatus(p, sb), Timestamp: nanos(p.ObservedAt)}
	for i := range p.Containers {
		if sandboxOf(p, p.Containers[i]) == sb {
			resp.ContainersStatuses = append(resp.ContainersStatuses, containerStatus(p.Containers[i]))
		}
	}
	return resp, nil
}

func (r *runtimeServer) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if req.GetContainerId() == "" {
		return nil, status.Error(codes.InvalidArgument, "container_id is required")
	}
	s := r.s
	_, c, ok := s.findContainer(s.viewOf(ctx), req.GetContainerId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pleg: no container %q (as of pleg's last relist)", req.GetContainerId())
	}
	if req.GetVerbose() {
		req.ContainerId = c.ID
		if resp, ok := s.cfg.Verbose.get("ContainerStatus", c.ID, c.State); ok {
			return typed[*runtimeapi.ContainerStatusResponse](resp, nil)
		}
		return typed[*runtimeapi.ContainerStatusResponse](s.verbose.get(ctx, verboseKey("ContainerStatus", c.ID, c.State), func(ctx context.Context) (any, error) {
			return passUnary(s, ctx, "ContainerStatus", func(ctx context.Context) (*runtimeapi.ContainerStatusResponse, error) {
				return s.cfg.Runtime.ContainerStatus(ctx, req)
			})
		}))
	}
	return &runtimeapi.ContainerStatusResponse{Status: containerStatus(c)}, nil
}

// Status answers the runtime's conditions as pleg last saw them.
func (r *runtimeServer) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	s := r.s
	if req.GetVerbose() || s.cfg.Conditions == nil {
		return passUnary(s, ctx, "Status", func(ctx context.Context) (*runtimeapi.StatusResponse, error) {
			return s.cfg.Runtime.Status(ctx, req)
		})
	}
	conds, at, lastErr := s.cfg.Conditions.RuntimeConditions()
	switch {
	case lastErr != nil:
		return nil, status.Errorf(codes.Unavailable, "pleg's last Status call to the runtime failed: %v", lastErr)
	case at.IsZero():
		return nil, status.Error(codes.Unavailable, "pleg has not had the runtime's status yet")
	}
	st := &runtimeapi.RuntimeStatus{}
	for _, c := range conds {
		st.Conditions = append(st.Conditions, &runtimeapi.RuntimeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
	return &runtimeapi.StatusResponse{Status: st}, nil
}

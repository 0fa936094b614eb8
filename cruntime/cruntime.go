// Package cruntime defines what the pod lifecycle event generator needs from a
// container runtime, and the runtime-neutral types it speaks: pods as listed
// (sandboxes and containers grouped by pod UID), full pod statuses, and
// runtime container events.
//
// The production implementation over CRI v1 gRPC lives in cruntime/cri; a
// simulated CRI runtime for demos, tests and benchmarks lives in cruntime/sim.
// Nothing here knows about the generator itself.
package cruntime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Well-known labels a kubelet-managed runtime puts on sandboxes and containers.
const (
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelContainerName = "io.kubernetes.container.name"
)

// State is the runtime state of a container or sandbox, reduced to what the
// generator distinguishes. Sandboxes use StateRunning (ready) and StateExited
// (not ready).
type State int

const (
	StateUnknown State = iota // CONTAINER_UNKNOWN, or any value we do not know
	StateCreated              // CONTAINER_CREATED
	StateRunning              // CONTAINER_RUNNING, SANDBOX_READY
	StateExited               // CONTAINER_EXITED, SANDBOX_NOTREADY
)

func (s State) String() string {
	switch s {
	case StateCreated:
		return "created"
	case StateRunning:
		return "running"
	case StateExited:
		return "exited"
	default:
		return "unknown"
	}
}

// Container is one container or sandbox as a list call reports it.
type Container struct {
	ID        string
	Name      string // container name; for a sandbox, the pod name
	Attempt   uint32
	State     State
	Image     string
	CreatedAt int64 // nanoseconds since the epoch, as CRI reports it
}

// Pod groups the sandboxes and containers that share one pod UID.
type Pod struct {
	UID        types.UID
	Name       string
	Namespace  string
	Sandboxes  []*Container
	Containers []*Container
}

// SandboxStatus is the full status of one pod sandbox.
type SandboxStatus struct {
	ID        string
	State     State
	CreatedAt time.Time
	Attempt   uint32
	IPs       []string // primary first
	// HostNetwork is true when the sandbox shares the node's network namespace.
	HostNetwork bool
	// Labels and Annotations are the sandbox's (the pod's, as the
	// kubelet set them).
	Labels, Annotations Labels
}

// ContainerStatus is the full status of one container.
type ContainerStatus struct {
	ID         string
	Name       string
	Attempt    uint32
	State      State
	Image      string
	ImageRef   string
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	ExitCode   int32
	Reason     string
	Message    string
	// Labels and Annotations are the container's.
	Labels, Annotations Labels
}

// PodStatus is the full status of a pod: every sandbox and container of it
// that the runtime still knows.
type PodStatus struct {
	UID               types.UID
	Name              string
	Namespace         string
	IPs               []string
	SandboxStatuses   []*SandboxStatus
	ContainerStatuses []*ContainerStatus
}

// Runtime is what the generator needs from a container runtime.
//
// The contract:
//   - Implementations are safe for concurrent use. Every call may block
//     (it is I/O); it must return once ctx is done, and should bound itself
//     (runtime/cri applies the runtime request timeout to each call).
//   - What a call returns is never mutated afterwards, by the runtime or by
//     the generator: pods, containers and statuses are read-only values
//     that may be shared.
//   - An unchanged pod may be returned again as the very same *Pod (and an
//     unchanged listing as the very same pods in the same order): the
//     generator then skips its checks. A pod whose listing changed is a new
//     *Pod. Equal content in a new *Pod is fine; it only costs a comparison.
//   - Each runtime call an implementation makes is reported to the
//     context's CallTracer (CallTracerFrom), so that a call the generator
//     gives up on can be named; a call timed out while none is reported is
//     labelled "unknown".
type Runtime interface {
	// ListPods lists every sandbox and container, in every state, grouped
	// by pod UID. Items without metadata or ID are skipped.
	ListPods(ctx context.Context) ([]*Pod, error)
	// ListPod lists the sandboxes and containers of one pod. It returns
	// (nil, nil) when the runtime has nothing for that UID.
	ListPod(ctx context.Context, uid types.UID) (*Pod, error)
	// ItemStatuses fetches the status of each of sandboxes and containers,
	// listed items of pod (no further list calls). The results are in the
	// order of the arguments; an item the runtime no longer knows
	// (NotFound) is nil, not an error. Any other failure is the error of
	// the whole call. NewPodStatus assembles the results into the pod's
	// status; the generator asks for every item of a pod, or (delta
	// inspection) only for those whose listing changed since their last
	// status.
	ItemStatuses(ctx context.Context, pod *Pod, sandboxes, containers []*Container) ([]*SandboxStatus, []*ContainerStatus, error)
	// Identities fetches what ties each of containers, listed containers
	// of pod, to the kernel: its init PID and cgroup path (CRI: a verbose
	// ContainerStatus). Results are in the order of the arguments; nil for
	// a container the runtime no longer knows or has no process for. A
	// runtime that cannot tell returns ErrIdentityUnsupported. The
	// generator asks only while a watcher wants identities, once per
	// running container.
	Identities(ctx context.Context, pod *Pod, containers []*Container) ([]*Identity, error)
}

// Identity ties a container to what the kernel sees.
type Identity struct {
	// PID is the container's init process in the node's PID namespace.
	PID int64
	// CgroupPath is the container's cgroup as the runtime's OCI spec
	// gives it (linux.cgroupsPath).
	CgroupPath string
}

// ErrIdentityUnsupported says that a runtime cannot tell containers'
// identities.
var ErrIdentityUnsupported = errors.New("runtime does not report container identities")

// ErrMalformed is wrapped by the errors about runtime answers that break
// the Runtime contract (a nil where a value is promised, a wrong number of
// statuses).
var ErrMalformed = errors.New("malformed runtime answer")

// FetchPodStatus fetches the status of every sandbox and container of pod
// with one ItemStatuses call and assembles it (NewPodStatus).
func FetchPodStatus(ctx context.Context, rt Runtime, pod *Pod) (*PodStatus, error) {
	sbs, cts, err := rt.ItemStatuses(ctx, pod, pod.Sandboxes, pod.Containers)
	if err != nil {
		return nil, err
	}
	if len(sbs) != len(pod.Sandboxes) || len(cts) != len(pod.Containers) {
		return nil, fmt.Errorf("%w: ItemStatuses for pod %s/%s returned %d sandbox and %d container statuses for %d and %d items",
			ErrMalformed, pod.Namespace, pod.Name, len(sbs), len(cts), len(pod.Sandboxes), len(pod.Containers))
	}
	return NewPodStatus(pod, sbs, cts), nil
}

// NewPodStatus assembles the status of pod from the statuses of its
// sandboxes and containers (nil entries are skipped): each kind is sorted
// newest first by creation time (stable, so items created at the same time
// keep their order), and the pod's IPs are those of the newest sandbox, only
// if it is ready. Every PodStatus a runtime of this module returns is made
// here, so a status assembled from reused and fetched items is the same as
// one fetched whole.
func NewPodStatus(pod *Pod, sandboxes []*SandboxStatus, containers []*ContainerStatus) *PodStatus {
	ps := &PodStatus{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace}
	for _, s := range sandboxes {
		if s != nil {
			ps.SandboxStatuses = append(ps.SandboxStatuses, s)
		}
	}
	for _, c := range containers {
		if c != nil {
			ps.ContainerStatuses = append(ps.ContainerStatuses, c)
		}
	}
	slices.SortStableFunc(ps.SandboxStatuses, func(a, b *SandboxStatus) int { return b.CreatedAt.Compare(a.CreatedAt) })
	slices.SortStableFunc(ps.ContainerStatuses, func(a, b *ContainerStatus) int { return b.CreatedAt.Compare(a.CreatedAt) })
	if len(ps.SandboxStatuses) > 0 && ps.SandboxStatuses[0].State == StateRunning && len(ps.SandboxStatuses[0].IPs) > 0 {
		ps.IPs = slices.Clone(ps.SandboxStatuses[0].IPs)
	}
	return ps
}

// EventType is the type of a runtime container event.
type EventType int

const (
	EventCreated EventType = iota // CONTAINER_CREATED_EVENT
	EventStarted                  // CONTAINER_STARTED_EVENT
	EventStopped                  // CONTAINER_STOPPED_EVENT
	EventDeleted                  // CONTAINER_DELETED_EVENT
)

func (t EventType) String() string {
	switch t {
	case EventCreated:
		return "CONTAINER_CREATED_EVENT"
	case EventStarted:
		return "CONTAINER_STARTED_EVENT"
	case EventStopped:
		return "CONTAINER_STOPPED_EVENT"
	case EventDeleted:
		return "CONTAINER_DELETED_EVENT"
	default:
		return "UNKNOWN_EVENT"
	}
}

// Event is one runtime container event (CRI GetContainerEvents). The
// generator treats events only as hints about which pod to relist.
type Event struct {
	ContainerID string
	Type        EventType
	CreatedAt   time.Time
	// Pod identifies the pod the event belongs to, when the runtime says.
	PodUID       types.UID
	PodName      string
	PodNamespace string
}

// EventSource is implemented by runtimes that stream container events.
type EventSource interface {
	// WatchEvents streams events to fn until ctx is done or the stream
	// fails. It calls connected (if not nil) once the stream is open. It
	// returns ErrEventsUnsupported when the runtime has no event stream.
	// fn must not block for long.
	WatchEvents(ctx context.Context, connected func(), fn func(Event)) error
}

// ErrEventsUnsupported says that a runtime does not stream container events.
var ErrEventsUnsupported = errors.New("runtime does not support container events")

// Condition is one runtime condition (CRI RuntimeCondition).
type Condition struct {
	Type    string
	Status  bool
	Reason  string
	Message string
}

// Well-known runtime condition types.
const (
	RuntimeReady = "RuntimeReady"
	NetworkReady = "NetworkReady"
)

// StatusChecker is implemented by runtimes that report their own conditions
// (CRI Status).
type StatusChecker interface {
	Status(ctx context.Context) ([]Condition, error)
}

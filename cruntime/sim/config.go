package sim

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// Config configures a simulated runtime. The zero value is a valid, empty,
// fault-free node with events on: add pods with AddPod or drive it through
// the CRI calls.
type Config struct {
	// Clock provides timestamps and drives Run. Nil means the real clock.
	// Injected latency and hung calls always use real time.
	Clock clock.Clock

	// Seed seeds the deterministic generator of the workload and of every
	// generated ID. The same seed and the same sequence of Step and
	// mutation calls give an identical model.
	Seed uint64

	// Pods is the number of pods created by New, each with
	// ContainersPerPod running containers (0 means 1).
	Pods             int
	ContainersPerPod int

	// ChurnPerStep is the number of workload actions one Step takes
	// (0: Step only garbage-collects). Each action advances one pod that is
	// not Steady by one transition of its behaviour.
	ChurnPerStep int
	// Mix weighs the behaviours given to pods created by the workload. The
	// zero value means DefaultMix.
	Mix Mix
	// KeepExitedAttempts is the number of exited, superseded attempts kept
	// per (pod, container name) by the garbage collection that starts each
	// Step; older ones are removed. 0 means 1 (the kubelet's default);
	// negative keeps none.
	KeepExitedAttempts int

	// Latency is added to every unary call.
	Latency Latency
	// HangPods makes the PodSandboxStatus and ContainerStatus calls of the
	// first HangPods pods created by New never answer; HangUIDs does the
	// same for pods named by UID. A hung call returns when the client's
	// context is done, when the pod is un-hung (SetHung), or when the
	// server goes away or stops.
	HangPods int
	HangUIDs []string
	// HangLists makes the list calls filtered to the pods of HangPods and
	// HangUIDs hang too (see Runtime.SetHungLists); unfiltered list calls
	// keep answering.
	HangLists bool
	// HungPodEvents, when positive, makes the runtime stream a container
	// event for each pod of HangPods and HangUIDs every HungPodEvents (see
	// Runtime.EmitEvents), as a runtime does for a crash-looping or
	// flapping container.
	HungPodEvents time.Duration
	// ErrorRate is the fraction of calls (in [0, 1]) that fail at once
	// with codes.Unavailable or codes.Internal.
	ErrorRate float64

	// DisableEvents makes GetContainerEvents answer codes.Unimplemented.
	DisableEvents bool
	// DisableListStreaming makes StreamPodSandboxes and StreamContainers
	// (KEP-5825) answer codes.Unimplemented, as runtimes before it do
	// (containerd 2.3 and earlier). See Runtime.SetListStreaming.
	DisableListStreaming bool
	// ListStreamBatch is the number of items per message of a streamed
	// listing; 0 means DefaultListStreamBatch.
	ListStreamBatch int
	// EventDropRate is the fraction of events (in [0, 1]) not sent to a
	// subscriber.
	EventDropRate float64
	// EventReorderRate is the fraction of events (in [0, 1]) a subscriber
	// gets late: held back, and sent right after the next event sent to
	// it (see Runtime.SetEventReorderRate).
	EventReorderRate float64
	// EventBuffer is the number of events buffered per subscriber before
	// further events are dropped (0 means 1000).
	EventBuffer int
	// EventStorm, when positive, is a number of container events per
	// second streamed over every pod in turn (see Runtime.SetEventStorm).
	EventStorm int
	// KeepEvents, when positive, keeps the events emitted while nobody
	// subscribes, for that long (of Clock time, at most EventBuffer of
	// them), and sends them first to the next subscriber, with their own
	// CreatedAt, as containerd 2.x does (for 5 minutes). See
	// Runtime.SetKeepEvents.
	KeepEvents time.Duration
	// ReplayEvents, when positive, sends every new subscriber that many
	// old events first, about the containers there are, with CreatedAt
	// ReplayAge in the past (0 means DefaultReplayAge). See
	// Runtime.SetReplay.
	ReplayEvents int
	ReplayAge    time.Duration

	// KubeletMetadata gives the pods the workload creates (New's and
	// Step's) the labels and annotations a kubelet puts on sandboxes and
	// containers (see kubeletSandboxMeta and kubeletContainerMeta): the
	// pod's labels (app, pod-template-hash) and annotations
	// (kubernetes.io/config.seen and .source, a few shared by the
	// replicas of a workload), and each container's io.kubernetes.*
	// annotations (hash, restartCount, termination message, ports). Off,
	// they carry only the io.kubernetes.* labels pleg reads and three
	// annotations.
	KubeletMetadata bool

	// ReplacePerStep replaces that many pods each Step, the oldest first,
	// as a node's pods come and go: each is removed (its sandboxes and
	// containers) and a pod of the same workload, behaviour and number of
	// containers, with a UID and name of its own, takes its place.
	ReplacePerStep int
	// SandboxAnnotationBytes, when positive, gives every sandbox an
	// annotation of about that many bytes whose value is its pod's own
	// (k8s.v1.cni.cncf.io/network-status, as a CNI writes one).
	SandboxAnnotationBytes int

	// CRIOMux serves the socket as CRI-O does: behind cmux, which hands a
	// connection to the gRPC server only when its first request's
	// content-type is exactly "application/grpc" and closes it otherwise
	// (a client sending "application/grpc+proto" gets its connection
	// reset, every time).
	CRIOMux bool
}

// DefaultListStreamBatch is the number of items per message of a streamed
// listing when Config.ListStreamBatch is not positive: containerd 2.4's.
const DefaultListStreamBatch = 5000

// DefaultReplayAge is the age of replayed events when Config.ReplayAge or
// SetReplay's age is not positive: 4 minutes, within the 5 minutes
// containerd 2.x keeps events while nobody subscribes.
const DefaultReplayAge = 4 * time.Minute

// Behaviour is what the workload does with a pod.
type Behaviour int

const (
	// Steady pods run and never change by themselves. AddPod creates
	// Steady pods unless told otherwise.
	Steady Behaviour = iota
	// CrashLoop pods have containers that exit with an error and are
	// restarted later as a new attempt with a new container ID.
	CrashLoop
	// Batch pods run containers to completion (exit code 0), then their
	// sandbox stops, then the pod is removed and a new batch pod created.
	Batch
	// RollingUpdate pods are replaced: a new pod of the same app is
	// created, the old one stopped and later removed.
	RollingUpdate
)

func (b Behaviour) String() string {
	switch b {
	case Steady:
		return "steady"
	case CrashLoop:
		return "crashloop"
	case Batch:
		return "batch"
	case RollingUpdate:
		return "rolling-update"
	default:
		return fmt.Sprintf("Behaviour(%d)", int(b))
	}
}

// Mix weighs the behaviours of generated pods (relative weights, >= 0).
type Mix struct {
	Steady, CrashLoop, Batch, RollingUpdate int
}

// DefaultMix is the behaviour mix used when Config.Mix is zero.
var DefaultMix = Mix{Steady: 70, CrashLoop: 10, Batch: 10, RollingUpdate: 10}

func (m Mix) total() int { return m.Steady + m.CrashLoop + m.Batch + m.RollingUpdate }

// Dist is the distribution of latency jitter.
type Dist int

const (
	// Uniform jitter is drawn uniformly from [0, Jitter).
	Uniform Dist = iota
	// Exponential jitter is drawn from an exponential distribution with
	// mean Jitter.
	Exponential
)

// Latency is the simulated duration of a unary call:
// Base + jitter + PerItem*len(items) (items: the entries a list call
// returns). Latency uses real time, not Config.Clock.
type Latency struct {
	Base       time.Duration
	Jitter     time.Duration
	JitterDist Dist
	PerItem    time.Duration
}

func clamp01(f float64) float64 {
	switch {
	case f < 0 || f != f: // negative or NaN
		return 0
	case f > 1:
		return 1
	}
	return f
}

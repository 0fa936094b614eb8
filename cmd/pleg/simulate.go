package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

func init() { register(newSimulateCmd) }

type simulateOptions struct {
	listen           string
	pods             int
	containersPerPod int
	seed             uint64
	churn            int
	stepInterval     time.Duration
	latency          time.Duration
	latencyJitter    time.Duration
	latencyPerItem   time.Duration
	hangPods         int
	hangPodLists     bool
	hungPodEvents    time.Duration
	hangAfter        time.Duration
	errorRate        float64
	events           bool
	listStreaming    bool
	eventDropRate    float64
	eventReorderRate float64
	eventStorm       int
	keepEvents       time.Duration
	replayEvents     int
	replayEventAge   time.Duration
	crioMux          bool
	turnover         simTurnover // pods replaced at a rate (see simTurnover)
}

func newSimulateCmd() *cobra.Command {
	o := &simulateOptions{}
	cmd := &cobra.Command{
		Use:   "simulate --listen unix:///path/to.sock",
		Short: "Serve a simulated CRI runtime with a changing workload",
		Long: `simulate serves a simulated container runtime that speaks the CRI v1 gRPC API
on a unix socket, so pleg (or any CRI client) can run against it anywhere.
Its node holds --pods pods of --containers-per-pod containers; every
--step-interval the workload makes --churn changes (crash loops, completing
batch jobs, rolling updates), deterministically from --seed. Faults can be
injected: call latency, hung status calls (and, with --hang-pod-lists, hung
list calls filtered to the hung pods), errors, lost events, events streamed
continuously for the hung pods (--events-for-hung-pods) or for every pod
(--event-storm), and old events sent first to every new subscriber
(--keep-events, --replay-events). --hang-after applies the hung pods'
faults some time after the start, so that a client has seen the pods
answer first.

To reproduce a hung pod whose container keeps flapping, as a PLEG sees it:

  pleg simulate --listen unix:///tmp/sim.sock --pods 110 --containers-per-pod 5 \
    --churn 0 --latency 1ms --hang-pods 1 --hang-pod-lists --events-for-hung-pods 20ms

It runs until SIGINT or SIGTERM, then removes its socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSimulate(cmd, o) },
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func (o *simulateOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", "", "unix socket to serve on: unix:///absolute/path or /absolute/path (required)")
	intVar(f, &o.pods, "pods", 10, 0, maxSimPods, "number of pods at start")
	intVar(f, &o.containersPerPod, "containers-per-pod", 2, 0, 100, "containers per pod")
	uint64Var(f, &o.seed, "seed", 1, "seed of the deterministic workload and IDs")
	intVar(f, &o.churn, "churn", 2, 0, maxSimPods, "workload changes per step (0: a static node)")
	durationVar(f, &o.stepInterval, "step-interval", time.Second, time.Millisecond, time.Hour, "interval between workload steps")
	durationVar(f, &o.latency, "latency", 0, 0, time.Minute, "base latency of every call")
	durationVar(f, &o.latencyJitter, "latency-jitter", 0, 0, time.Minute, "extra latency drawn uniformly from [0, jitter)")
	durationVar(f, &o.latencyPerItem, "latency-per-item", 0, 0, time.Second, "extra latency per item returned by list calls")
	intVar(f, &o.hangPods, "hang-pods", 0, 0, maxSimPods, "number of pods (the first ones) whose status calls never answer")
	f.BoolVar(&o.hangPodLists, "hang-pod-lists", false, "the list calls filtered to a hung pod (by its UID label, sandbox or container ID) never answer either; unfiltered lists do")
	durationVar(f, &o.hungPodEvents, "events-for-hung-pods", 0, time.Millisecond, time.Hour, "stream a container event (stopped, started, ...) for each hung pod at this interval, the pod unchanged (0: none)",
		special[time.Duration]{0, "none"})
	durationVar(f, &o.hangAfter, "hang-after", 0, 0, 24*time.Hour, "apply --hang-pods, --hang-pod-lists and --events-for-hung-pods this long after starting, to the first pods then (0: from the start)")
	floatVar(f, &o.errorRate, "error-rate", 0, 0, 1, "fraction of calls failing with Unavailable or Internal, in [0,1]")
	f.BoolVar(&o.events, "events", true, "serve GetContainerEvents (false: Unimplemented)")
	f.BoolVar(&o.listStreaming, "list-streaming", true, "serve the streaming list RPCs StreamPodSandboxes and StreamContainers, 5,000 items a message as containerd 2.4 (false: Unimplemented, as containerd 2.3 and earlier)")
	floatVar(f, &o.eventDropRate, "event-drop-rate", 0, 0, 1, "fraction of container events not sent, in [0,1]")
	floatVar(f, &o.eventReorderRate, "event-reorder-rate", 0, 0, 1, "fraction of container events a subscriber gets late, right after the next one sent to it (swapped), in [0,1]")
	intVar(f, &o.eventStorm, "event-storm", 0, 0, 100000, "stream this many container events per second, spread over every pod in turn, the pods unchanged (0: none)")
	durationVar(f, &o.keepEvents, "keep-events", 0, 0, 24*time.Hour, "keep the events emitted while nobody subscribes for this long and send them to the next subscriber first, as containerd 2.x does for 5m (0: none)")
	intVar(f, &o.replayEvents, "replay-events", 0, 0, 1000000, "send every new event subscriber this many old events first, about the containers there are (0: none)")
	f.BoolVar(&o.crioMux, "crio-mux", false, "serve the socket behind cmux as CRI-O does: a connection whose first request's content-type is not exactly application/grpc is closed")
	durationVar(f, &o.replayEventAge, "replay-event-age", sim.DefaultReplayAge, time.Millisecond, 24*time.Hour, "how old the events of --replay-events are")
	o.turnover.addFlags(f)
}

// simSocketPath turns --listen into a socket path.
func simSocketPath(listen string) (string, error) {
	if listen == "" {
		return "", usageErrorf("--listen is required (e.g. --listen unix:///tmp/pleg-sim.sock)")
	}
	path := listen
	if strings.Contains(listen, "://") {
		var ok bool
		if path, ok = strings.CutPrefix(listen, "unix://"); !ok {
			return "", usageErrorf("--listen %q: only unix sockets are supported (unix:///absolute/path)", listen)
		}
	}
	if !filepath.IsAbs(path) {
		return "", usageErrorf("--listen %q: the socket path must be absolute (unix:///absolute/path)", listen)
	}
	return filepath.Clean(path), nil
}

// maxSimPods bounds the simulated node's pods (and churn): a node of
// 100,000 pods is 50 times Kubernetes' largest supported node density.
const maxSimPods = 100000

// maxSimContainers bounds the simulated node's containers (about 1 KiB of
// memory each in the simulator).
const maxSimContainers = 1000000

func (o *simulateOptions) config() (sim.Config, error) {
	if o.pods*o.containersPerPod > maxSimContainers {
		return sim.Config{}, usageErrorf("--pods (%d) times --containers-per-pod (%d) must not exceed %d containers", o.pods, o.containersPerPod, maxSimContainers)
	}
	if o.hangPods > o.pods {
		return sim.Config{}, usageErrorf("--hang-pods (%d) must not exceed --pods (%d)", o.hangPods, o.pods)
	}
	if (o.hangPodLists || o.hungPodEvents > 0 || o.hangAfter > 0) && o.hangPods == 0 {
		return sim.Config{}, usageErrorf("--hang-pod-lists, --events-for-hung-pods and --hang-after need --hang-pods")
	}
	if !o.events && (o.hungPodEvents > 0 || o.eventStorm > 0 || o.keepEvents > 0 || o.replayEvents > 0) {
		return sim.Config{}, usageErrorf("--events-for-hung-pods, --event-storm, --keep-events and --replay-events need --events")
	}
	return sim.Config{
		Seed:                 o.seed,
		Pods:                 o.pods,
		ContainersPerPod:     o.containersPerPod,
		ChurnPerStep:         o.churn,
		Latency:              sim.Latency{Base: o.latency, Jitter: o.latencyJitter, PerItem: o.latencyPerItem},
		HangPods:             o.hangPods,
		HangLists:            o.hangPodLists,
		HungPodEvents:        o.hungPodEvents,
		ErrorRate:            o.errorRate,
		DisableEvents:        !o.events,
		DisableListStreaming: !o.listStreaming,
		EventDropRate:        o.eventDropRate,
		EventReorderRate:     o.eventReorderRate,
		EventStorm:           o.eventStorm,
		KeepEvents:           o.keepEvents,
		ReplayEvents:         o.replayEvents,
		ReplayAge:            o.replayEventAge,
		CRIOMux:              o.crioMux,
	}, nil
}

func runSimulate(cmd *cobra.Command, o *simulateOptions) error {
	path, err := simSocketPath(o.listen)
	if err != nil {
		return err
	}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	o.turnover.apply(&cfg)
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// With --hang-after, the runtime starts without the hung pods' faults
	// and applies them later, to the same pods.
	hang := cfg
	if o.hangAfter > 0 {
		cfg.HangPods, cfg.HangLists, cfg.HungPodEvents = 0, false, 0
	}
	r := sim.New(cfg)
	if err := r.Serve(path); err != nil {
		return fmt.Errorf("serving on %s: %w", path, err)
	}
	defer r.Stop()
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "simulated CRI runtime listening on %s\n", r.Endpoint())
	klog.V(2).InfoS("Simulated runtime started", "endpoint", r.Endpoint(), "pods", cfg.Pods,
		"containersPerPod", cfg.ContainersPerPod, "seed", cfg.Seed, "churn", cfg.ChurnPerStep, "stepInterval", o.stepInterval)
	hangDone := make(chan struct{})
	if o.hangAfter > 0 {
		go func() {
			defer close(hangDone)
			t := time.NewTimer(o.hangAfter)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pods := r.Pods()
			for _, p := range pods[:min(hang.HangPods, len(pods))] {
				r.SetHung(p.UID, true)
				if hang.HangLists {
					r.SetHungLists(p.UID, true)
				}
				if hang.HungPodEvents > 0 {
					r.EmitEvents(p.UID, hang.HungPodEvents)
				}
			}
			announceHung(out, r, hang)
		}()
	} else {
		announceHung(out, r, cfg)
		close(hangDone)
	}
	r.Run(ctx, o.stepInterval)
	<-ctx.Done()
	r.Stop()
	<-hangDone
	klog.V(2).InfoS("Simulated runtime stopped", "steps", r.StepCount(), "calls", r.Calls())
	return nil
}

// announceHung prints one line per hung pod.
func announceHung(out io.Writer, r *sim.Runtime, cfg sim.Config) {
	for _, uid := range r.Hung() {
		what := "status calls hang"
		if cfg.HangLists {
			what = "status calls and filtered list calls hang"
		}
		if cfg.HungPodEvents > 0 {
			what += fmt.Sprintf("; an event every %v", cfg.HungPodEvents)
		}
		fmt.Fprintf(out, "hung pod %s: %s\n", uid, what)
	}
}

// simTurnover is the node's pod turnover (issue 36, hazard 1: the CRI
// client's interning table must let go of dead pods' values): pods
// replaced each step, the oldest first, each sandbox with an annotation
// of its own.
type simTurnover struct {
	replace         int
	annotationBytes int
}

func (t *simTurnover) addFlags(f *pflag.FlagSet) {
	intVar(f, &t.replace, "replace-pods", 0, 0, maxSimPods, "pods replaced each step, the oldest first, by pods of their own (0: none)")
	intVar(f, &t.annotationBytes, "sandbox-annotation-bytes", 0, 0, 1<<20, "give every sandbox an annotation of this many bytes only its pod has, as a CNI's network status (0: none)")
}

func (t simTurnover) apply(cfg *sim.Config) {
	cfg.ReplacePerStep, cfg.SandboxAnnotationBytes = t.replace, t.annotationBytes
}

package main

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg/runtime/sim"
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
	errorRate        float64
	events           bool
	eventDropRate    float64
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
injected: call latency, hung status calls, errors, lost events.

It runs until SIGINT or SIGTERM, then removes its socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSimulate(cmd, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "", "unix socket to serve on: unix:///absolute/path or /absolute/path (required)")
	f.IntVar(&o.pods, "pods", 10, "number of pods at start")
	f.IntVar(&o.containersPerPod, "containers-per-pod", 2, "containers per pod")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the deterministic workload and IDs")
	f.IntVar(&o.churn, "churn", 2, "workload changes per step (0: a static node)")
	f.DurationVar(&o.stepInterval, "step-interval", time.Second, "interval between workload steps")
	f.DurationVar(&o.latency, "latency", 0, "base latency of every call")
	f.DurationVar(&o.latencyJitter, "latency-jitter", 0, "extra latency drawn uniformly from [0, jitter)")
	f.DurationVar(&o.latencyPerItem, "latency-per-item", 0, "extra latency per item returned by list calls")
	f.IntVar(&o.hangPods, "hang-pods", 0, "number of pods (the first ones) whose status calls never answer")
	f.Float64Var(&o.errorRate, "error-rate", 0, "fraction of calls failing with Unavailable or Internal, in [0,1]")
	f.BoolVar(&o.events, "events", true, "serve GetContainerEvents (false: Unimplemented)")
	f.Float64Var(&o.eventDropRate, "event-drop-rate", 0, "fraction of container events not sent, in [0,1]")
	return cmd
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

func (o *simulateOptions) config() (sim.Config, error) {
	for _, c := range []struct {
		name string
		v    int
	}{{"--pods", o.pods}, {"--containers-per-pod", o.containersPerPod}, {"--churn", o.churn}, {"--hang-pods", o.hangPods}} {
		if c.v < 0 {
			return sim.Config{}, usageErrorf("%s must not be negative, got %d", c.name, c.v)
		}
	}
	if o.hangPods > o.pods {
		return sim.Config{}, usageErrorf("--hang-pods (%d) must not exceed --pods (%d)", o.hangPods, o.pods)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--latency", o.latency}, {"--latency-jitter", o.latencyJitter}, {"--latency-per-item", o.latencyPerItem}} {
		if d.v < 0 {
			return sim.Config{}, usageErrorf("%s must not be negative, got %v", d.name, d.v)
		}
	}
	if o.stepInterval <= 0 {
		return sim.Config{}, usageErrorf("--step-interval must be positive, got %v", o.stepInterval)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"--error-rate", o.errorRate}, {"--event-drop-rate", o.eventDropRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			return sim.Config{}, usageErrorf("%s must be between 0 and 1, got %v", r.name, r.v)
		}
	}
	return sim.Config{
		Seed:             o.seed,
		Pods:             o.pods,
		ContainersPerPod: o.containersPerPod,
		ChurnPerStep:     o.churn,
		Latency:          sim.Latency{Base: o.latency, Jitter: o.latencyJitter, PerItem: o.latencyPerItem},
		HangPods:         o.hangPods,
		ErrorRate:        o.errorRate,
		DisableEvents:    !o.events,
		EventDropRate:    o.eventDropRate,
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
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	r := sim.New(cfg)
	if err := r.Serve(path); err != nil {
		return fmt.Errorf("serving on %s: %w", path, err)
	}
	defer r.Stop()
	fmt.Fprintf(cmd.OutOrStdout(), "simulated CRI runtime listening on %s\n", r.Endpoint())
	klog.V(2).InfoS("Simulated runtime started", "endpoint", r.Endpoint(), "pods", cfg.Pods,
		"containersPerPod", cfg.ContainersPerPod, "seed", cfg.Seed, "churn", cfg.ChurnPerStep, "stepInterval", o.stepInterval)
	r.Run(ctx, o.stepInterval)
	<-ctx.Done()
	r.Stop()
	klog.V(2).InfoS("Simulated runtime stopped", "steps", r.StepCount(), "calls", r.Calls())
	return nil
}

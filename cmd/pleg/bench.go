package main

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/podlifecycle/pleg/internal/app/bench"
)

func init() { register(newBenchCmd) }

type benchOptions struct {
	kubelet  string
	scenario string
	relists  int
	quick    bool
	output   string
	parallel int
	seed     uint64
	cpuProf  string
	heapProf string
	budget   budgetFlags
	// compareStreaming: --compare-list-streaming
	compareStreaming bool
	plegBinary       string
	plainMetadata    bool
}

func newBenchCmd() *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure relists against the simulated runtime, beside the kubelet's own relist",
		Long: `bench measures the generator against the simulated CRI runtime (the same
runtime as 'pleg simulate', spoken to over real CRI gRPC on a unix socket) and
reports, per scenario: relist duration p50/p99, runtime calls per relist,
CPU time and allocations per relist.

Scenarios (--scenario, default all):
  66x7          66 pods x 7 containers, 10 pods changed per relist, 1 ms per call
  500x10        500 pods x 10 containers, 50 pods changed per relist, 1 ms per call
  1000x10-idle  1,000 pods x 10 containers, nothing changed, no latency
  110x5-idle    110 pods x 5 containers, nothing changed, no latency
  110x5-hung    110 pods x 5 containers, one pod whose status calls hang
                (request timeout 2s, pod inspection timeout 250ms,
                relist threshold 1s, 100ms between relists)

Live scenarios run a started generator (real clock, relist goroutine,
runtime events on) for a fixed wall time (12s; --quick 4s) and report the
global relists in that window (count, interval p50/p99 start to start,
duration p99), whether Healthy() was ever false (checked every 50ms), and
the runtime calls made for the hung pod:
  hung-pod-events  110 pods x 5 containers, 1 ms per call; from the window's
                   start, one pod's status calls and its filtered list calls
                   hang and the runtime streams an event for it every 20ms
                   (relist period 20ms, pod inspection timeout 1s, request
                   timeout 2m, relist threshold 2s)
  hint-storm       500 pods x 5 containers, 1 ms per call, 3,000 runtime
                   events per second spread over every pod (relist period
                   100ms, pod inspection timeout 1s, relist threshold 1s)
Their targets: relist interval p99 at most period + pod inspection timeout
+ list p99 (hung-pod-events) or 2 x period + relist p99 (hint-storm); relist
p99 at most the pod inspection timeout + list p99; Healthy() never false.
They have no kubelet baseline: the kubelet makes no single-pod relists from
runtime events.

The hint budget's scenarios run a started generator with the runtime's
events off, the baseline, and on, each against a fresh node (the budget:
--pod-relist-rate, --pod-relist-burst, --pod-relist-spacing,
--early-relist-gap, as pleg run's):
  events-unchanged  200 pods x 5 containers, nothing changing, 1,000 runtime
                    events per second: STARTED for running containers, then
                    STOPPED for containers still running; 12s (--quick 4s)
                    targets: runtime calls and pleg's CPU per second each at
                    most 10x events off
  events-churn      200 pods x 5 containers, 50 pods changed every 100ms
                    (each change streamed as events), 20ms per call, relist
                    period 100ms; 12s (--quick 4s)
                    targets: the global relist's span (p50) at most 1.1x,
                    runtime calls at most 1.5x events off
  events-isolated   200 pods x 5 containers, 1ms per call, one pod changed
                    at a time, 500ms after the last change was delivered, 40
                    times (--quick 8; a fifth with events off)
                    target: delivery p99 at most 50ms with events on

The adaptive global relist (--max-relist-period), events on in every run:
  events-churn-adaptive     events-churn's node and churn, relist period
                            100ms fixed and adaptive up to 1s; 12s (--quick
                            4s); target: runtime calls per second not higher
                            with the adaptive relist (at most 1.05x)
  events-isolated-adaptive  events-isolated's changes, relist period 1s fixed
                            and adaptive up to 10s (--quick 2s), the window
                            starting once the period has grown to it; target:
                            delivery p99 at most 50ms with the adaptive relist
  1000x10-idle-adaptive     (run only when named) nothing changing, each
  110x5-idle-adaptive       relister started on its own clock for 60s (--quick
                            3s): with --kubelet the kubelet's PLEG (a relist
                            every 1s after the end of the last), pleg with a 1s
                            period, pleg adaptive up to 10s (--quick 2s), both
                            with the daemon's readiness check (a CRI Status
                            every 5s); the window begins and ends right after a
                            global relist ends. Reported: runtime calls and the
                            runtime's CPU per second (as the simulated runtime
                            counted them), each relister's CPU per second, and
                            their ratios to the kubelet's. Targets, adaptive
                            against the kubelet: runtime calls at most 0.1, CPU
                            at most 0.03. About 4 minutes each with --kubelet.

What lifecycle API watchers cost pleg (live, events on, 12s; --quick 4s):
  watchers          110 pods x 5 containers, the lifecycle API served, four
                    runs: a quiet node with no watcher and with 200 idle
                    watchers (each on a connection of its own, open after its
                    snapshot), then 1 pod changed every 150ms (about 20
                    events a second) with no watcher and with 200 watchers
                    reading every message
                    targets: peak RSS per idle watcher at most 16 KiB, per
                    reading watcher at most 32 KiB (beside no watcher)

With --kubelet PATH, every scenario driven by hand also runs with the
kubelet v1.37.2's own relist: PATH is the kubelet-relist program of the
repository's test/kubelet module (build it with 'test/kubelet/build.sh DIR';
it runs the kubelet's GenericPLEG over its kuberuntime manager and CRI
client), against an identical simulated node with the same changes, and
every figure is printed beside that baseline with the ratio pleg / kubelet,
and the targets are checked against it.

With --compare-list-streaming, pleg runs twice in every scenario driven by
hand, listing through the streaming RPCs (StreamPodSandboxes,
StreamContainers) and through the unary calls, against identical simulated
nodes, and the report puts the two side by side with their ratio.

The simulated node's sandboxes and containers carry the labels and
annotations a kubelet puts on them (the pod's app, pod-template-hash and
app.kubernetes.io labels; kubernetes.io/config.seen and .source and a few
annotations shared by the replicas of a workload; each container's
io.kubernetes.container.hash, restartCount, terminationMessage* and ports
annotations): most of what pleg keeps per pod. --plain-metadata leaves only
the io.kubernetes.* labels pleg reads and three annotations, as the bench
did before 2026-11-28. --pleg-binary PATH runs pleg's generator from
another pleg binary (an older build: 'git worktree add DIR COMMIT', 'go
build -o OLD ./cmd/pleg' there) against the same simulated node, to
compare two builds in one run. Build pleg itself as deploy/Dockerfile does
('go build -tags=grpcnotrace'): without the tag gRPC's request tracing
adds about 2.3 MiB of resident pages to every peak RSS.

The simulated runtime and each generator run in processes of their own
(this binary, re-executed as 'pleg bench child runtime|pleg'; pleg's with
the daemon's GC target), so that the CPU time, allocations and peak RSS
reported are each one's own.
Relists are driven one after another by hand; between two relists exactly
the scenario's number of pods change.

A full run (all) takes about six minutes with --kubelet; --quick about two
minutes on a busy machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd, o) },
	}
	cmd.AddCommand(&cobra.Command{
		Use:    "child runtime|pleg",
		Short:  "Serve one child of a bench run on stdin and stdout (pleg bench starts it)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "runtime" && args[0] != "pleg" {
				return usageErrorf("pleg bench child %q: want runtime or pleg", args[0])
			}
			return bench.ServeChild(args[0], cmd.InOrStdin(), cmd.OutOrStdout())
		},
	})
	f := cmd.Flags()
	f.StringVar(&o.kubelet, "kubelet", "", "path of the kubelet-relist program (test/kubelet/build.sh builds it): also run every scenario with the kubelet's own relist as the baseline")
	f.StringVar(&o.scenario, "scenario", "all", "scenarios to run: all (every one but the idle-adaptive ones, which run when named), or names separated by commas ("+strings.Join(bench.Names(), ", ")+")")
	intVar(f, &o.relists, "relists", 0, 1, 100000, "measured relists per run (0: each scenario's default; kubelet runs with a hung pod use at most 5; live scenarios run for a wall time instead)",
		special[int]{0, "each scenario's default"})
	f.BoolVar(&o.quick, "quick", false, "few relists per run: a smoke test, not a measurement")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	intVar(f, &o.parallel, "max-parallel-inspections", 0, 1, maxParallelInspections, "pleg's inspection bound (0: the library default)",
		special[int]{0, "the library default"})
	uint64Var(f, &o.seed, "seed", 1, "seed of the simulated node")
	o.budget.addFlags(f)
	f.BoolVar(&o.compareStreaming, "compare-list-streaming", false, "run pleg twice per scenario driven by hand, listing through the streaming RPCs and with the unary calls, and compare them (CPU, allocations, peak RSS, the list RPCs the runtime served)")
	f.StringVar(&o.plegBinary, "pleg-binary", "", "run pleg's generator from this pleg binary (e.g. an older build) instead of this one; the simulated runtime stays this binary's")
	f.BoolVar(&o.plainMetadata, "plain-metadata", false, "give the simulated node's sandboxes and containers only the labels pleg reads and three annotations, not a kubelet's usual labels and annotations (the bench before 2026-11-28)")
	f.StringVar(&o.heapProf, "memprofile", "", "write a heap profile of pleg's generator process, as its scenario ends, to this file (each run writes it anew: the last run's stays; a live run also writes FILE.window at its window's end; read it with go tool pprof -sample_index=inuse_space)")
	f.StringVar(&o.cpuProf, "cpuprofile", "", "write a CPU profile of pleg's generator process, its whole life, to this file (each run writes it anew: the last run's stays)")
	return cmd
}

func runBench(cmd *cobra.Command, o *benchOptions) error {
	if o.output != "text" && o.output != "json" {
		return usageErrorf("--output %q: want text or json", o.output)
	}
	scenarios, err := bench.Lookup(o.scenario)
	if err != nil {
		return usageError{err}
	}
	var budget bench.Budget
	budget.PodRelistRate, budget.PodRelistBurst, budget.PodRelistSpacing, budget.EarlyRelistGap = o.budget.options()
	for _, prof := range []*string{&o.cpuProf, &o.heapProf, &o.plegBinary} {
		if *prof != "" {
			if *prof, err = filepath.Abs(*prof); err != nil {
				return err
			}
		}
	}
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	rep, err := bench.Run(ctx, bench.Options{
		Scenarios:              scenarios,
		Kubelet:                o.kubelet,
		Quick:                  o.quick,
		Relists:                o.relists,
		MaxParallelInspections: o.parallel,
		CPUProfile:             o.cpuProf,
		HeapProfile:            o.heapProf,
		Budget:                 budget,
		GCPercent:              daemonGCPercent,
		Seed:                   o.seed,
		Progress:               cmd.ErrOrStderr(),
		CompareListStreaming:   o.compareStreaming,
		PLEGExecutable:         o.plegBinary,
		PlainMetadata:          o.plainMetadata,
	})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	out := cmd.OutOrStdout()
	if o.output == "json" {
		return rep.WriteJSON(out)
	}
	return rep.WriteText(out)
}

package main

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/internal/app/diagnose"
)

func init() { register(newDiagnoseCmd) }

type diagnoseOptions struct {
	probeTimeout time.Duration
	pods         int
	probeShims   bool
}

func newDiagnoseCmd() *cobra.Command {
	rf := &runtimeFlags{}
	of := &outputFlag{}
	o := &diagnoseOptions{}
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Tell how long the kubelet's PLEG would take to relist this node, and which pod and call make it slow",
		Long: `diagnose makes, once, every runtime call a kubelet relist makes and reports how
long each took: the list calls (ListPodSandbox, ListContainers) and, for every
pod, the calls of its inspection (PodSandboxStatus per sandbox, then
ContainerStatus per container, up to the first that fails),
with the slowest call of each pod and the pods whose calls fail or hang.

It then estimates the relist time of the kubelet's PLEG (v1.37), which makes
these calls one after another: the list calls plus every pod's inspection; a
pod whose inspection fails is inspected again, once, in every relist (the
model ` + "`pleg run`" + ` forecasts with: docs/forecast.md). A call
that does not answer within --probe-timeout is reported as hanging and costs
the estimate the full --runtime-request-timeout, as it costs the kubelet. The
estimate plus --relist-period is compared with --relist-threshold, and the
last line is a plain verdict, for example:

  relist would take ~35ms (threshold 3m0s): healthy
  relist would take ~4m0s (threshold 3m0s) because ContainerStatus for pod
  default/db-0 hangs (the kubelet waits the 2m0s runtime request timeout for
  it, once per relist); 1 more pod hangs: default/db-1

Pods are probed in parallel (--max-parallel-inspections at once), so the
report takes seconds even when calls hang.

  --output text   a report for people; the verdict is the last line
  --output json   the whole report as one JSON object (pods, calls, estimate,
                  cause, verdict)

Exit codes: 0 when the estimated relist keeps PLEG healthy, 1 when it would
not (too slow, or the listing fails, the runtime being unreachable
included), 2 for bad flags.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDiagnose(cmd, rf, of, o) },
	}
	f := cmd.Flags()
	rf.addFlags(f)
	// The generator's own knobs mean nothing here.
	for _, name := range []string{"pod-inspection-timeout", "events"} {
		_ = f.MarkHidden(name)
	}
	f.Lookup("max-parallel-inspections").Usage = "how many pods are probed at once"
	f.Lookup("runtime-request-timeout").Usage = "the kubelet's --runtime-request-timeout: what each hanging call costs its relist"
	durationVar(f, &o.probeTimeout, "probe-timeout", diagnose.DefaultProbeTimeout, 10*time.Millisecond, time.Hour,
		"a call that does not answer within this is reported as hanging")
	f.BoolVar(&o.probeShims, "probe-shims", false,
		"also ask every sandbox for its verbose status, which on containerd reaches the pod's shim, to find stuck shims (not a call the kubelet makes; made anyway when a list call hangs)")
	intVar(f, &o.pods, "pods", 10, 1, 100000, "text output: how many pods that answered to list, the most expensive first (pods that fail or hang are always listed; -1: all)",
		special[int]{-1, "all"})
	of.addFlags(f)
	return cmd
}

func runDiagnose(cmd *cobra.Command, rf *runtimeFlags, of *outputFlag, o *diagnoseOptions) error {
	if err := rf.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(cmd)
	defer stop()

	// Each call bounded by the probe timeout, and a pod's calls one after
	// another, sandboxes first, stopping at the first failure: the
	// kubelet's order, so that the calls made are the ones it would make.
	client, err := cri.Dial(rf.endpoint, cri.WithTimeout(o.probeTimeout), cri.WithStatusConcurrency(1),
		cri.WithLogger(logr.Discard()))
	if err != nil {
		return usageErrorf("invalid --container-runtime-endpoint %q: %v", rf.endpoint, endpointReason(err))
	}
	defer client.Close()

	report, err := diagnose.Run(ctx, client, diagnose.Options{
		Endpoint:       rf.endpoint,
		RequestTimeout: rf.requestTimeout,
		ProbeTimeout:   o.probeTimeout,
		Threshold:      rf.relistThreshold,
		RelistPeriod:   rf.relistPeriod,
		MaxParallel:    rf.maxParallel,
		ProbeShims:     o.probeShims,
	})
	if err != nil {
		return err // interrupted: no verdict to give
	}
	out := cmd.OutOrStdout()
	if of.format == "json" {
		b, err := json.Marshal(report)
		if err != nil {
			return err
		}
		if _, err := out.Write(append(b, '\n')); err != nil {
			return err
		}
	} else if err := diagnose.WriteText(out, report, diagnose.TextOptions{Pods: o.pods}); err != nil {
		return err
	}
	if !report.Healthy {
		return exitCodeError{code: 1, err: errors.New("diagnose: PLEG would not be healthy (see the verdict)")}
	}
	return nil
}

package main

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/app/diagnose"
)

// The forecast names the pod when the runtime does not answer its listing
// because of one pod: on containerd 2.x a call waiting on a pod's stuck
// shim holds a container's status lock, and the node-wide ListContainers,
// which reads every container's status, waits for it (docs/forecast.md).
// The relist's calls never reach the shim; `pleg diagnose`'s shim probe (a
// verbose PodSandboxStatus of every sandbox) does. So while the forecast
// says the runtime does not answer, pleg run diagnoses it once per such
// episode and blames the first stuck shim's pod.

const (
	// stuckProbeEvery is how often the forecast is looked at.
	stuckProbeEvery = 5 * time.Second
	// stuckProbeTimeout bounds each call of the diagnosis; the whole
	// diagnosis takes a few of them (diagnose's shim probe budget).
	stuckProbeTimeout = 2 * time.Second
	// stuckProbeBudget bounds the whole diagnosis.
	stuckProbeBudget = 8 * stuckProbeTimeout
)

// probeStuckRuntime runs until ctx ends.
func (d *daemon) probeStuckRuntime(ctx context.Context, endpoint string) {
	t := time.NewTicker(stuckProbeEvery)
	defer t.Stop()
	var probed time.Time // the episode diagnosed last
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v := d.gen.Forecast()
		// Only a listing that does not answer (not one that fails with an
		// error), once per episode.
		if !v.RuntimeDown || v.ListError != "" || v.Since.Equal(probed) {
			continue
		}
		probed = v.Since
		if s := d.findStuckShim(ctx, endpoint); s != nil {
			d.log.Info("The runtime does not answer its listing; a pod's shim does not answer", "pod", s.Pod, "podUID", s.PodUID, "sandboxID", s.ID)
			d.gen.BlameForecast(v.Since, *s)
		}
	}
}

// findStuckShim diagnoses the runtime at endpoint with short bounds and
// returns the pod of the first stuck shim it finds, if any.
func (d *daemon) findStuckShim(ctx context.Context, endpoint string) *forecast.Suspect {
	client, err := cri.Dial(endpoint, cri.WithTimeout(stuckProbeTimeout), cri.WithStatusConcurrency(1), cri.WithLogger(logr.Discard()))
	if err != nil {
		return nil
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, stuckProbeBudget)
	defer cancel()
	r, _ := diagnose.Run(ctx, client, diagnose.Options{Endpoint: endpoint, ProbeTimeout: stuckProbeTimeout})
	if r == nil || len(r.StuckShims) == 0 {
		return nil
	}
	s := r.StuckShims[0]
	return &forecast.Suspect{Pod: s.Pod, PodUID: s.PodUID, Call: "a verbose PodSandboxStatus", ID: s.SandboxID}
}

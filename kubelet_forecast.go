package pleg

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/metrics"
)

// The forecast of the kubelet's PLEG (docs/forecast.md): the loop tells
// the tracker what each step observed; readers ask it for the verdict.

// newForecast returns the tracker for opts: the kubelet's request timeout,
// and its PLEG's threshold and period, which the kubelet does not let one
// change (3m, 1s; pleg's own may differ). A listing that has not answered
// within the pod inspection timeout (the bound pleg puts on a pod's calls)
// counts as the runtime not answering.
func newForecast(opts Options) *forecast.Tracker {
	detect := opts.PodInspectionTimeout
	if detect < 0 {
		detect = DefaultPodInspectionTimeout
	}
	return forecast.NewTracker(forecast.Settings{RequestTimeout: opts.KubeletRequestTimeout}, detect)
}

// observe tells the tracker what one step of the core did at now: a global
// listing started, answered or failed; a pod's inspection succeeded,
// failed, or the pod is gone.
func (g *Generator) observe(rd Ready, now time.Time) {
	f := g.forecast
	if !rd.RelistStarted.IsZero() {
		f.ListStarted(rd.RelistStarted)
	}
	if !rd.Healthy.IsZero() {
		f.Listed(rd.Healthy, now)
	}
	for _, n := range rd.Notes {
		if n.kind == noteListFailed {
			f.ListFailed(now, n.err)
		}
	}
	for _, op := range rd.Cache {
		switch {
		case op.kind == cacheDelete, op.kind == cacheSet && op.err == nil:
			f.PodOK(string(op.uid))
		case op.kind == cacheSet:
			ref := ""
			if op.status != nil && op.status.Name != "" {
				ref = op.status.Namespace + "/" + op.status.Name
			}
			f.PodFailed(now, string(op.uid), ref, failedCall(op.err))
		}
	}
}

// runtimeCaller is an error that names the runtime call that failed, like
// *cri.CallError.
type runtimeCaller interface {
	RuntimeCall() (method, id string)
}

// failedCall tells which call of a pod's inspection failed with err, and
// whether it hung: it did not answer within the pod inspection timeout, or
// the runtime's own deadline ran out.
func failedCall(err error) forecast.Call {
	var te *InspectionTimeoutError
	if errors.As(err, &te) {
		return forecast.Call{Method: te.Call(), ID: te.ID, Took: te.Waited, Hung: true}
	}
	c := forecast.Call{Method: "GetPodStatus", Hung: errors.Is(err, context.DeadlineExceeded)}
	var rc runtimeCaller
	if errors.As(err, &rc) {
		c.Method, c.ID = rc.RuntimeCall()
	}
	return c
}

// Forecast returns the forecast of the kubelet's PLEG now.
func (g *Generator) Forecast() forecast.Verdict { return g.forecast.Verdict(g.clock.Now()) }

// forecastGauges is what the forecast gauges report now.
func (g *Generator) forecastGauges() metrics.Forecast {
	v := g.Forecast()
	m := metrics.Forecast{RelistSeconds: v.Estimate.Relist.Seconds(), AtRisk: v.AtRisk, UnhealthyAt: v.UnhealthyAt}
	if v.RuntimeDown {
		m.RelistSeconds = math.Inf(1)
	}
	return m
}

// BlameForecast names the suspect of the runtime not answering its
// listing since since (Forecast().Since), as a diagnosis found it; it
// holds until a listing answers.
func (g *Generator) BlameForecast(since time.Time, s forecast.Suspect) { g.forecast.Blame(since, s) }

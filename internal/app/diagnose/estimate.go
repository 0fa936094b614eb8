package diagnose

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

// estimate fills in the estimate, the health, the cause and the verdict,
// from the kubelet's relist model (package forecast) fed with the calls
// made: the listing's, and every probed pod's up to its first failure.
func (d *diagnoser) estimate(r *Report) {
	settings := forecast.Settings{RequestTimeout: d.opts.RequestTimeout, Threshold: d.opts.Threshold, Period: d.opts.RelistPeriod}
	relist := forecast.Relist{List: modelCalls(r.List.Calls)}
	if r.List.Error != "" && len(relist.List) > 0 && lastFailed(r.List.Calls) == nil {
		// The listing failed outside a traced call.
		relist.List = append(relist.List, forecast.Call{Method: "ListPods", Failed: true})
	}
	for _, p := range r.Pods {
		if p.Result == ResultSkipped {
			continue
		}
		relist.Pods = append(relist.Pods, forecast.Pod{Ref: p.Ref(), UID: p.UID, Calls: modelCalls(p.Calls)})
	}
	est := settings.Estimate(relist)
	e := &r.Estimate
	e.ThresholdSeconds = d.opts.Threshold.Seconds()
	e.ListSeconds, e.InspectionSeconds = est.List.Seconds(), est.Inspection.Seconds()
	e.RelistSeconds = est.Relist.Seconds()
	e.Relist = Round(est.Relist).String()
	e.HungCalls, e.FailingPods = est.HungCalls, est.FailingPods
	e.ListFails = est.ListFails || r.List.Error != ""
	e.ExceedsThreshold = e.ListFails || est.Exceeds
	r.Healthy = !e.ExceedsThreshold
	r.Cause, r.Verdict = d.verdict(r)
}

// modelCalls turns report calls into the model's.
func modelCalls(calls []Call) []forecast.Call {
	out := make([]forecast.Call, len(calls))
	for i, c := range calls {
		out[i] = forecast.Call{Method: c.Call, ID: c.ID, Took: seconds(c.Seconds), Hung: c.Hung, Failed: c.Hung || c.Error != ""}
	}
	return out
}

// verdict returns the cause to blame and one plain sentence: the relist's
// verdict, with the stuck shims the shim probe found, if any.
func (d *diagnoser) verdict(r *Report) (*Cause, string) {
	cause, msg := d.relistVerdict(r)
	note := shimNote(r.StuckShims)
	if note == "" {
		return cause, msg
	}
	s := r.StuckShims[0]
	switch {
	case r.Estimate.ListFails:
		// The listing hangs and names no pod: name the stuck shim's.
		if cause != nil && cause.Pod == "" {
			cause.Pod, cause.PodUID = s.Pod, s.PodUID
		}
		return cause, msg + "; " + note + ": a call waiting on a stuck shim while holding a container's lock is the usual cause"
	case cause == nil:
		// Healthy, and nothing else wrong: the kubelet's calls do not
		// reach the shim, but its pod's task calls (stop, exec, resource
		// updates) hang.
		return &Cause{Pod: s.Pod, PodUID: s.PodUID, Call: "PodSandboxStatus", ID: s.SandboxID, Hung: true, Error: s.Error},
			msg + ", but " + note
	}
	return cause, msg + "; " + note
}

// relistVerdict returns the cause to blame for the relist and one plain
// sentence.
func (d *diagnoser) relistVerdict(r *Report) (*Cause, string) {
	e := r.Estimate
	threshold := d.opts.Threshold
	if e.ListFails {
		c := lastFailed(r.List.Calls)
		if c == nil {
			c = &Call{Call: "ListPods", Error: r.List.Error}
		}
		cause := &Cause{Call: c.Call, Hung: c.Hung, Error: c.Error, KubeletSeconds: c.KubeletSeconds}
		what := fmt.Sprintf("%s: %s", c.Call, c.Error)
		if c.Hung {
			what = fmt.Sprintf("%s hangs (no answer within %v; the kubelet gives up after the %v runtime request timeout)",
				c.Call, d.opts.ProbeTimeout, d.opts.RequestTimeout)
		}
		return cause, fmt.Sprintf("relist fails: %s, so PLEG turns unhealthy %v after its last successful relist",
			what, threshold)
	}

	head := fmt.Sprintf("relist would take ~%s (threshold %v)", e.Relist, threshold)
	var hungPods, errPods []PodReport
	for _, p := range r.Pods {
		switch p.Result {
		case ResultHung:
			hungPods = append(hungPods, p)
		case ResultError:
			errPods = append(errPods, p)
		}
	}
	link := " because "
	if r.Healthy {
		link = ": healthy, but "
	}
	switch {
	case len(hungPods) > 0:
		p := hungPods[0] // the most expensive first
		c := p.FailedCall
		msg := fmt.Sprintf("%s for pod %s hangs (the kubelet waits the %v runtime request timeout for it, once per relist)",
			c.Call, p.Ref(), d.opts.RequestTimeout)
		if n := len(hungPods) - 1; n > 0 {
			msg += fmt.Sprintf("; %d more %s: %s", n, textfmt.Plural(n, "pod hangs", "pods hang"), podList(hungPods[1:]))
		}
		if len(errPods) > 0 {
			msg += fmt.Sprintf("; %d %s: %s", len(errPods), textfmt.Plural(len(errPods), "pod fails", "pods fail"), podList(errPods))
		}
		return podCause(p), head + link + msg
	case len(errPods) > 0:
		p := errPods[0]
		c := p.FailedCall
		msg := fmt.Sprintf("%s for pod %s fails: %s", c.Call, p.Ref(), c.Error)
		if n := len(errPods) - 1; n > 0 {
			msg += fmt.Sprintf("; %d more %s: %s", n, textfmt.Plural(n, "pod fails", "pods fail"), podList(errPods[1:]))
		}
		return podCause(p), head + link + msg
	case r.Healthy:
		return nil, head + ": healthy"
	}

	// Too slow, and nothing fails: blame the biggest part.
	inspected := 0
	for _, p := range r.Pods {
		if p.Result != ResultSkipped {
			inspected++
		}
	}
	if e.ListSeconds >= e.InspectionSeconds {
		c := slowest(r.List.Calls)
		return &Cause{Call: c.Call, KubeletSeconds: c.KubeletSeconds},
			fmt.Sprintf("%s because %s takes ~%v", head, c.Call, Round(seconds(c.KubeletSeconds)))
	}
	msg := fmt.Sprintf("%s because inspecting %d %s one after another takes ~%v", head, inspected,
		textfmt.Plural(inspected, "pod", "pods"), Round(seconds(e.InspectionSeconds)))
	var cause *Cause
	if len(r.Pods) > 0 && r.Pods[0].SlowestCall != nil {
		p := r.Pods[0]
		cause = podCause(p)
		msg += fmt.Sprintf(" (slowest: pod %s, %v; its slowest call: %s %v)", p.Ref(),
			Round(seconds(p.KubeletSeconds)), p.SlowestCall.Call, Round(seconds(p.SlowestCall.KubeletSeconds)))
	}
	return cause, msg
}

// podCause blames the failed (or else the slowest) call of p.
func podCause(p PodReport) *Cause {
	c := p.FailedCall
	if c == nil {
		c = p.SlowestCall
	}
	if c == nil {
		return &Cause{Pod: p.Ref(), PodUID: p.UID}
	}
	return &Cause{Pod: p.Ref(), PodUID: p.UID, Call: c.Call, ID: c.ID, Hung: c.Hung, Error: c.Error,
		KubeletSeconds: c.KubeletSeconds}
}

// podList names up to three pods.
func podList(pods []PodReport) string {
	names := make([]string, 0, 3)
	for i, p := range pods {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(pods)-3))
			break
		}
		names = append(names, p.Ref())
	}
	return strings.Join(names, ", ")
}

// seconds turns seconds back into a duration, exactly for those that came
// from one (d.Seconds()).
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// Round rounds d for people (forecast.Round): "35ms", "2.35s", "40.1s",
// "4m0s".
func Round(d time.Duration) time.Duration { return forecast.Round(d) }

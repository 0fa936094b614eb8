package forecast

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Message returns the verdict as one sentence for people, e.g.
//
//	the kubelet's PLEG will report not healthy in ~2m40s: ContainerStatus for pod default/db-0 hangs (2m0s request timeout, once per relist), and 1 more pod hangs: default/db-1; relist ~4m0s, threshold 3m0s
//	the kubelet's PLEG will report not healthy in ~2m50s: the container runtime does not answer its listing (ListPodSandbox, ListContainers) for 10s
//	the kubelet's PLEG is not at risk: its relist would take ~35ms (threshold 3m0s)
func (v Verdict) Message() string {
	s := v.Settings
	if !v.AtRisk {
		msg := fmt.Sprintf("the kubelet's PLEG is not at risk: its relist would take ~%v (threshold %v)", Round(v.Estimate.Relist), s.Threshold)
		if len(v.FailingPods) > 0 {
			msg += "; " + v.podsClause()
		}
		return msg
	}
	head := "the kubelet's PLEG will report not healthy " + v.when()
	if v.RuntimeDown {
		what := fmt.Sprintf("the container runtime does not answer its listing (ListPodSandbox, ListContainers) for %v", Round(v.Now.Sub(v.Since)))
		if v.ListError != "" {
			what = fmt.Sprintf("the container runtime's listing fails for %v: %s", Round(v.Now.Sub(v.Since)), v.ListError)
		}
		if v.UnhealthyAt.IsZero() {
			what += ", and no listing has succeeded yet"
		}
		if s := v.Suspect; s != nil {
			what += fmt.Sprintf("; the shim of pod %s does not answer (%s hangs): a call waiting on it holds a container's lock", s.Pod, s.Call)
		}
		return head + ": " + what
	}
	return fmt.Sprintf("%s: %s; relist ~%v, threshold %v", head, v.podsClause(), Round(v.Estimate.Relist), s.Threshold)
}

// when says when the kubelet reports not healthy: "in ~2m40s", or "now
// (since ~12s)".
func (v Verdict) when() string {
	if v.UnhealthyAt.IsZero() {
		return "now"
	}
	if d := v.UnhealthyAt.Sub(v.Now); d > 0 {
		return "in ~" + Round(d).String()
	}
	return fmt.Sprintf("now (since ~%v)", Round(v.Now.Sub(v.UnhealthyAt)))
}

// podsClause names the costliest failing pod and its call, then the others.
func (v Verdict) podsClause() string {
	c := v.Estimate.Cause
	if c == nil || c.Pod == "" && c.PodUID == "" {
		return ""
	}
	pod := c.Pod
	if pod == "" {
		pod = c.PodUID
	}
	var b strings.Builder
	call := c.Call.Method
	if call == "" {
		call = "GetPodStatus"
	}
	if c.Call.Hung {
		fmt.Fprintf(&b, "%s for pod %s hangs (%v request timeout, once per relist)", call, pod, v.Settings.RequestTimeout)
	} else {
		fmt.Fprintf(&b, "%s for pod %s fails", call, pod)
	}
	others := func(pods []string, one, many string) {
		var rest []string
		for _, p := range pods {
			if p != pod {
				rest = append(rest, p)
			}
		}
		if len(rest) == 0 {
			return
		}
		n, verb := len(rest), one
		if n > 1 {
			verb = many
		}
		if n > 3 {
			rest = append(rest[:3], fmt.Sprintf("and %d more", n-3))
		}
		fmt.Fprintf(&b, ", and %d more %s: %s", n, verb, strings.Join(rest, ", "))
	}
	others(v.HungPods, "pod hangs", "pods hang")
	var failingOnly []string
	for _, p := range v.FailingPods {
		if !slices.Contains(v.HungPods, p) {
			failingOnly = append(failingOnly, p)
		}
	}
	others(failingOnly, "pod fails", "pods fail")
	return b.String()
}

// Round rounds d for people: to the microsecond below a millisecond, to
// the millisecond below a second, to 10ms below 10s, to 100ms below a
// minute, else to the second ("35ms", "2.35s", "40.1s", "4m0s").
func Round(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond)
	case d < time.Second:
		return d.Round(time.Millisecond)
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond)
	case d < time.Minute:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

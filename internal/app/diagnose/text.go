package diagnose

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/podlifecycle/pleg/internal/textfmt"
)

// TextOptions configure WriteText.
type TextOptions struct {
	// Pods is how many pods that answered are listed (the most expensive
	// first); pods that fail or hang are always listed. Default 10;
	// negative lists every pod.
	Pods int
}

// WriteText writes the report for people: the runtime, the listing, a table
// of the most expensive pods, the problems found, the estimate and the
// verdict on the last line.
func WriteText(w io.Writer, r *Report, o TextOptions) error {
	if o.Pods == 0 {
		o.Pods = 10
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)

	rt := "?"
	if r.Runtime != nil {
		rt = strings.TrimSpace(r.Runtime.Name + " " + r.Runtime.Version)
		if rt == "" {
			rt = "?"
		}
	}
	if r.Endpoint != "" {
		rt += " at " + r.Endpoint
	}
	if r.Runtime != nil {
		var conds []string
		for _, c := range r.Runtime.Conditions {
			if c.Status {
				conds = append(conds, c.Type)
			} else {
				conds = append(conds, fmt.Sprintf("%s=false (%s: %s)", c.Type, c.Reason, c.Message))
			}
		}
		if len(conds) > 0 {
			rt += "; " + strings.Join(conds, ", ")
		}
		if r.Runtime.Error != "" {
			rt += "; " + r.Runtime.Error
		}
	}
	fmt.Fprintf(tw, "Runtime:\t%s\n", rt)
	cn := r.Counts
	fmt.Fprintf(tw, "Node:\t%d %s: %d %s%s, %d %s%s\n", cn.Pods, textfmt.Plural(cn.Pods, "pod", "pods"),
		cn.Sandboxes, textfmt.Plural(cn.Sandboxes, "sandbox", "sandboxes"), states(cn.SandboxStates),
		cn.Containers, textfmt.Plural(cn.Containers, "container", "containers"), states(cn.ContainerStates))
	var lc []string
	for _, c := range r.List.Calls {
		s := fmt.Sprintf("%s %v", c.Call, Round(seconds(c.Seconds)))
		if c.Hung {
			s = fmt.Sprintf("%s hung (no answer within %v)", c.Call, seconds(r.Settings.ProbeTimeoutSeconds))
		} else if c.Error != "" {
			s += " failed"
		}
		lc = append(lc, s)
	}
	fmt.Fprintf(tw, "Listing:\t%s\n", strings.Join(lc, ", "))
	if r.ShimProbe != nil {
		fmt.Fprintf(tw, "Shims:\t%s\n", shimLine(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	var shown, rest []PodReport
	for _, p := range r.Pods {
		if p.Result == ResultHung || p.Result == ResultError || o.Pods < 0 || len(shown) < o.Pods {
			shown = append(shown, p)
		} else {
			rest = append(rest, p)
		}
	}
	if len(shown) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "POD\tCONTAINERS\tPROBE\tKUBELET\tSLOWEST CALL\tRESULT")
		for _, p := range shown {
			slow := "-"
			if c := p.SlowestCall; c != nil {
				slow = fmt.Sprintf("%s %v", c.Call, Round(seconds(c.KubeletSeconds)))
			}
			fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%s\t%s\n", p.Ref(), p.Containers,
				Round(seconds(p.InspectionSeconds)),
				Round(seconds(p.KubeletSeconds)), slow, p.Result)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(rest) > 0 {
			fmt.Fprintf(&b, "(%d more %s answered, each costing at most %v; --output json lists every pod)\n",
				len(rest), textfmt.Plural(len(rest), "pod", "pods"), Round(seconds(rest[0].KubeletSeconds)))
		}
	}

	var problems []string
	for _, p := range r.Pods {
		c := p.FailedCall
		if c == nil {
			continue
		}
		call := c.Call
		if c.ID != "" {
			call += fmt.Sprintf(" %q", c.ID)
		}
		switch {
		case c.Hung:
			line := fmt.Sprintf("  pod %s: %s hung (no answer within %v)", p.Ref(), call, seconds(r.Settings.ProbeTimeoutSeconds))
			switch c.Call {
			case "PodSandboxStatus":
				line += fmt.Sprintf("; try: crictl inspectp %s", c.ID)
			case "ContainerStatus":
				line += fmt.Sprintf("; try: crictl inspect %s", c.ID)
			}
			problems = append(problems, line)
		case strings.HasPrefix(c.Error, c.Call):
			problems = append(problems, fmt.Sprintf("  pod %s: %s", p.Ref(), c.Error))
		default:
			problems = append(problems, fmt.Sprintf("  pod %s: %s failed: %s", p.Ref(), call, c.Error))
		}
	}
	for _, s := range r.StuckShims {
		problems = append(problems, fmt.Sprintf("  pod %s: its shim does not answer: verbose PodSandboxStatus hung (no answer within %v); try: crictl inspectp %s",
			s.Pod, seconds(r.Settings.ProbeTimeoutSeconds), s.SandboxID))
	}
	if len(problems) > 0 {
		b.WriteString("\nProblems:\n")
		b.WriteString(strings.Join(problems, "\n"))
		b.WriteString("\n")
	}

	e := r.Estimate
	b.WriteString("\nKubelet relist estimate (one call after another, as the kubelet makes them; hung calls at the runtime request timeout):\n")
	tw = tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  list calls\t%v\n", Round(seconds(e.ListSeconds)))
	if !e.ListFails {
		n := 0
		for _, p := range r.Pods {
			if p.Result != ResultSkipped {
				n++
			}
		}
		fmt.Fprintf(tw, "  inspection of %d %s\t%v\n", n, textfmt.Plural(n, "pod", "pods"), Round(seconds(e.InspectionSeconds)))
		if e.FailingPods > 0 {
			fmt.Fprintf(tw, "  of which %d failing %s\t(inspected again in every relist)\n", e.FailingPods, textfmt.Plural(e.FailingPods, "pod", "pods"))
		}
	}
	fmt.Fprintf(tw, "  relist\t~%s\t(+ %v relist period; threshold %v)\n", e.Relist,
		seconds(r.Settings.RelistPeriodSeconds), seconds(r.Settings.ThresholdSeconds))
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n" + r.Verdict + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// shimLine tells what the shim probe found.
func shimLine(r *Report) string {
	sp := r.ShimProbe
	why := "as asked"
	if sp.Reason == ShimProbeListHung {
		why = "because the listing hung"
		if c := lastFailed(r.List.Calls); c != nil {
			why = "because " + c.Call + " hung"
		}
	}
	head := fmt.Sprintf("verbose PodSandboxStatus (crictl inspectp; not a kubelet call) of every sandbox, %s", why)
	if sp.Sandboxes == 0 && sp.Error != "" {
		return fmt.Sprintf("%s: not made: %s", head, sp.Error)
	}
	parts := []string{fmt.Sprintf("%d %s do not answer", sp.Stuck, textfmt.Plural(sp.Stuck, "shim", "shims")),
		fmt.Sprintf("%d answered", sp.Answered)}
	if sp.Stuck == 1 {
		parts[0] = "1 shim does not answer"
	}
	if sp.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed (%s)", sp.Failed, sp.Error))
	}
	if sp.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d not probed in time", sp.Skipped))
	}
	return fmt.Sprintf("%s: %d %s: %s", head, sp.Sandboxes, textfmt.Plural(sp.Sandboxes, "sandbox", "sandboxes"), strings.Join(parts, ", "))
}

// states formats counts by state: " (3 running, 1 exited)".
func states(m map[string]int) string {
	var parts []string
	for _, s := range []string{"running", "exited", "created", "unknown"} {
		if n := m[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

package pleg

import (
	"github.com/podlifecycle/pleg/cruntime"
)

// A delta inspection fetches only what changed (docs/semantics.md, "Delta
// inspection"). A changed pod's listing says which of its sandboxes and
// containers changed: an item whose ID and state are the same as in the
// pod's last status is, for every field pleg keeps, what that status says,
// so its status is reused and only the other items cost a runtime call.
// The kubelet fetches all of them; Options.FullInspection does too.

// delta is the plan of a delta inspection of one listed pod: for each
// sandbox and container of the listing, in its order, the reused status
// (nil: fetch it), and the items to fetch.
type delta struct {
	sandboxes  []*cruntime.SandboxStatus
	containers []*cruntime.ContainerStatus
	fetchSbs   []*cruntime.Container
	fetchCts   []*cruntime.Container
}

// planDelta plans the inspection of pod given its last status prev.
func planDelta(pod *cruntime.Pod, prev *cruntime.PodStatus) delta {
	d := delta{
		sandboxes:  make([]*cruntime.SandboxStatus, len(pod.Sandboxes)),
		containers: make([]*cruntime.ContainerStatus, len(pod.Containers)),
	}
	for i, sb := range pod.Sandboxes {
		if s := reusable(sb, prev.SandboxStatuses, sandboxKey); s != nil {
			d.sandboxes[i] = s
		} else {
			d.fetchSbs = append(d.fetchSbs, sb)
		}
	}
	for i, ct := range pod.Containers {
		if s := reusable(ct, prev.ContainerStatuses, containerKey); s != nil {
			d.containers[i] = s
		} else {
			d.fetchCts = append(d.fetchCts, ct)
		}
	}
	return d
}

// reusable returns the status in prev of the listed item c, if it can be
// reused: the same ID in the same known state.
func reusable[S any](c *cruntime.Container, prev []*S, key func(*S) (string, cruntime.State)) *S {
	if c.State == cruntime.StateUnknown {
		return nil
	}
	for _, s := range prev {
		if id, st := key(s); id == c.ID && st == c.State {
			return s
		}
	}
	return nil
}

func sandboxKey(s *cruntime.SandboxStatus) (string, cruntime.State)     { return s.ID, s.State }
func containerKey(s *cruntime.ContainerStatus) (string, cruntime.State) { return s.ID, s.State }

// fill puts the fetched statuses into the free (nil) slots of plan, in
// order. A fetched item the runtime no longer knows stays nil, and is left
// out of the status as a full inspection leaves it out.
func fill[T any](plan []*T, fetched []*T) []*T {
	j := 0
	for i := range plan {
		if plan[i] == nil {
			plan[i] = fetched[j]
			j++
		}
	}
	return plan
}

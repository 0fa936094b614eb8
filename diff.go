package pleg

import (
	"slices"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// state is what the generator distinguishes about a container or sandbox.
type state uint8

const (
	stateNonExistent state = iota
	stateRunning
	stateExited
	stateUnknown
)

func (s state) String() string {
	switch s {
	case stateRunning:
		return "running"
	case stateExited:
		return "exited"
	case stateUnknown:
		return "unknown"
	default:
		return "non-existent"
	}
}

// stateOf maps a runtime state to a generator state. Created containers
// count as unknown, exactly as the kubelet does.
func stateOf(s cruntime.State) state {
	switch s {
	case cruntime.StateRunning:
		return stateRunning
	case cruntime.StateExited:
		return stateExited
	default:
		return stateUnknown
	}
}

// transition appends to dst the events for one container ID moving from
// old to new, in the order they happen.
func transition(dst []EventType, old, new state) []EventType {
	if old == new {
		return dst
	}
	switch new {
	case stateRunning:
		return append(dst, ContainerStarted)
	case stateExited:
		return append(dst, ContainerDied)
	case stateUnknown:
		return append(dst, ContainerChanged)
	}
	// new == stateNonExistent
	if old == stateExited {
		return append(dst, ContainerRemoved)
	}
	return append(dst, ContainerDied, ContainerRemoved)
}

// find returns the state and entry of container or sandbox id in pod.
func find(pod *cruntime.Pod, id string) (state, *cruntime.Container, bool) {
	if pod == nil {
		return stateNonExistent, nil, false
	}
	for _, c := range pod.Containers {
		if c.ID == id {
			return stateOf(c.State), c, false
		}
	}
	for _, s := range pod.Sandboxes {
		if s.ID == id {
			return stateOf(s.State), s, true
		}
	}
	return stateNonExistent, nil, false
}

// Diff returns the lifecycle events between two listings of one pod, old
// and new (either may be nil: the pod did not exist). It is pure.
//
// Containers are walked in the order old containers, old sandboxes, new
// containers, new sandboxes, and each ID is handled at its first
// occurrence; the events of one ID keep their causal order (Died before
// Removed). ContainerChanged events are included: callers that deliver
// events drop them, but they still say the pod changed.
func Diff(uid types.UID, old, new *cruntime.Pod) []Event {
	if sameStates(old, new) {
		return nil // the steady state: nothing to allocate
	}
	var events []Event
	seen := make([]string, 0, podSize(old)+podSize(new))
	var types []EventType
	visit := func(c *cruntime.Container) {
		if c.ID == "" || slices.Contains(seen, c.ID) {
			return
		}
		seen = append(seen, c.ID)
		oldState, oldC, oldSandbox := find(old, c.ID)
		newState, newC, newSandbox := find(new, c.ID)
		types = transition(types[:0], oldState, newState)
		if len(types) == 0 {
			return
		}
		info, sandbox := newC, newSandbox
		if info == nil {
			info, sandbox = oldC, oldSandbox
		}
		for _, t := range types {
			events = append(events, Event{
				PodUID:        uid,
				Type:          t,
				ContainerID:   c.ID,
				ContainerName: info.Name,
				Sandbox:       sandbox,
			})
		}
	}
	for _, p := range [2]*cruntime.Pod{old, new} {
		if p == nil {
			continue
		}
		for _, c := range p.Containers {
			visit(c)
		}
		for _, s := range p.Sandboxes {
			visit(s)
		}
	}
	return events
}

// changed reports whether a pod's listing moving from old to new makes
// events (ContainerChanged included): whether Diff would return any, which
// is whether some ID's state differs between the two (transition makes
// events exactly then). It allocates nothing and stops at the first such
// ID; it runs for every pod of a listing that changed.
func changed(old, new *cruntime.Pod) bool {
	if sameStates(old, new) {
		return false
	}
	for _, p := range [2]*cruntime.Pod{old, new} {
		if p == nil {
			continue
		}
		for _, items := range [2][]*cruntime.Container{p.Containers, p.Sandboxes} {
			for _, c := range items {
				if c.ID == "" {
					continue
				}
				before, _, _ := find(old, c.ID)
				after, _, _ := find(new, c.ID)
				if before != after {
					return true
				}
			}
		}
	}
	return false
}

func podSize(p *cruntime.Pod) int {
	if p == nil {
		return 0
	}
	return len(p.Containers) + len(p.Sandboxes)
}

// sameStates reports whether a and b list the same IDs in the same order
// with the same generator states, in which case they differ by no event.
func sameStates(a, b *cruntime.Pod) bool {
	if a == b {
		return true // also the same listing: a runtime reuses an unchanged pod
	}
	if a == nil || b == nil {
		return false
	}
	return sameList(a.Containers, b.Containers) && sameList(a.Sandboxes, b.Sandboxes)
}

func sameList(a, b []*cruntime.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || stateOf(a[i].State) != stateOf(b[i].State) {
			return false
		}
	}
	return true
}

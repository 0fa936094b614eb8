package pleg

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// fakeRuntime is an in-memory cruntime.Runtime for the generator's tests.
// Statuses are derived from the listing unless overridden.
type fakeRuntime struct {
	mu       sync.Mutex
	pods     []*cruntime.Pod
	listErr  error
	fail     map[types.UID]error               // PodStatus fails for these pods
	statuses map[types.UID]*cruntime.PodStatus // overrides
	hang     map[types.UID]chan struct{}       // PodStatus blocks until closed or ctx done
	hangList map[types.UID]chan struct{}       // ListPod blocks until closed or ctx done
	hangAll  chan struct{}                     // ListPods blocks until closed or ctx done
	nilPods  bool                              // ListPods answers a nil pod
	ips      map[types.UID][]string
	calls    map[string]int
	statusOf []types.UID // PodStatus calls in order
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{fail: map[types.UID]error{}, statuses: map[types.UID]*cruntime.PodStatus{},
		hang: map[types.UID]chan struct{}{}, hangList: map[types.UID]chan struct{}{}, ips: map[types.UID][]string{}, calls: map[string]int{}}
}

func (f *fakeRuntime) setPods(pods ...*cruntime.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = pods
}

func (f *fakeRuntime) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fakeRuntime) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	f.mu.Lock()
	f.calls["ListPods"]++
	hang := f.hangAll
	f.mu.Unlock()
	if err := hangOn(ctx, hang, "list_podsandbox", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	if f.nilPods {
		return append(clonePods(f.pods), nil), nil
	}
	return clonePods(f.pods), nil
}

func (f *fakeRuntime) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	f.mu.Lock()
	f.calls["ListPod"]++
	hang := f.hangList[uid]
	f.mu.Unlock()
	if err := hangOn(ctx, hang, "list_containers", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	for _, p := range f.pods {
		if p.UID == uid {
			return clonePods([]*cruntime.Pod{p})[0], nil
		}
	}
	return nil, nil
}

// hangOn blocks until hang is closed (a nil hang does not block) or ctx
// ends, reporting the call to the context's tracer as op about id.
func hangOn(ctx context.Context, hang chan struct{}, op, id string) error {
	if hang == nil {
		return nil
	}
	if t := cruntime.CallTracerFrom(ctx); t != nil {
		done := t.StartCall(op, id)
		defer done(0, nil)
	}
	select {
	case <-hang:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ItemStatuses answers from the listing (or the statuses override),
// counting one "Status" call per pod.
func (f *fakeRuntime) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	f.mu.Lock()
	f.calls["Status"]++
	f.statusOf = append(f.statusOf, pod.UID)
	hang := f.hang[pod.UID]
	f.mu.Unlock()
	if err := hangOn(ctx, hang, "container_status", "hung-container"); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[pod.UID]; err != nil {
		return nil, nil, err
	}
	over := f.statuses[pod.UID]
	sbOut := make([]*cruntime.SandboxStatus, len(sbs))
	for i, sb := range sbs {
		sbOut[i] = &cruntime.SandboxStatus{ID: sb.ID, State: sb.State, IPs: f.ips[pod.UID]}
		if over != nil {
			sbOut[i] = nil
			for _, o := range over.SandboxStatuses {
				if o.ID == sb.ID {
					sbOut[i] = o
				}
			}
		}
	}
	ctOut := make([]*cruntime.ContainerStatus, len(cts))
	for i, c := range cts {
		ctOut[i] = &cruntime.ContainerStatus{ID: c.ID, Name: c.Name, State: c.State}
		if over != nil {
			ctOut[i] = nil
			for _, o := range over.ContainerStatuses {
				if o.ID == c.ID {
					ctOut[i] = o
				}
			}
		}
	}
	return sbOut, ctOut, nil
}

func clonePods(pods []*cruntime.Pod) []*cruntime.Pod {
	out := make([]*cruntime.Pod, len(pods))
	for i, p := range pods {
		q := *p
		q.Containers = cloneContainers(p.Containers)
		q.Sandboxes = cloneContainers(p.Sandboxes)
		out[i] = &q
	}
	return out
}

func cloneContainers(cs []*cruntime.Container) []*cruntime.Container {
	out := make([]*cruntime.Container, len(cs))
	for i, c := range cs {
		d := *c
		out[i] = &d
	}
	return out
}

// pod builds a listed pod; containers and sandboxes are given as
// "id=state" with an "s:" prefix for sandboxes.
func pod(uid string, items ...string) *cruntime.Pod {
	p := &cruntime.Pod{UID: types.UID(uid), Name: "name-" + uid, Namespace: "ns"}
	for _, it := range items {
		sandbox := false
		if rest, ok := strings.CutPrefix(it, "s:"); ok {
			sandbox, it = true, rest
		}
		id, st, ok := strings.Cut(it, "=")
		if !ok {
			panic("bad item " + it)
		}
		c := &cruntime.Container{ID: id, Name: "ctr-" + id, State: parseState(st)}
		if sandbox {
			p.Sandboxes = append(p.Sandboxes, c)
		} else {
			p.Containers = append(p.Containers, c)
		}
	}
	return p
}

func parseState(s string) cruntime.State {
	switch s {
	case "running":
		return cruntime.StateRunning
	case "exited":
		return cruntime.StateExited
	case "created":
		return cruntime.StateCreated
	case "unknown":
		return cruntime.StateUnknown
	}
	panic("unknown state " + s)
}

// formatEvents renders events one a line as "POD TYPE CONTAINER", grouped
// by pod (stable: the order within a pod is kept).
func formatEvents(events []Event) []string {
	sorted := append([]Event(nil), events...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].PodUID < sorted[j].PodUID })
	out := make([]string, 0, len(sorted))
	for _, e := range sorted {
		line := fmt.Sprintf("%s %s", e.PodUID, e.Type)
		if e.ContainerID != "" {
			line += " " + e.ContainerID
		}
		if e.ExitCode != nil {
			line += fmt.Sprintf(" exit=%d", *e.ExitCode)
		}
		out = append(out, line)
	}
	return out
}

// drain returns every event waiting on ch.
func drain(ch <-chan *Event) []Event {
	var out []Event
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, *e)
		default:
			return out
		}
	}
}

var (
	errStatus = errors.New("status failed")
	errList   = errors.New("list failed")
)

// Identities gives every running container a PID made of its position and
// a cgroup path of its ID, counting one "Identities" call.
func (f *fakeRuntime) Identities(_ context.Context, pod *cruntime.Pod, cts []*cruntime.Container) ([]*cruntime.Identity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Identities"]++
	out := make([]*cruntime.Identity, len(cts))
	for i, c := range cts {
		if c.State == cruntime.StateRunning {
			out[i] = &cruntime.Identity{PID: int64(1000 + f.calls["Identities"]*10 + i), CgroupPath: "/pods/" + string(pod.UID) + "/" + c.ID}
		}
	}
	return out, nil
}

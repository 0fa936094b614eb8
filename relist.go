package pleg

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// work is one pod a relist must inspect: the events its listing changed
// by (possibly none, when it was flagged for reinspection).
type work struct {
	uid    types.UID
	rec    *record
	events []Event
}

// relist does one global relist (semantics.md §3). It runs on the relist
// goroutine only. It returns the listing error, if any.
func (g *Generator) relist(ctx context.Context) error {
	t0 := g.clock.Now()
	g.relistRunningSince.Store(t0.UnixNano())
	stat := RelistStat{Start: t0}
	defer func() {
		g.relistRunningSince.Store(0)
		stat.Duration = g.clock.Since(t0)
		g.m.RelistDuration.Observe(stat.Duration.Seconds())
		g.stats.add(stat)
	}()
	if last := g.lastRelist.Load(); last != 0 {
		g.m.RelistInterval.Observe(t0.Sub(time.Unix(0, last)).Seconds())
	}
	g.log.V(5).Info("GenericPLEG: Relisting")

	pods, err := g.rt.ListPods(ctx)
	if err == nil {
		err = checkPods(pods)
	}
	if err != nil {
		if ctx.Err() == nil {
			g.log.Error(err, "GenericPLEG: Unable to retrieve pods")
		}
		stat.Err = err.Error()
		return err
	}
	g.lastRelist.Store(t0.UnixNano())
	g.generation++
	g.m.LastSeen.Set(float64(t0.Unix()))
	g.updateGauges(pods)

	for _, r := range g.records {
		r.current = nil
	}
	for _, p := range pods {
		r := g.records[p.UID]
		if r == nil {
			r = &record{}
			g.records[p.UID] = r
		}
		r.current = p
	}
	stat.Pods = len(pods)
	for _, p := range pods {
		stat.Containers += len(p.Containers) + len(p.Sandboxes)
	}

	flagged := g.takeReinspect()
	var todo []work
	for uid, r := range g.records {
		events := Diff(uid, r.old, r.current)
		if _, ok := flagged[uid]; len(events) == 0 && !ok {
			continue
		}
		todo = append(todo, work{uid: uid, rec: r, events: events})
	}
	// A stable order makes runs reproducible; it costs only the changed pods.
	slices.SortFunc(todo, func(a, b work) int { return strings.Compare(string(a.uid), string(b.uid)) })

	needReinspect := make(map[types.UID]struct{})
	stat.Inspected = len(todo)
	g.inspectAll(ctx, todo, func(w work, status *runtime.PodStatus, err error) {
		n, ok := g.apply(w, status, err, t0)
		stat.Events += n
		if !ok {
			needReinspect[w.uid] = struct{}{}
			stat.Failed++
			var te *InspectionTimeoutError
			if errors.As(err, &te) {
				stat.TimedOut++
			}
		}
	})
	g.reinspect = needReinspect
	g.cache.UpdateTime(t0)
	return nil
}

// apply records the outcome of inspecting one pod at time t: the cache
// entry, and on success the record's advance and the events' delivery. It
// returns how many events it delivered and whether the inspection
// succeeded.
func (g *Generator) apply(w work, status *runtime.PodStatus, err error, t time.Time) (int, bool) {
	r := w.rec
	if r.current == nil {
		// Gone from the listing: no runtime call, the cache entry goes.
		g.cache.Delete(w.uid)
	} else {
		if err != nil && status != nil && checkStatus(r.current, status) != nil {
			status = nil // a partial status with nil entries: keep none of it
		}
		if err == nil {
			status.IPs = g.carryIPs(w.uid, status)
		} else if status == nil {
			status = &runtime.PodStatus{UID: w.uid, Name: r.current.Name, Namespace: r.current.Namespace}
		}
		g.cache.Set(w.uid, status, err, t)
	}
	if err != nil {
		g.m.InspectionFailures.Inc()
		g.log.V(4).Info("PLEG: Ignoring events for pod", "pod", podRef(r.pod()), "podUID", w.uid, "err", err.Error())
		return 0, false
	}
	events := w.events
	if len(events) == 0 {
		events = []Event{{PodUID: w.uid, Type: PodSync}}
	}
	pod := r.pod()
	if r.current == nil {
		delete(g.records, w.uid)
	} else {
		r.old = r.current
	}
	now := g.clock.Now()
	out := events[:0]
	for _, e := range events {
		if e.Type == ContainerChanged {
			continue
		}
		e.Time = now
		if pod != nil {
			e.PodName, e.PodNamespace = pod.Name, pod.Namespace
		}
		if e.Type == ContainerDied && status != nil {
			if cs := findContainerStatus(status, e.ContainerID); cs != nil {
				code := cs.ExitCode
				e.ExitCode = &code
				g.log.V(2).Info("Generic (PLEG): container finished", "podID", w.uid, "containerID", e.ContainerID, "exitCode", code)
			}
		}
		out = append(out, e)
	}
	g.deliver.publish(w.uid, r.current, out)
	if hint, ok := g.takeHint(w.uid); ok && len(out) > 0 {
		g.m.EventDeliveryLatency.Observe(now.Sub(hint).Seconds())
	}
	return len(out), true
}

// carryIPs keeps a dead pod's last IPs: when the fresh status has none and
// no sandbox is ready, the previously cached IPs stay.
func (g *Generator) carryIPs(uid types.UID, status *runtime.PodStatus) []string {
	if len(status.IPs) != 0 {
		return status.IPs
	}
	prev, err := g.cache.Get(uid)
	if err != nil || len(prev.IPs) == 0 {
		return nil
	}
	for _, s := range status.SandboxStatuses {
		if s.State == runtime.StateRunning {
			return status.IPs
		}
	}
	return prev.IPs
}

func findContainerStatus(s *runtime.PodStatus, id string) *runtime.ContainerStatus {
	for _, c := range s.ContainerStatuses {
		if c.ID == id && c.State == runtime.StateExited {
			return c
		}
	}
	return nil
}

// updateGauges sets the running-pods and running-containers gauges from a
// listing: pods with at least one running sandbox, and containers (not
// sandboxes) per state.
func (g *Generator) updateGauges(pods []*runtime.Pod) {
	var running int
	var byState [4]int
	for _, p := range pods {
		for _, s := range p.Sandboxes {
			if s.State == runtime.StateRunning {
				running++
				break
			}
		}
		for _, c := range p.Containers {
			st := c.State
			if st < runtime.StateUnknown || st > runtime.StateExited {
				st = runtime.StateUnknown
			}
			byState[st]++
		}
	}
	g.m.RunningPods.Set(float64(running))
	for s := runtime.StateUnknown; s <= runtime.StateExited; s++ {
		g.m.RunningContainers.WithLabelValues(s.String()).Set(float64(byState[s]))
	}
}

// takeReinspect returns the pods flagged for reinspection: those whose
// inspection failed last time and those requested through RequestReinspect.
func (g *Generator) takeReinspect() map[types.UID]struct{} {
	flagged := g.reinspect
	g.extReinspectMu.Lock()
	for uid := range g.extReinspect {
		flagged[uid] = struct{}{}
	}
	clear(g.extReinspect)
	g.extReinspectMu.Unlock()
	return flagged
}

func (g *Generator) takeOneReinspect(uid types.UID) bool {
	g.extReinspectMu.Lock()
	defer g.extReinspectMu.Unlock()
	_, ok := g.extReinspect[uid]
	delete(g.extReinspect, uid)
	return ok
}

// podRef formats a pod as "namespace/name", the kubelet's pod= log form.
func podRef(p *runtime.Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

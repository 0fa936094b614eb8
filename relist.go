package pleg

import (
	"context"
	"errors"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// relist does one global relist (docs/semantics.md, "Relist"). It runs on
// the relist goroutine only. It returns the listing error, if any.
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
	same := err == nil && samePods(pods, g.listing)
	if err == nil && !same {
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
	g.m.LastSeen.Set(float64(t0.Unix()))
	if !same {
		g.updateGauges(pods)
		g.listing = append(g.listing[:0], pods...)
	}
	stat.Pods = len(pods)
	for _, p := range pods {
		stat.Containers += len(p.Containers) + len(p.Sandboxes)
	}

	todo := g.core.listed(t0, pods, g.takeRequestedReinspections())
	stat.Inspected = len(todo)
	g.inspectAll(ctx, todo, func(w work, status *cruntime.PodStatus, err error) {
		o := g.apply(w, status, err, t0)
		stat.Events += len(o.Events)
		if !o.OK {
			stat.Failed++
			var te *InspectionTimeoutError
			if errors.As(err, &te) {
				stat.TimedOut++
			}
		}
	})
	g.cache.UpdateTime(t0)
	return nil
}

// apply steps the core with the outcome of inspecting one pod at time t
// and carries out what comes out: the cache write, and on success the
// events' delivery.
func (g *Generator) apply(w work, status *cruntime.PodStatus, err error, t time.Time) outcome {
	if err != nil && status != nil && checkStatus(w.pod, status) != nil {
		status = nil // a partial status with nil entries: keep none of it
	}
	o := g.core.inspected(w, status, err, t)
	if o.Stale {
		return o
	}
	if o.Delete {
		g.cache.Delete(w.uid)
	} else {
		g.cache.Set(w.uid, o.Status, o.Err, o.At)
	}
	if !o.OK {
		g.m.InspectionFailures.Inc()
		g.log.V(4).Info("PLEG: Ignoring events for pod", "pod", podRef(w.pod), "podUID", w.uid, "err", err.Error())
		return o
	}
	now := g.clock.Now()
	for i := range o.Events {
		e := &o.Events[i]
		e.Time = now
		if e.Type == ContainerDied && e.ExitCode != nil {
			g.log.V(2).Info("Generic (PLEG): container finished", "podID", w.uid, "containerID", e.ContainerID, "exitCode", *e.ExitCode)
		}
	}
	g.deliver.publish(w.uid, o.State, o.Events)
	if hint, ok := g.takeHint(w.uid); ok && len(o.Events) > 0 {
		g.m.EventDeliveryLatency.Observe(now.Sub(hint).Seconds())
	}
	return o
}

// samePods reports whether a and b are the same pods, the same pointers in
// the same order: a listing that is the last one again.
func samePods(a, b []*cruntime.Pod) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// updateGauges sets the running-pods and running-containers gauges from a
// listing: pods with at least one running sandbox, and containers (not
// sandboxes) per state.
func (g *Generator) updateGauges(pods []*cruntime.Pod) {
	var running int
	var byState [4]int
	for _, p := range pods {
		for _, s := range p.Sandboxes {
			if s.State == cruntime.StateRunning {
				running++
				break
			}
		}
		for _, c := range p.Containers {
			st := c.State
			if st < cruntime.StateUnknown || st > cruntime.StateExited {
				st = cruntime.StateUnknown
			}
			byState[st]++
		}
	}
	g.m.RunningPods.Set(float64(running))
	for s := cruntime.StateUnknown; s <= cruntime.StateExited; s++ {
		g.m.RunningContainers.WithLabelValues(s.String()).Set(float64(byState[s]))
	}
}

// takeRequestedReinspections returns and forgets the pods asked for
// through RequestReinspect.
func (g *Generator) takeRequestedReinspections() []types.UID {
	g.extReinspectMu.Lock()
	defer g.extReinspectMu.Unlock()
	if len(g.extReinspect) == 0 {
		return nil
	}
	out := make([]types.UID, 0, len(g.extReinspect))
	for uid := range g.extReinspect {
		out = append(out, uid)
	}
	clear(g.extReinspect)
	return out
}

// peekReinspect says whether RequestReinspect asked for uid, and which
// request it was, without consuming it: a single-pod relist consumes it only
// once its inspection has succeeded (clearReinspect).
func (g *Generator) peekReinspect(uid types.UID) (seq uint64, ok bool) {
	g.extReinspectMu.Lock()
	defer g.extReinspectMu.Unlock()
	seq, ok = g.extReinspect[uid]
	return seq, ok
}

// clearReinspect forgets the request seq for uid, unless a newer one came.
func (g *Generator) clearReinspect(uid types.UID, seq uint64) {
	g.extReinspectMu.Lock()
	defer g.extReinspectMu.Unlock()
	if g.extReinspect[uid] == seq {
		delete(g.extReinspect, uid)
	}
}

// podRef formats a pod as "namespace/name", the kubelet's pod= log form.
func podRef(p *cruntime.Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

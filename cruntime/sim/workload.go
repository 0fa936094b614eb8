package sim

import (
	"context"
	"fmt"
	"slices"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// crashCodes are the exit codes of crashing containers.
var crashCodes = []int32{1, 2, 137, 139, 255}

func (r *Runtime) pickBehaviourLocked() Behaviour {
	m := r.mix
	n := r.rng.IntN(m.total())
	for _, w := range []struct {
		b Behaviour
		w int
	}{{Steady, m.Steady}, {CrashLoop, m.CrashLoop}, {Batch, m.Batch}, {RollingUpdate, m.RollingUpdate}} {
		if n < w.w {
			return w.b
		}
		n -= w.w
	}
	return Steady
}

// newWorkloadPodLocked creates and starts a generated pod. app and ns are
// reused for a rolling update's replacement ("" picks new ones).
func (r *Runtime) newWorkloadPodLocked(b Behaviour, nContainers int, app, ns string) *pod {
	if app == "" {
		if b == Batch {
			app = jobNames[r.rng.IntN(len(jobNames))]
		} else {
			app = appNames[r.rng.IntN(len(appNames))]
		}
	}
	if ns == "" {
		ns = namespaces[r.rng.IntN(len(namespaces))]
	}
	var name string
	if b == Batch {
		name = fmt.Sprintf("%s-%d-%s", app, 28000000+r.rng.IntN(1000000), r.randString(5))
	} else {
		name = fmt.Sprintf("%s-%s-%s", app, r.randString(10), r.randString(5))
	}
	names := make([]string, nContainers)
	for i := range names {
		if i < len(ctrNames) {
			names[i] = ctrNames[i]
		} else {
			names[i] = fmt.Sprintf("c%d", i)
		}
	}
	p := r.addPodLocked(r.newUID(), name, ns, false, b, names)
	p.app = app
	r.startPodLocked(p, 0, true)
	return p
}

// Step advances the workload by one tick: garbage collection of what was
// superseded or stopped before this tick, the replacement of the
// ReplacePerStep oldest pods, then ChurnPerStep actions on
// randomly chosen pods whose behaviour is not Steady. It is deterministic:
// the same seed and the same sequence of calls give the same model (names,
// UIDs, IDs, attempts, states, exit codes, IPs; timestamps come from the
// clock, so they match too when the clocks do).
func (r *Runtime) Step() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step++
	r.gcLocked()
	for range r.replace {
		if len(r.order) == 0 {
			break
		}
		p := r.order[0]
		n, b, app, ns := max(len(p.names), 1), p.behaviour, p.app, p.namespace
		r.removePodLocked(p)
		r.newWorkloadPodLocked(b, n, app, ns)
	}
	for range r.churn {
		var cands []*pod
		for _, p := range r.order {
			if p.behaviour != Steady && (p.doneStep == 0 || p.behaviour == Batch) {
				cands = append(cands, p)
			}
		}
		if len(cands) == 0 {
			return
		}
		r.actLocked(cands[r.rng.IntN(len(cands))])
	}
}

// StepCount returns the number of Steps taken.
func (r *Runtime) StepCount() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.step
}

func (r *Runtime) actLocked(p *pod) {
	switch p.behaviour {
	case CrashLoop:
		if len(p.names) == 0 {
			return
		}
		name := p.names[r.rng.IntN(len(p.names))]
		sb := p.currentSandbox()
		c := p.latest(name)
		switch {
		case sb == nil || sb.state != runtimeapi.PodSandboxState_SANDBOX_READY:
			return
		case c == nil || c.state == runtimeapi.ContainerState_CONTAINER_EXITED:
			img := images[0]
			if c != nil {
				img = c.image
			}
			var annotations map[string]string
			if r.kubeletMeta {
				annotations = kubeletContainerMeta(p, name, img, slices.Index(p.names, name))
			}
			n := r.createContainerLocked(sb, name, p.nextAttempt(name), img, nil, annotations)
			r.startContainerLocked(n)
		case c.state == runtimeapi.ContainerState_CONTAINER_CREATED:
			r.startContainerLocked(c)
		default:
			r.exitContainerLocked(c, crashCodes[r.rng.IntN(len(crashCodes))], exitedFailed)
		}
	case Batch:
		for _, c := range p.containers {
			if c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
				r.exitContainerLocked(c, 0, exitedOK)
				return
			}
		}
		if sb := p.currentSandbox(); sb != nil && sb.state == runtimeapi.PodSandboxState_SANDBOX_READY {
			r.stopSandboxLocked(sb)
			p.doneStep = r.step + 1
			return
		}
		// Finished: the job's pod is deleted and the next one starts.
		n := max(len(p.names), 1)
		r.removePodLocked(p)
		r.newWorkloadPodLocked(Batch, n, "", "")
	case RollingUpdate:
		r.newWorkloadPodLocked(RollingUpdate, max(len(p.names), 1), p.app, p.namespace)
		for _, sb := range p.sandboxes {
			r.stopSandboxLocked(sb)
		}
		// Stopped pods leave no stray containers (created but never in a
		// sandbox that is still around).
		for _, c := range p.containers {
			r.exitContainerLocked(c, 0, exitedOK)
		}
		p.doneStep = r.step + 1
	}
}

// gcLocked removes, like the kubelet's container garbage collection:
// exited attempts superseded before this tick beyond KeepExitedAttempts per
// container name; not-ready sandboxes superseded before this tick; and rolling
// update pods stopped before this tick.
func (r *Runtime) gcLocked() {
	due := func(mark uint64) bool { return mark != 0 && mark <= r.step }
	for _, p := range slices.Clone(r.order) {
		if p.behaviour == RollingUpdate && due(p.doneStep) {
			r.removePodLocked(p)
			continue
		}
		// Old sandboxes, with their containers.
		for _, sb := range slices.Clone(p.sandboxes) {
			if sb != p.currentSandbox() && sb.state == runtimeapi.PodSandboxState_SANDBOX_NOTREADY && due(sb.stoppedStep) {
				r.removeSandboxLocked(sb)
			}
		}
		if r.pods[p.uid] != p {
			continue
		}
		// Superseded attempts, newest first per name.
		kept := map[string]int{}
		dead := slices.Clone(p.containers)
		slices.SortStableFunc(dead, func(a, b *container) int {
			switch {
			case a.attempt > b.attempt:
				return -1
			case a.attempt < b.attempt:
				return 1
			}
			return 0
		})
		for _, c := range dead {
			if c.superseded == 0 || c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
				continue
			}
			if kept[c.name] < r.keepExited || !due(c.superseded) {
				kept[c.name]++
				continue
			}
			r.removeContainerLocked(c)
		}
	}
}

// Run calls Step every interval of the runtime's clock from an owned
// goroutine, until ctx is done or the runtime is stopped. It returns at
// once; Stop waits for the goroutine. A non-positive interval means 1s.
func (r *Runtime) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	r.smu.Lock()
	if r.stopped {
		r.smu.Unlock()
		return
	}
	r.wg.Add(1)
	r.smu.Unlock()
	go func() {
		defer r.wg.Done()
		t := r.clock.NewTimer(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.stopCh:
				return
			case <-t.C():
				r.Step()
				t.Reset(interval)
			}
		}
	}()
}

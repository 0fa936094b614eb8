package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// simConfig is what a simulated runtime for one run is made of. It is sent
// to the child process as JSON.
type simConfig struct {
	Seed       uint64 `json:"seed"`
	Pods       int    `json:"pods"`
	Containers int    `json:"containers"`
	Socket     string `json:"socket"`
	// EventBuffer is the per-subscriber event buffer (0: 1, for runs
	// where nobody subscribes).
	EventBuffer int `json:"eventBuffer,omitempty"`
}

func (c simConfig) sim() sim.Config {
	return sim.Config{
		Seed:             c.Seed,
		Pods:             c.Pods,
		ContainersPerPod: c.Containers,
		// Pods never change by themselves: the bench changes them (Step
		// is never called, so the behaviours would not matter anyway).
		Mix: sim.Mix{Steady: 1},
		// Nobody subscribes unless told; keep the per-subscriber buffer
		// small then.
		EventBuffer: max(c.EventBuffer, 1),
	}
}

// driver controls the simulated runtime of one run, wherever it runs.
type driver interface {
	// Endpoint is the CRI endpoint to dial.
	Endpoint() string
	// SetLatency sets the latency of every runtime call.
	SetLatency(d time.Duration) error
	// Change changes n distinct pods (never a hung one) and returns how
	// many it changed.
	Change(n int) (int, error)
	// Hang makes the status calls of one pod hang and changes that pod
	// once, so that the generator keeps trying to inspect it. It returns
	// the pod's UID.
	Hang() (string, error)
	// CPU returns the CPU time (user + system) the simulated runtime's
	// process has used, or -1 when it shares this process.
	CPU() (time.Duration, error)

	// For live scenarios (live.go):

	// HangLive makes the status calls of one pod hang, and its filtered
	// list calls too if lists, without changing it. It returns the pod's
	// UID.
	HangLive(lists bool) (string, error)
	// EmitEvents makes the runtime stream an event for pod uid every
	// interval (sim.Runtime.EmitEvents).
	EmitEvents(uid string, every time.Duration) error
	// EventStorm makes the runtime stream perSecond events per second
	// over every pod (sim.Runtime.SetEventStorm).
	EventStorm(perSecond int) error
	// PodCalls returns the runtime calls received for pod uid, per CRI
	// method (sim.Runtime.PodCalls).
	PodCalls(uid string) (map[string]int64, error)
	// EventStats returns the runtime's event counters.
	EventStats() (sim.EventStats, error)
	// Close stops the simulated runtime.
	Close() error
}

// workload changes pods of a simulated runtime in a fixed rotation, so that
// every relist finds exactly the requested number of changed pods.
//
// Changing a pod restarts one of its containers as the kubelet does after a
// crash, with garbage collection of the old attempt: the running attempt
// exits (137) and is removed, and a new attempt with a new ID starts. The
// pod keeps its shape (one sandbox, the same number of containers), so its
// inspection always costs the same runtime calls, and the generator sees
// three events for it: ContainerDied and ContainerRemoved for the old ID,
// ContainerStarted for the new one. Containers of a pod take turns.
type workload struct {
	r    *sim.Runtime
	uids []string // creation order
	next int
	turn map[string]int
	hung map[string]bool
}

func newWorkload(r *sim.Runtime) *workload {
	w := &workload{r: r, turn: map[string]int{}, hung: map[string]bool{}}
	for _, p := range r.Pods() {
		w.uids = append(w.uids, p.UID)
	}
	return w
}

func (w *workload) change(n int) (int, error) {
	changed := 0
	for tries := 0; changed < n && tries < len(w.uids); tries++ {
		uid := w.uids[w.next%len(w.uids)]
		w.next++
		if w.hung[uid] {
			continue
		}
		if err := w.changePod(uid); err != nil {
			return changed, err
		}
		changed++
	}
	return changed, nil
}

func (w *workload) changePod(uid string) error {
	p, ok := w.r.Pod(uid)
	if !ok {
		return fmt.Errorf("pod %s: %w", uid, sim.ErrNotFound)
	}
	var names []string
	for _, c := range p.Containers {
		if !contains(names, c.Name) {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("pod %s has no containers", uid)
	}
	name := names[w.turn[uid]%len(names)]
	w.turn[uid]++
	old, _ := p.Container(name)
	if _, err := w.r.RestartContainer(uid, name); err != nil {
		return err
	}
	return w.r.RemoveContainer(old.ID)
}

func (w *workload) hang() (string, error) {
	for _, uid := range w.uids {
		if w.hung[uid] {
			continue
		}
		w.hung[uid] = true
		w.r.SetHung(uid, true)
		return uid, w.changePod(uid)
	}
	return "", fmt.Errorf("no pod left to hang")
}

// hangLive hangs the status calls (and the filtered list calls, if lists)
// of the first pod not hung yet, without changing it.
func (w *workload) hangLive(lists bool) (string, error) {
	for _, uid := range w.uids {
		if w.hung[uid] {
			continue
		}
		w.hung[uid] = true
		w.r.SetHung(uid, true)
		if lists {
			w.r.SetHungLists(uid, true)
		}
		return uid, nil
	}
	return "", fmt.Errorf("no pod left to hang")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// localDriver runs the simulated runtime in this process.
type localDriver struct {
	r   *sim.Runtime
	w   *workload
	dir string
}

func startLocal(cfg simConfig) (*localDriver, error) {
	dir, err := os.MkdirTemp("", "pleg-bench-")
	if err != nil {
		return nil, err
	}
	cfg.Socket = filepath.Join(dir, "cri.sock")
	r := sim.New(cfg.sim())
	if err := r.Serve(cfg.Socket); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &localDriver{r: r, w: newWorkload(r), dir: dir}, nil
}

func (d *localDriver) Endpoint() string { return d.r.Endpoint() }
func (d *localDriver) SetLatency(l time.Duration) error {
	d.r.SetLatency(sim.Latency{Base: l})
	return nil
}
func (d *localDriver) Change(n int) (int, error)           { return d.w.change(n) }
func (d *localDriver) Hang() (string, error)               { return d.w.hang() }
func (d *localDriver) CPU() (time.Duration, error)         { return -1, nil }
func (d *localDriver) HangLive(lists bool) (string, error) { return d.w.hangLive(lists) }
func (d *localDriver) EmitEvents(uid string, every time.Duration) error {
	d.r.EmitEvents(uid, every)
	return nil
}
func (d *localDriver) EventStorm(perSecond int) error {
	d.r.SetEventStorm(perSecond)
	return nil
}
func (d *localDriver) PodCalls(uid string) (map[string]int64, error) { return d.r.PodCalls(uid), nil }
func (d *localDriver) EventStats() (sim.EventStats, error)           { return d.r.EventStats(), nil }
func (d *localDriver) Close() error {
	d.r.Stop()
	return os.RemoveAll(d.dir)
}

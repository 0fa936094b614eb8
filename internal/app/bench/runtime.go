package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/lineproto"
)

// simConfig configures the simulated runtime of one run: the runtime
// child's configuration line.
type simConfig struct {
	Seed       uint64 `json:"seed"`
	Pods       int    `json:"pods"`
	Containers int    `json:"containers"`
	// EventBuffer is the per-subscriber event buffer (0: 1, for runs
	// where nobody subscribes).
	EventBuffer int `json:"eventBuffer,omitempty"`
	// KubeletMetadata gives the node's sandboxes and containers the
	// labels and annotations a kubelet puts on them
	// (sim.Config.KubeletMetadata).
	KubeletMetadata bool `json:"kubeletMetadata,omitempty"`
}

func (c simConfig) sim() sim.Config {
	return sim.Config{
		Seed:             c.Seed,
		Pods:             c.Pods,
		ContainersPerPod: c.Containers,
		// Pods never change by themselves (Step is never called): the
		// bench changes them.
		Mix:             sim.Mix{Steady: 1},
		EventBuffer:     max(c.EventBuffer, 1),
		KubeletMetadata: c.KubeletMetadata,
	}
}

// serveRuntime is the runtime child: it serves the simulated runtime on a
// socket in a directory of its own, answers "ready <endpoint>", then these
// commands:
//
//	latency <d>         every call takes d
//	change <n>          change n distinct pods; answers how many it changed
//	change-one          change one pod; answers its UID and the change's
//	                    time (Unix ns)
//	churn <n> <every>   change n pods every interval, until quit
//	churned             the pods the churn changed so far
//	hang                hang one pod's status calls and change it once;
//	                    answers its UID
//	hang-live [lists]   hang one pod's status calls (and its filtered list
//	                    calls with "lists"), unchanged; answers its UID
//	emit <uid> <every>  stream an event for the pod every interval
//	storm <n> [started|stopped]
//	                    stream n events a second over every pod, saying
//	                    STOPPED and STARTED in turn, or only one of them
//	cpu                 the process's CPU time in ns
//	calls               the calls received per CRI method, as JSON
//	podcalls <uid>      the calls received for the pod, as JSON
//	eventstats          the event counters, as JSON
func serveRuntime(in io.Reader, out io.Writer) error {
	sc := lineproto.NewScanner(in)
	var cfg simConfig
	if err := lineproto.ReadConfig(sc, &cfg); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "pleg-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r := sim.New(cfg.sim())
	if err := r.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		return err
	}
	defer r.Stop()
	w := newWorkload(r)
	defer w.stopChurn()
	return lineproto.Serve(sc, out, "ready "+r.Endpoint(), func(name, arg string) (string, error) {
		switch name {
		case "latency":
			d, err := time.ParseDuration(arg)
			if err != nil {
				return "", err
			}
			r.SetLatency(sim.Latency{Base: d})
			return "", nil
		case "change":
			n, err := strconv.Atoi(arg)
			if err != nil {
				return "", err
			}
			n, err = w.change(n)
			return strconv.Itoa(n), err
		case "change-one":
			uid, at, err := w.changeOne()
			return fmt.Sprintf("%s %d", uid, at.UnixNano()), err
		case "churn":
			n, every, err := countEvery(arg)
			if err != nil {
				return "", err
			}
			w.startChurn(n, every)
			return "", nil
		case "churned":
			w.mu.Lock()
			defer w.mu.Unlock()
			return strconv.Itoa(w.churned), w.churnErr
		case "hang":
			return w.hang(false, true)
		case "hang-live":
			return w.hang(arg == "lists", false)
		case "emit":
			uid, every, _ := strings.Cut(arg, " ")
			d, err := time.ParseDuration(every)
			if err != nil {
				return "", err
			}
			r.EmitEvents(uid, d)
			return "", nil
		case "storm":
			n, kind, _ := strings.Cut(arg, " ")
			perSecond, err := strconv.Atoi(n)
			if err != nil {
				return "", err
			}
			k, ok := stormKinds[kind]
			if !ok {
				return "", fmt.Errorf("storm events %q: want started, stopped or nothing", kind)
			}
			r.SetStormEvents(k)
			r.SetEventStorm(perSecond)
			return "", nil
		case "cpu":
			return strconv.FormatInt(int64(processCPU()), 10), nil
		case "calls":
			return lineproto.JSON(r.Calls())
		case "podcalls":
			return lineproto.JSON(r.PodCalls(arg))
		case "eventstats":
			return lineproto.JSON(r.EventStats())
		}
		return "", fmt.Errorf("unknown command %q", name)
	})
}

// stormKinds are the storm command's kinds of events.
var stormKinds = map[string]sim.StormEvents{"": sim.StormFlap, "started": sim.StormStarted, "stopped": sim.StormStopped}

// countEvery parses "<n> <interval>".
func countEvery(arg string) (int, time.Duration, error) {
	a, b, _ := strings.Cut(arg, " ")
	n, err := strconv.Atoi(a)
	if err != nil {
		return 0, 0, err
	}
	d, err := time.ParseDuration(b)
	if err == nil && (n <= 0 || d <= 0) {
		err = fmt.Errorf("%q: want a positive count and interval", arg)
	}
	return n, d, err
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
	r *sim.Runtime

	mu   sync.Mutex // the churn goroutine changes pods too
	uids []string   // creation order
	next int
	turn map[string]int
	hung map[string]bool

	churnStop, churnDone chan struct{} // the churn goroutine's (nil: none)
	churned              int           // pods the churn changed
	churnErr             error         // what stopped it, if anything
}

func newWorkload(r *sim.Runtime) *workload {
	w := &workload{r: r, turn: map[string]int{}, hung: map[string]bool{}}
	for _, p := range r.Pods() {
		w.uids = append(w.uids, p.UID)
	}
	return w
}

// change changes n distinct pods, none hung, and returns how many it
// changed: all of them, unless the node has fewer.
func (w *workload) change(n int) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
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

// changeOne changes the next pod and returns its UID and the time right
// before the change.
func (w *workload) changeOne() (string, time.Time, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for range w.uids {
		uid := w.uids[w.next%len(w.uids)]
		w.next++
		if !w.hung[uid] {
			at := time.Now()
			return uid, at, w.changePod(uid)
		}
	}
	return "", time.Time{}, fmt.Errorf("no pod to change")
}

func (w *workload) changePod(uid string) error {
	p, ok := w.r.Pod(uid)
	if !ok {
		return fmt.Errorf("pod %s: %w", uid, sim.ErrNotFound)
	}
	var names []string
	for _, c := range p.Containers {
		if !slices.Contains(names, c.Name) {
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

// hang makes the status calls of the first pod not hung yet hang, and its
// filtered list calls too if lists; with change, it changes the pod once,
// so that a generator keeps trying to inspect it. It returns the pod's UID.
func (w *workload) hang(lists, change bool) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, uid := range w.uids {
		if w.hung[uid] {
			continue
		}
		w.hung[uid] = true
		w.r.SetHung(uid, true)
		w.r.SetHungLists(uid, lists)
		if change {
			return uid, w.changePod(uid)
		}
		return uid, nil
	}
	return "", fmt.Errorf("no pod left to hang")
}

// startChurn changes n pods every interval on a goroutine of its own, until
// stopChurn.
func (w *workload) startChurn(n int, every time.Duration) {
	w.stopChurn()
	stop, done := make(chan struct{}), make(chan struct{})
	w.churnStop, w.churnDone = stop, done
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				changed, err := w.change(n)
				w.mu.Lock()
				w.churned += changed
				w.churnErr = err
				w.mu.Unlock()
				if err != nil {
					return
				}
			}
		}
	}()
}

func (w *workload) stopChurn() {
	if w.churnStop != nil {
		close(w.churnStop)
		<-w.churnDone
		w.churnStop, w.churnDone = nil, nil
	}
}

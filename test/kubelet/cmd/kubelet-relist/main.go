// Command kubelet-relist runs the kubelet v1.37.2's own pod lifecycle event
// generator (pkg/kubelet/pleg GenericPLEG) over the kubelet's own runtime
// manager (pkg/kubelet/kuberuntime) and CRI client (k8s.io/cri-client),
// with the kubelet's pod status cache, against one CRI endpoint. It is the
// kubelet baseline of `pleg bench` and of the e2e suite's measurements:
// nothing of the relist is reimplemented here, every relist is the
// kubelet's GenericPLEG.Relist.
//
// Relists are driven from outside, one at a time, over a line protocol on
// stdin and stdout, or by the PLEG's own clock after start. The program
// first answers "ready", then each command with "ok[ <result>]" or
// "error <message>":
//
//	relist   run one relist; the result is a JSON object: wall time, this
//	         process's CPU time (user + system), Go heap allocations, the
//	         runtime calls by CRI operation (the kubelet's own
//	         kubelet_runtime_operations_total), the events the relist
//	         emitted and discarded
//	start    start the PLEG as the kubelet does (GenericPLEG.Start): a
//	         relist at once, then each --relist-period after the end of
//	         the last, on its own goroutine and timer; relist is refused
//	         from then on
//	next     after start, wait for the end of the next relist; the result
//	         is the number of relists ended since start
//	stats    after start, a JSON object: the time (Unix ns), this
//	         process's CPU time, the relists ended since start, and the
//	         sum of their durations (kubelet_pleg_relist_duration_seconds)
//	rss      this process's peak resident set size in bytes (VmHWM)
//	quit     exit (as on end of input)
//
// Usage: kubelet-relist --endpoint unix:///run/cri.sock [--runtime-request-timeout 2m] [--relist-period 1s] [--cpuprofile FILE]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/component-base/metrics/legacyregistry"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/kuberuntime"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
	"k8s.io/kubernetes/pkg/kubelet/pleg"
	proberesults "k8s.io/kubernetes/pkg/kubelet/prober/results"
	"k8s.io/utils/clock"
)

// eventCapacity is the capacity of the kubelet's PLEG event channel
// (plegChannelCapacity in pkg/kubelet/kubelet.go); the kubelet drops a
// relist's events beyond it unless its sync loop keeps up.
const eventCapacity = 1000

func main() {
	endpoint := flag.String("endpoint", "", "CRI endpoint (unix:///path)")
	timeout := flag.Duration("runtime-request-timeout", 2*time.Minute, "timeout of each CRI call (the kubelet's --runtime-request-timeout)")
	period := flag.Duration("relist-period", time.Second, "the PLEG's relist period after start (the kubelet's: 1s)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (relists, warm-up and start included) to this file")
	flag.Parse()
	if *endpoint == "" || *period <= 0 {
		fmt.Fprintln(os.Stderr, "kubelet-relist: --endpoint is required, and --relist-period must be positive")
		os.Exit(2)
	}
	if err := run(*endpoint, *timeout, *period, *cpuProfile, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-relist: %v\n", err)
		os.Exit(1)
	}
}

// relister is the kubelet's PLEG over its runtime manager, and a goroutine
// counting the events it emits (the kubelet's sync loop in its place).
type relister struct {
	gen    *pleg.GenericPLEG
	events chan *pleg.PodLifecycleEvent
	counts chan int // the count up to each nil marker sent on events

	started bool
	clock   *watchedClock
}

// watchedClock is the real clock, whose timers note each Reset. The
// GenericPLEG started resets its relist timer right after each global
// relist ends (workerLoopIteration), and nowhere else: a reset marks the
// end of a relist. Nothing else about its timing changes.
type watchedClock struct {
	clock.RealClock

	mu    sync.Mutex
	ended int           // relists ended
	next  chan struct{} // closed and replaced at each end
}

func newWatchedClock() *watchedClock { return &watchedClock{next: make(chan struct{})} }

func (c *watchedClock) NewTimer(d time.Duration) clock.Timer {
	return watchedTimer{Timer: c.RealClock.NewTimer(d), c: c}
}

func (c *watchedClock) relistEnded() {
	c.mu.Lock()
	c.ended++
	close(c.next)
	c.next = make(chan struct{})
	c.mu.Unlock()
}

// state returns the relists ended so far, and a channel closed at the
// next end.
func (c *watchedClock) state() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended, c.next
}

type watchedTimer struct {
	clock.Timer
	c *watchedClock
}

func (t watchedTimer) Reset(d time.Duration) bool {
	t.c.relistEnded()
	return t.Timer.Reset(d)
}

func newRelister(ctx context.Context, endpoint string, timeout, period time.Duration, rootDir string) (*relister, error) {
	tp := noop.NewTracerProvider() // the kubelet's tracer provider without tracing configured
	// As the kubelet does (PreInitRuntimeService), with the CRIListStreaming
	// gate at its default (off).
	rs, err := remote.NewRemoteRuntimeService(ctx, endpoint, timeout, tp, false)
	if err != nil {
		return nil, fmt.Errorf("runtime service: %w", err)
	}
	memoryThrottlingFactor := 0.9        // the kubelet's default
	cmgr := cm.NewStubContainerManager() // container manager: only its internal lifecycle hooks are kept; a relist never calls them
	rt, _, err := kuberuntime.NewKubeGenericRuntimeManager(
		ctx,
		kubecontainer.FilterEventRecorder(&record.FakeRecorder{}), // events of image pulls and hooks; a relist records none
		proberesults.NewManager(),                                 // liveness, readiness and startup results: read by SyncPod only
		proberesults.NewManager(),
		proberesults.NewManager(),
		rootDir,                    // root directory: the actuated-state checkpoint lives here
		rootDir,                    // pod logs directory: used when creating containers
		&cadvisorapi.MachineInfo{}, // read by APIVersion and container creation, not by a relist
		noPodState{},
		110, // max pods: sizes image pull caches
		kubecontainer.RealOS{},
		nil, // runtime helper (the kubelet itself): used by SyncPod and sandbox creation only
		nil, // lifecycle HTTP client: used by container hooks only
		flowcontrol.NewBackOff(10*time.Second, 300*time.Second), // image pull back-off
		true, nil, 5, 10, // image pulls: serialized, no parallel limit, QPS, burst
		// Image pull credential verification: the kubelet's default policy;
		// no credential provider plugins.
		"NeverVerifyPreloadedImages", nil, "", "",
		nil,                                                     // singleProcessOOMKill: read when creating containers
		true, metav1.Duration{Duration: 100 * time.Millisecond}, // CPU CFS quota settings: container creation only
		nil, // default pod sysctls: sandbox creation only
		rs,
		nil, // image service: image pulls and image GC only (the simulated runtime has none)
		cmgr,
		nil,       // container log manager: log rotation, not a relist
		nil,       // runtime class manager: sandbox creation only
		false, "", // seccomp default, swap behaviour: container creation only
		cmgr.GetNodeAllocatableAbsolute,
		&memoryThrottlingFactor, "", // memory throttling factor and reservation policy: container creation only
		nil, // image pulling time recorder: image pulls only
		tp,
		nil, nil, // service account token manager and getter: credential providers only (off)
		nil, // init container time recorder: SyncPod only
	)
	if err != nil {
		return nil, fmt.Errorf("runtime manager: %w", err)
	}
	events := make(chan *pleg.PodLifecycleEvent, eventCapacity)
	// The relist period (the kubelet's 1 s unless --relist-period says
	// otherwise) and threshold (3 m) are the kubelet's; relists driven by
	// hand read neither, the started PLEG the period.
	clk := newWatchedClock()
	gen := pleg.NewGenericPLEG(rt, events,
		&pleg.RelistDuration{RelistPeriod: period, RelistThreshold: 3 * time.Minute},
		kubecontainer.NewCache(), clk)
	g, ok := gen.(*pleg.GenericPLEG)
	if !ok {
		return nil, fmt.Errorf("NewGenericPLEG returned a %T, not a *GenericPLEG", gen)
	}
	r := &relister{gen: g, events: events, counts: make(chan int), clock: clk}
	go r.count()
	return r, nil
}

// count receives events until the channel closes; at each nil marker it
// hands over the number received since the previous one.
func (r *relister) count() {
	n := 0
	for e := range r.events {
		if e == nil {
			r.counts <- n
			n = 0
			continue
		}
		n++
	}
	close(r.counts)
}

// stop ends the counting goroutine, or, once started, the PLEG (whose
// goroutine may still send: the channel stays open, the process is
// exiting).
func (r *relister) stop() {
	if r.started {
		r.gen.Stop()
		return
	}
	close(r.events)
}

// nextLimit bounds the wait for the next relist.
const nextLimit = 5 * time.Minute

// next waits for the end of the next relist of the started PLEG and
// returns the relists ended since start.
func (r *relister) next() (int, error) {
	if !r.started {
		return 0, errors.New("next: not started")
	}
	n, ch := r.clock.state()
	select {
	case <-ch:
		return n + 1, nil
	case <-time.After(nextLimit):
		return n, fmt.Errorf("next: no relist ended within %v", nextLimit)
	}
}

// stats is the answer to "stats".
type stats struct {
	NowNs         int64   `json:"nowNs"`
	CPUNs         int64   `json:"cpuNs"`
	Relists       int     `json:"relists"`
	RelistSeconds float64 `json:"relistSeconds"`
}

// stats reads the started PLEG's figures: the time and the CPU first, so
// that gathering the metrics is not in the CPU between two stats.
func (r *relister) stats() (*stats, error) {
	if !r.started {
		return nil, errors.New("stats: not started")
	}
	c, err := cpuTime()
	if err != nil {
		return nil, err
	}
	s := &stats{NowNs: time.Now().UnixNano(), CPUNs: int64(c)}
	s.Relists, _ = r.clock.state()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering the kubelet's metrics: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kubelet_pleg_relist_duration_seconds" {
			for _, m := range mf.GetMetric() {
				s.RelistSeconds += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return s, nil
}

// result is the answer to "relist".
type result struct {
	WallNs     int64              `json:"wallNs"`
	CPUNs      int64              `json:"cpuNs"`
	Mallocs    uint64             `json:"mallocs"`
	AllocBytes uint64             `json:"allocBytes"`
	Calls      map[string]float64 `json:"calls"`
	Events     int                `json:"events"`
	Discarded  float64            `json:"discardedEvents"`
	// ListFailed says a list call of the relist failed (GenericPLEG.Relist
	// then logs and returns).
	ListFailed bool `json:"listFailed"`
}

func (r *relister) relist(ctx context.Context) (*result, error) {
	calls0, errs0, disc0, err := counters()
	if err != nil {
		return nil, err
	}
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	c0, err := cpuTime()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	r.gen.Relist(ctx)
	wall := time.Since(t0)
	c1, err := cpuTime()
	if err != nil {
		return nil, err
	}
	goruntime.ReadMemStats(&m1)
	// The marker queues behind every event of this relist.
	r.events <- nil
	n := <-r.counts
	calls1, errs1, disc1, err := counters()
	if err != nil {
		return nil, err
	}
	res := &result{
		WallNs: int64(wall), CPUNs: int64(c1 - c0),
		Mallocs: m1.Mallocs - m0.Mallocs, AllocBytes: m1.TotalAlloc - m0.TotalAlloc,
		Calls: map[string]float64{}, Events: n, Discarded: disc1 - disc0,
		ListFailed: errs1["list_podsandbox"] > errs0["list_podsandbox"] || errs1["list_containers"] > errs0["list_containers"],
	}
	for op, v := range calls1 {
		if d := v - calls0[op]; d > 0 {
			res.Calls[op] = d
		}
	}
	return res, nil
}

// counters reads the kubelet's runtime operation and operation error
// counters by operation type, and its discarded PLEG event counter, from
// its registry.
func counters() (ops, errs map[string]float64, discarded float64, err error) {
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("gathering the kubelet's metrics: %w", err)
	}
	ops, errs = map[string]float64{}, map[string]float64{}
	byOp := func(into map[string]float64, mf *dto.MetricFamily) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation_type" {
					into[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kubelet_runtime_operations_total":
			byOp(ops, mf)
		case "kubelet_runtime_operations_errors_total":
			byOp(errs, mf)
		case "kubelet_pleg_discard_events":
			for _, m := range mf.GetMetric() {
				discarded += m.GetCounter().GetValue()
			}
		}
	}
	return ops, errs, discarded, nil
}

// cpuTime is this process's user plus system CPU time, all threads.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// peakRSS is VmHWM from /proc/self/status, in bytes.
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmHWM %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

func run(endpoint string, timeout, period time.Duration, cpuProfile string, in io.Reader, out io.Writer) error {
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// The kubelet registers its metrics at start; unregistered ones would
	// record nothing, and the relist's metric work would be missing.
	kubeletmetrics.Register()
	rootDir, err := os.MkdirTemp("", "kubelet-relist-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(rootDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := newRelister(ctx, endpoint, timeout, period, rootDir)
	if err != nil {
		return err
	}
	defer r.stop()

	bw := bufio.NewWriter(out)
	reply := func(format string, args ...any) error {
		fmt.Fprintf(bw, format+"\n", args...)
		return bw.Flush()
	}
	if err := reply("ready"); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var err error
		switch cmd := strings.TrimSpace(sc.Text()); cmd {
		case "relist":
			if r.started {
				err = errors.New("relist: the PLEG is started")
				break
			}
			var res *result
			if res, err = r.relist(ctx); err == nil {
				js, _ := json.Marshal(res)
				err = reply("ok %s", js)
			}
		case "start":
			if !r.started {
				r.started = true
				r.gen.Start(ctx)
			}
			err = reply("ok")
		case "next":
			var n int
			if n, err = r.next(); err == nil {
				err = reply("ok %d", n)
			}
		case "stats":
			var s *stats
			if s, err = r.stats(); err == nil {
				js, _ := json.Marshal(s)
				err = reply("ok %s", js)
			}
		case "rss":
			var n int64
			if n, err = peakRSS(); err == nil {
				err = reply("ok %d", n)
			}
		case "quit":
			return nil
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		if err != nil {
			if rerr := reply("error %s", strings.ReplaceAll(err.Error(), "\n", " ")); rerr != nil {
				return rerr
			}
		}
	}
	return sc.Err()
}

// noPodState answers the runtime manager's questions about the kubelet's
// pod workers; only its container garbage collection asks them, never a
// relist.
type noPodState struct{}

func (noPodState) IsPodTerminationRequested(types.UID) bool { return false }
func (noPodState) ShouldPodContentBeRemoved(types.UID) bool { return false }
func (noPodState) ShouldPodRuntimeBeRemoved(types.UID) bool { return false }

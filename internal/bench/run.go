package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/stats"
)

// Options configure a benchmark run.
type Options struct {
	// Scenarios to run; Scenarios() when empty.
	Scenarios []Scenario
	// Kubelet, when set, is the path of the kubelet-relist program
	// (test/kubelet/cmd/kubelet-relist: the kubelet v1.36.3's own
	// GenericPLEG, runtime manager and CRI client): every scenario driven
	// by hand then also runs with it, against an identical simulated node,
	// as the baseline.
	Kubelet string
	// Quick uses the scenarios' small relist counts and the live
	// scenarios' short windows (for tests and smoke runs).
	Quick bool
	// Relists, when positive, overrides the number of measured relists of
	// every run (kubelet runs with a hung pod use at most 5). Live
	// scenarios run for a wall time instead.
	Relists int
	// MaxParallelInspections is pleg's inspection bound (0: the library's
	// default).
	MaxParallelInspections int
	// InProcess serves the simulated runtime from this process and runs
	// pleg's generator in this process too; its CPU time and allocations
	// then include the simulator's work, and its peak RSS is not measured.
	// Otherwise pleg's generator runs in a child process of its own (this
	// binary re-executed, see MaybeServeChild), like the kubelet's.
	InProcess bool
	// ChildCommand returns the command that serves the simulated runtime
	// in a child process (see MaybeServeChild); DefaultChildCommand when
	// nil.
	ChildCommand func() (*exec.Cmd, error)
	// Seed seeds the simulated runtime (0: 1).
	Seed uint64
	// Progress, if not nil, receives one line per run as it starts.
	Progress io.Writer
}

// Run runs the scenarios and returns the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if len(o.Scenarios) == 0 {
		o.Scenarios = Scenarios()
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	rep := newReport(o)
	for _, sc := range o.Scenarios {
		res := ScenarioResult{Scenario: sc, Description: sc.Description()}
		if sc.Live != nil {
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "pleg bench: %s: live, %v...\n", sc.Name, sc.Live.window(o.Quick))
			}
			live, err := runLive(ctx, o, sc)
			if err != nil {
				return nil, fmt.Errorf("scenario %s (live): %w", sc.Name, err)
			}
			res.Live = live
			res.Targets = evaluateLive(sc, live)
			rep.Scenarios = append(rep.Scenarios, res)
			continue
		}
		cols := []column{plegColumn(sc, o.MaxParallelInspections)}
		if o.Kubelet != "" {
			cols = append(cols, column{kubelet: true, inspectionTimeout: -1})
		}
		for _, col := range cols {
			n := sc.relists(col.kubelet, o.Quick, o.Relists)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "pleg bench: %s: %s, %d relists...\n", sc.Name, col.name(), n)
			}
			run, err := runOne(ctx, o, sc, col, n)
			if err != nil {
				return nil, fmt.Errorf("scenario %s (%s): %w", sc.Name, col.name(), err)
			}
			if col.kubelet {
				res.Kubelet = run
			} else {
				res.PLEG = run
			}
		}
		res.Targets = evaluate(sc, res.PLEG, res.Kubelet)
		rep.Scenarios = append(rep.Scenarios, res)
	}
	return rep, nil
}

// column is one generator a scenario runs with.
type column struct {
	// kubelet: the kubelet's own relist (Options.Kubelet), one pod after
	// another, each waited for as long as the runtime request timeout
	// allows.
	kubelet           bool
	parallel          int           // pleg's MaxParallelInspections as set
	inspectionTimeout time.Duration // pleg's, as set; negative: none
}

func plegColumn(sc Scenario, parallel int) column {
	if parallel <= 0 {
		parallel = pleg.DefaultMaxParallelInspections
	}
	timeout := sc.InspectionTimeout
	if timeout == 0 {
		timeout = pleg.DefaultPodInspectionTimeout
	}
	return column{parallel: parallel, inspectionTimeout: timeout}
}

func (c column) name() string {
	if c.kubelet {
		return "kubelet"
	}
	return "pleg"
}

// probe wraps the CRI client to time the listings and count the pods
// inspected (status fetches that reached the runtime client).
type probe struct {
	cruntime.Runtime
	inspected atomic.Int64
	mu        sync.Mutex
	lastList  time.Duration
}

func (p *probe) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	start := time.Now()
	pods, err := p.Runtime.ListPods(ctx)
	d := time.Since(start)
	p.mu.Lock()
	p.lastList = d
	p.mu.Unlock()
	return pods, err
}

func (p *probe) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	p.inspected.Add(1)
	return p.Runtime.ItemStatuses(ctx, pod, sbs, cts)
}

func (p *probe) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	return p.Runtime.ListPod(ctx, uid)
}

// asRuntime returns the probe as the generator's runtime.
func (p *probe) asRuntime() cruntime.Runtime { return p }

func startDriver(o Options, cfg simConfig) (driver, error) {
	if o.InProcess {
		return startLocal(cfg)
	}
	newCmd := o.ChildCommand
	if newCmd == nil {
		newCmd = DefaultChildCommand
	}
	cmd, err := newCmd()
	if err != nil {
		return nil, err
	}
	return startChild(cmd, cfg)
}

// startRelisterFor starts the column's generator against endpoint. ctx
// bounds a child process's life.
func startRelisterFor(ctx context.Context, o Options, sc Scenario, col column, endpoint string) (relister, error) {
	if col.kubelet {
		return startRelister(ctx, "kubelet", kubeletCommand(o.Kubelet, endpoint, sc.RequestTimeout), false)
	}
	cfg := plegConfig{
		Endpoint: endpoint, RequestTimeout: sc.RequestTimeout, Parallel: col.parallel,
		InspectionTimeout: col.inspectionTimeout, RelistThreshold: sc.RelistThreshold,
	}
	if o.InProcess {
		return newPLEGRelister(cfg)
	}
	cmd, err := plegChildCommand(cfg)
	if err != nil {
		return nil, err
	}
	return startRelister(ctx, "pleg", cmd, cfg.RelistThreshold > 0)
}

// floorer measures the transport's floor under a relist: the listing's
// two calls with the replies discarded undecoded. pleg's relisters do; the
// floor is measured in idle scenarios, where the listing is all a relist
// does.
type floorer interface {
	floor(ctx context.Context, n int) (*floorResult, error)
}

// residentFiler reports the resident pages a relister's process maps from
// files (its binary's, mostly): pleg's child process does.
type residentFiler interface {
	residentFile() (int64, error)
}

// warmupRelists are run before the measured ones, without call latency:
// the first inspects every pod, the second finds nothing to do. On a busy
// machine a pod inspection can time out in the first and be retried in
// the next: warm-up then goes on until a relist inspects nothing, up to
// maxWarmupRelists.
const (
	warmupRelists    = 2
	maxWarmupRelists = 6
)

// inspectedBy returns the pods a relist inspected: as pleg counted them,
// or, for the kubelet, its PodSandboxStatus calls (it makes one per
// sandbox of every pod it inspects, and a simulated pod has one sandbox).
func inspectedBy(r *relistResult) int64 {
	if r.Inspected != nil {
		return *r.Inspected
	}
	return int64(r.Calls["podsandbox_status"])
}

// runOne measures relists relists of one scenario with one column, against
// a fresh simulated runtime.
func runOne(ctx context.Context, o Options, sc Scenario, col column, relists int) (_ *RunResult, err error) {
	drv, err := startDriver(o, simConfig{Seed: o.Seed, Pods: sc.Pods, Containers: sc.Containers})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := drv.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rl, err := startRelisterFor(cctx, o, sc, col, drv.Endpoint())
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rl.close(); err == nil && cerr != nil {
			err = cerr
		}
	}()

	var warm int64
	for i := 1; ; i++ {
		r, err := rl.relist(ctx)
		if err != nil {
			return nil, fmt.Errorf("warm-up relist: %w", err)
		}
		n := inspectedBy(r)
		warm += n
		if i >= warmupRelists && n == 0 {
			break
		}
		if i == maxWarmupRelists {
			return nil, fmt.Errorf("warm-up relist %d still inspected %d pods", i, n)
		}
	}
	// Every pod is new to the generator: each is inspected at least once.
	if warm < int64(sc.Pods) {
		return nil, fmt.Errorf("warm-up relists inspected %d pods, want at least %d", warm, sc.Pods)
	}
	if sc.Latency > 0 {
		if err := drv.SetLatency(sc.Latency); err != nil {
			return nil, err
		}
	}
	for range sc.HungPods {
		if _, err := drv.Hang(); err != nil {
			return nil, err
		}
	}

	res := &RunResult{
		Algorithm:              col.name(),
		MaxParallelInspections: col.parallel,
		PodInspectionTimeoutMs: ms(col.inspectionTimeout),
		Relists:                relists,
		RequestTimeoutMs:       ms(sc.RequestTimeout),
	}
	if col.inspectionTimeout < 0 {
		res.PodInspectionTimeoutMs = -1
	}

	if err := rl.watchHealth(); err != nil {
		return nil, err
	}
	simCPU0, err := drv.CPU()
	if err != nil {
		return nil, err
	}
	var (
		durs, lists     []time.Duration
		cpu             time.Duration
		mallocs, bytes  uint64
		inspected       []int64
		beyondList      time.Duration
		eventsTotal     int
		discarded       float64
		calls           = map[string]float64{}
		wantInspections = int64(sc.Changed)
	)
	for i := range relists {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if sc.Changed > 0 {
			n, err := drv.Change(sc.Changed)
			if err != nil {
				return nil, err
			}
			if n != sc.Changed {
				return nil, fmt.Errorf("changed %d pods, want %d", n, sc.Changed)
			}
		}
		r, err := rl.relist(ctx)
		if err != nil {
			return nil, err
		}
		d := time.Duration(r.WallNs)
		durs = append(durs, d)
		if r.ListNs != nil {
			l := time.Duration(*r.ListNs)
			lists = append(lists, l)
			beyondList = max(beyondList, d-l)
		}
		if r.ListFailed {
			res.RelistErrors++
		}
		cpu += time.Duration(r.CPUNs)
		mallocs += r.Mallocs
		bytes += r.AllocBytes
		inspected = append(inspected, inspectedBy(r))
		eventsTotal += r.Events
		discarded += r.Discarded
		res.InspectionTimeouts += r.Timeouts
		for op, v := range r.Calls {
			calls[op] += v
		}
		if sc.Pause > 0 && i < relists-1 {
			select {
			case <-time.After(sc.Pause):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}

	if res.Health, err = rl.health(); err != nil {
		return nil, err
	}
	if res.PeakRSSBytes, err = rl.peakRSS(); err != nil {
		return nil, err
	}
	res.ResidentFileBytes = -1
	if rf, ok := rl.(residentFiler); ok && !col.kubelet {
		if res.ResidentFileBytes, err = rf.residentFile(); err != nil {
			return nil, err
		}
	}
	simCPU1, err := drv.CPU()
	if err != nil {
		return nil, err
	}
	res.ListFloorCPUMs, res.ListBytes = -1, -1
	if fl, ok := rl.(floorer); ok && !col.kubelet && sc.Changed == 0 && sc.HungPods == 0 && cpuMeasured {
		// After the relists, so that the simulator's CPU above is theirs.
		f, err := fl.floor(ctx, relists)
		if err != nil {
			return nil, err
		}
		res.ListFloorCPUMs, res.ListBytes = ms(time.Duration(f.CPUNs)), f.Bytes
	}

	n := float64(relists)
	res.RelistMs = make([]float64, len(durs))
	for i, d := range durs {
		res.RelistMs[i] = ms(d)
	}
	res.RelistP50Ms = ms(stats.Percentile(durs, 0.50))
	res.RelistP99Ms = ms(stats.Percentile(durs, 0.99))
	res.RelistMaxMs = ms(slices.Max(durs))
	res.ListP50Ms, res.ListP99Ms, res.MaxBeyondListMs = -1, -1, -1
	if len(lists) > 0 {
		res.ListP50Ms = ms(stats.Percentile(lists, 0.50))
		res.ListP99Ms = ms(stats.Percentile(lists, 0.99))
		res.MaxBeyondListMs = ms(beyondList)
	}
	res.CallsByOp = map[string]float64{}
	for op, v := range calls {
		res.CallsByOp[op] = v / n
		res.CallsPerRelist += v / n
	}
	var sum int64
	res.InspectedMin, res.InspectedMax = inspected[0], inspected[0]
	for _, v := range inspected {
		sum += v
		res.InspectedMin = min(res.InspectedMin, v)
		res.InspectedMax = max(res.InspectedMax, v)
	}
	res.PodsInspectedPerRelist = float64(sum) / n
	if sc.HungPods == 0 {
		res.InspectedAsChanged = res.InspectedMin == wantInspections && res.InspectedMax == wantInspections
	}
	res.EventsPerRelist = float64(eventsTotal) / n
	res.DiscardedEvents = discarded
	res.CPUPerRelistMs = -1
	if cpuMeasured {
		res.CPUPerRelistMs = ms(cpu) / n
	}
	res.AllocsPerRelist = float64(mallocs) / n
	res.AllocBytesPerRelist = float64(bytes) / n
	res.SimCPUPerRelistMs = -1
	if simCPU0 >= 0 && cpuMeasured {
		res.SimCPUPerRelistMs = ms(simCPU1-simCPU0) / n
	}
	return res, nil
}

// counterSnapshot holds the counters the bench reads from the registry.
type counterSnapshot struct {
	ops      map[string]float64 // kubelet_runtime_operations_total by operation_type
	timeouts float64            // pleg_pod_inspection_timeouts_total, all labels
}

func counters(g prometheus.Gatherer) counterSnapshot {
	s := counterSnapshot{ops: map[string]float64{}}
	mfs, err := g.Gather()
	if err != nil {
		return s
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kubelet_runtime_operations_total":
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "operation_type" {
						s.ops[l.GetValue()] += mt.GetCounter().GetValue()
					}
				}
			}
		case "pleg_pod_inspection_timeouts_total":
			for _, mt := range mf.GetMetric() {
				s.timeouts += mt.GetCounter().GetValue()
			}
		}
	}
	return s
}

// healthWatch checks health without a poller (a goroutine waking every
// few milliseconds would add its own CPU time to the figures): it calls
// Healthy right before and right after every relist, and computes from the
// health timestamp (Generator.LastRelist) the longest time the generator
// went without a successful relist start, up to the moment each listing
// returned (when the timestamp moves) and to the end of the run. Healthy
// is false exactly when that time exceeds the threshold.
type healthWatch struct {
	g         *pleg.Generator
	threshold time.Duration
	samples   int
	unhealthy int
	firstErr  string
	prev      time.Time // health timestamp so far
	stalest   time.Duration
}

func newHealthWatch(g *pleg.Generator, threshold time.Duration) *healthWatch {
	return &healthWatch{g: g, threshold: threshold, prev: g.LastRelist()}
}

func (h *healthWatch) check() {
	ok, err := h.g.Healthy()
	h.samples++
	if !ok {
		h.unhealthy++
		if h.firstErr == "" && err != nil {
			h.firstErr = err.Error()
		}
	}
}

// relisted notes a relist whose listing took list.
func (h *healthWatch) relisted(list time.Duration) {
	last := h.g.LastRelist()
	if last.After(h.prev) {
		h.stalest = max(h.stalest, last.Add(list).Sub(h.prev))
		h.prev = last
	}
}

func (h *healthWatch) result() *HealthResult {
	h.stalest = max(h.stalest, time.Since(h.prev))
	return &HealthResult{
		ThresholdMs:       ms(h.threshold),
		Samples:           h.samples,
		UnhealthySamples:  h.unhealthy,
		LongestWithoutMs:  ms(h.stalest),
		HealthyThroughout: h.unhealthy == 0 && h.stalest <= h.threshold,
		FirstError:        h.firstErr,
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var errNoKubelet = errors.New("needs the kubelet baseline (--kubelet)")

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os/exec"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/runtime"
	"github.com/podlifecycle/pleg/runtime/cri"
)

// Options configure a benchmark run.
type Options struct {
	// Scenarios to run; Scenarios() when empty.
	Scenarios []Scenario
	// Serial also runs every scenario with the kubelet's serial algorithm
	// (MaxParallelInspections 1, no pod inspection timeout) as a baseline.
	Serial bool
	// Quick uses the scenarios' small relist counts and the live
	// scenarios' short windows (for tests and smoke runs).
	Quick bool
	// Relists, when positive, overrides the number of measured relists of
	// every run (serial runs with a hung pod use at most 5). Live
	// scenarios run for a wall time instead.
	Relists int
	// MaxParallelInspections is pleg's inspection bound (0: the library's
	// default).
	MaxParallelInspections int
	// InProcess serves the simulated runtime from this process; its work
	// is then included in the CPU and allocation figures.
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
		res := ScenarioResult{Scenario: sc, Description: sc.Description(), Reference: kubeletReference(sc.Name)}
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
		algs := []algorithm{plegAlgorithm(sc, o.MaxParallelInspections)}
		if o.Serial {
			algs = append(algs, serialAlgorithm())
		}
		for _, alg := range algs {
			n := sc.relists(alg.serial, o.Quick, o.Relists)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "pleg bench: %s: %s, %d relists...\n", sc.Name, alg.name(), n)
			}
			run, err := runOne(ctx, o, sc, alg, n)
			if err != nil {
				return nil, fmt.Errorf("scenario %s (%s): %w", sc.Name, alg.name(), err)
			}
			if alg.serial {
				res.Serial = run
			} else {
				res.PLEG = run
			}
		}
		res.Targets = evaluate(sc, res.PLEG, res.Serial, o.InProcess)
		rep.Scenarios = append(rep.Scenarios, res)
	}
	return rep, nil
}

// algorithm is how the generator inspects changed pods.
type algorithm struct {
	serial            bool
	parallel          int           // MaxParallelInspections as set
	inspectionTimeout time.Duration // as set; negative: disabled
}

func plegAlgorithm(sc Scenario, parallel int) algorithm {
	if parallel <= 0 {
		parallel = pleg.DefaultMaxParallelInspections
	}
	timeout := sc.InspectionTimeout
	if timeout == 0 {
		timeout = pleg.DefaultPodInspectionTimeout
	}
	return algorithm{parallel: parallel, inspectionTimeout: timeout}
}

// serialAlgorithm is the kubelet's: one pod after another, and a pod's
// status is waited for as long as the runtime request timeout allows.
func serialAlgorithm() algorithm {
	return algorithm{serial: true, parallel: 1, inspectionTimeout: -1}
}

func (a algorithm) name() string {
	if a.serial {
		return "serial"
	}
	return "pleg"
}

// probe wraps the CRI client to time the listings and count the pods
// inspected (PodStatus calls that reached the runtime client).
type probe struct {
	runtime.Runtime
	inspected atomic.Int64
	mu        sync.Mutex
	lastList  time.Duration
}

func (p *probe) ListPods(ctx context.Context) ([]*runtime.Pod, error) {
	start := time.Now()
	pods, err := p.Runtime.ListPods(ctx)
	d := time.Since(start)
	p.mu.Lock()
	p.lastList = d
	p.mu.Unlock()
	return pods, err
}

func (p *probe) PodStatus(ctx context.Context, pod *runtime.Pod) (*runtime.PodStatus, error) {
	p.inspected.Add(1)
	return p.Runtime.PodStatus(ctx, pod)
}

func (p *probe) ListPod(ctx context.Context, uid types.UID) (*runtime.Pod, error) {
	return p.Runtime.ListPod(ctx, uid)
}

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

// warmupRelists are run before the measured ones, without call latency:
// the first inspects every pod, the second finds nothing to do.
const warmupRelists = 2

// runOne measures relists relists of one scenario with one algorithm,
// against a fresh simulated runtime.
func runOne(ctx context.Context, o Options, sc Scenario, alg algorithm, relists int) (_ *RunResult, err error) {
	drv, err := startDriver(o, simConfig{Seed: o.Seed, Pods: sc.Pods, Containers: sc.Containers})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := drv.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	// The kubelet's algorithm also makes a pod's status calls one after
	// another.
	statusConcurrency := cri.DefaultStatusConcurrency
	if alg.serial {
		statusConcurrency = 1
	}
	client, err := cri.Dial(drv.Endpoint(), cri.WithTimeout(sc.RequestTimeout), cri.WithMetrics(m),
		cri.WithLogger(logr.Discard()), cri.WithStatusConcurrency(statusConcurrency))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	pr := &probe{Runtime: client}
	gopts := pleg.Options{
		Runtime:                pr,
		Metrics:                m,
		MaxParallelInspections: alg.parallel,
		PodInspectionTimeout:   alg.inspectionTimeout,
		RelistThreshold:        sc.RelistThreshold,
		Events:                 pleg.EventsOff,
	}
	g, err := pleg.New(gopts)
	if err != nil {
		return nil, err
	}
	// Stop cancels abandoned inspections, so it returns at once even
	// with a hung pod.
	defer g.Stop()
	events := g.Watch()
	drain := func() int {
		n := 0
		for {
			select {
			case <-events:
				n++
			default:
				return n
			}
		}
	}

	for range warmupRelists {
		if err := g.Relist(ctx); err != nil {
			return nil, fmt.Errorf("warm-up relist: %w", err)
		}
		drain()
	}
	if got := pr.inspected.Load(); got != int64(sc.Pods) {
		return nil, fmt.Errorf("warm-up relists inspected %d pods, want %d", got, sc.Pods)
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
		Algorithm:              alg.name(),
		MaxParallelInspections: alg.parallel,
		PodInspectionTimeoutMs: ms(alg.inspectionTimeout),
		Relists:                relists,
		RequestTimeoutMs:       ms(sc.RequestTimeout),
	}
	if alg.inspectionTimeout < 0 {
		res.PodInspectionTimeoutMs = -1
	}

	var health *healthWatch
	if sc.RelistThreshold > 0 {
		health = newHealthWatch(g, sc.RelistThreshold)
	}

	ops0 := counters(reg)
	simCPU0, err := drv.CPU()
	if err != nil {
		return nil, err
	}
	var (
		durs            []time.Duration
		cpu             time.Duration
		mallocs, bytes  uint64
		inspected       []int64
		lists           []time.Duration
		beyondList      time.Duration
		eventsTotal     int
		ms0, ms1        goruntime.MemStats
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
		if health != nil {
			health.check()
		}
		pr.inspected.Store(0)
		goruntime.ReadMemStats(&ms0)
		c0 := processCPU()
		t0 := time.Now()
		rerr := g.Relist(ctx)
		d := time.Since(t0)
		c1 := processCPU()
		goruntime.ReadMemStats(&ms1)
		if rerr != nil {
			res.RelistErrors++
		}
		durs = append(durs, d)
		pr.mu.Lock()
		l := pr.lastList
		pr.mu.Unlock()
		lists = append(lists, l)
		beyondList = max(beyondList, d-l)
		cpu += c1 - c0
		mallocs += ms1.Mallocs - ms0.Mallocs
		bytes += ms1.TotalAlloc - ms0.TotalAlloc
		inspected = append(inspected, pr.inspected.Load())
		eventsTotal += drain()
		if health != nil {
			health.relisted(l)
			health.check()
		}
		if sc.Pause > 0 && i < relists-1 {
			select {
			case <-time.After(sc.Pause):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}

	if health != nil {
		res.Health = health.result()
	}
	simCPU1, err := drv.CPU()
	if err != nil {
		return nil, err
	}
	ops1 := counters(reg)

	n := float64(relists)
	res.RelistMs = make([]float64, len(durs))
	for i, d := range durs {
		res.RelistMs[i] = ms(d)
	}
	res.RelistP50Ms = ms(Percentile(durs, 0.50))
	res.RelistP99Ms = ms(Percentile(durs, 0.99))
	res.RelistMaxMs = ms(slices.Max(durs))
	res.ListP50Ms = ms(Percentile(lists, 0.50))
	res.ListP99Ms = ms(Percentile(lists, 0.99))
	res.MaxBeyondListMs = ms(beyondList)
	res.CallsByOp = map[string]float64{}
	for op, v := range ops1.ops {
		if d := v - ops0.ops[op]; d > 0 {
			res.CallsByOp[op] = d / n
			res.CallsPerRelist += d / n
		}
	}
	res.InspectionTimeouts = ops1.timeouts - ops0.timeouts
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

// Percentile returns the nearest-rank percentile p (0 < p <= 1) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var errNoSerial = errors.New("needs the serial baseline (--serial)")

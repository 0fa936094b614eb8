package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/lineproto"
	"github.com/podlifecycle/pleg/internal/stats"
)

// Options configure a benchmark run.
type Options struct {
	// Scenarios to run; Scenarios() when empty.
	Scenarios []Scenario
	// Kubelet, when set, is the path of the kubelet-relist program
	// (test/kubelet/cmd/kubelet-relist: the kubelet v1.37.2's own
	// GenericPLEG, runtime manager and CRI client): every scenario driven
	// by hand then also runs with it, against an identical simulated node,
	// as the baseline, and so do the live scenarios' kubelet runs
	// (LiveRun.Kubelet; left out without it).
	Kubelet string
	// Quick uses the scenarios' small relist counts and the live
	// scenarios' short windows (for tests and smoke runs).
	Quick bool
	// Relists, when positive, overrides the number of measured relists of
	// every run driven by hand (kubelet runs with a hung pod use at most
	// 5).
	Relists int
	// MaxParallelInspections is pleg's inspection bound (0: the library's
	// default).
	MaxParallelInspections int
	// Budget is the hint budget of the live scenarios' generators (zero
	// fields: the library's defaults).
	Budget Budget
	// Executable is the pleg binary run as `<Executable> bench child
	// <role>` to serve the simulated runtime and pleg's generator in
	// processes of their own (see ServeChild); the running binary when
	// empty.
	Executable string
	// PLEGExecutable, when set, is the binary run as `<PLEGExecutable>
	// bench child pleg` for pleg's generator only (the simulated runtime
	// stays Executable's): another build of pleg, measured against the
	// same simulated node, e.g. an older commit's, to compare in one run.
	PLEGExecutable string
	// PlainMetadata gives the simulated node's sandboxes and containers
	// only the io.kubernetes.* labels pleg reads and three annotations,
	// as the bench did before 2026-11-28; by default they carry the
	// labels and annotations a kubelet puts on them
	// (sim.Config.KubeletMetadata), which are most of what pleg keeps
	// per pod.
	PlainMetadata bool
	// GCPercent is the garbage collector's target in pleg's process (the
	// daemon's, so that its peak RSS is the daemon's; 0: GOGC or Go's
	// default). The simulated runtime keeps Go's default.
	GCPercent int
	// CPUProfile, when set, is the file pleg's process writes a CPU
	// profile of its life to; each run writes it anew, the last one's
	// stays.
	CPUProfile string
	// HeapProfile, when set, is the file pleg's process writes a heap
	// profile to as it ends; each run writes it anew.
	HeapProfile string
	// Seed seeds the simulated runtime (0: 1).
	Seed uint64
	// CompareListStreaming runs pleg's column twice in every scenario
	// driven by hand: listing through the streaming RPCs (the pleg column)
	// and with the unary calls (ScenarioResult.PLEGUnary), each in a
	// process of its own, against identical simulated nodes. Otherwise
	// pleg's client is in its default mode (auto: it streams, the
	// simulator has the RPCs).
	CompareListStreaming bool
	// Progress, if not nil, receives one line per run as it starts.
	Progress io.Writer
}

// The roles of a run's children (ServeChild).
const (
	roleRuntime = "runtime"
	rolePLEG    = "pleg"
)

// ServeChild serves one child of a benchmark run on in and out, over the
// protocol of proto.go: role "runtime" the simulated runtime, "pleg" pleg's
// generator. `pleg bench child <role>` runs it, and so do this package's
// test binaries (their TestMain) when the bench starts them as children.
func ServeChild(role string, in io.Reader, out io.Writer) error {
	switch role {
	case roleRuntime:
		return serveRuntime(in, out)
	case rolePLEG:
		return servePLEG(in, out)
	}
	return fmt.Errorf("unknown role %q (want %s or %s)", role, roleRuntime, rolePLEG)
}

// startChild starts one of the run's children, `<Executable> bench child
// <role>`, bounded by ctx.
func startChild(ctx context.Context, o Options, role, what string, config any) (*lineproto.Child, string, error) {
	exe := o.Executable
	if role == rolePLEG && o.PLEGExecutable != "" {
		exe = o.PLEGExecutable
	}
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, "", fmt.Errorf("finding the running binary to run the %s: %w", what, err)
		}
	}
	return lineproto.Start(what, exec.CommandContext(ctx, exe, "bench", "child", role), config)
}

// startRuntime starts the simulated runtime; it answers ready with its
// endpoint.
func startRuntime(ctx context.Context, o Options, cfg simConfig) (*lineproto.Child, string, error) {
	cfg.Seed = o.Seed
	cfg.KubeletMetadata = !o.PlainMetadata
	return startChild(ctx, o, roleRuntime, "simulated runtime", cfg)
}

// startPLEG starts pleg's generator.
func startPLEG(ctx context.Context, o Options, cfg plegConfig) (*lineproto.Child, error) {
	cfg.GCPercent, cfg.CPUProfile, cfg.HeapProfile = o.GCPercent, o.CPUProfile, o.HeapProfile
	c, _, err := startChild(ctx, o, rolePLEG, "pleg's generator", cfg)
	return c, err
}

// closeWith closes c at the end of a function returning *err, keeping the
// first error.
func closeWith(c *lineproto.Child, err *error) {
	if cerr := c.Close(); *err == nil {
		*err = cerr
	}
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
			for _, run := range sc.Live.runs(o.Kubelet != "") {
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "pleg bench: %s: live, %s...\n", sc.Name, run.Name)
				}
				r, err := runLive(ctx, o, sc, run)
				if err != nil {
					return nil, fmt.Errorf("scenario %s (%s): %w", sc.Name, run.Name, err)
				}
				res.Live = append(res.Live, r)
			}
			res.Targets = evaluateLive(sc, res.Live)
			rep.Scenarios = append(rep.Scenarios, res)
			continue
		}
		cols := []column{plegColumn(sc, o.MaxParallelInspections)}
		if o.CompareListStreaming {
			cols[0].listStreaming = "on"
			unary := cols[0]
			unary.listStreaming = "off"
			cols = append(cols, unary)
		}
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
			switch {
			case col.kubelet:
				res.Kubelet = run
			case col.listStreaming == "off":
				res.PLEGUnary = run
			default:
				res.PLEG = run
			}
		}
		res.Targets = evaluate(sc, res.PLEG, res.Kubelet)
		rep.Scenarios = append(rep.Scenarios, res)
	}
	return rep, nil
}

// column is one generator a scenario driven by hand runs with.
type column struct {
	// kubelet: the kubelet's own relist (Options.Kubelet), one pod after
	// another, each waited for as long as the runtime request timeout
	// allows.
	kubelet           bool
	parallel          int           // pleg's MaxParallelInspections as set
	inspectionTimeout time.Duration // pleg's, as set; negative: none
	listStreaming     string        // pleg's CRI client's mode ("": auto)
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
	switch {
	case c.kubelet:
		return "kubelet"
	case c.listStreaming == "on":
		return "pleg (streamed lists)"
	case c.listStreaming == "off":
		return "pleg (unary lists)"
	}
	return "pleg"
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

// warmUp runs the warm-up relists of a generator driven by hand (gen
// answers relist),
// on a node of pods pods, and returns how many it ran.
func warmUp(gen *lineproto.Child, pods int) (int, error) {
	var warm int64
	i := 1
	for ; ; i++ {
		var r relistResult
		if err := gen.CallJSON(&r, "relist"); err != nil {
			return i, fmt.Errorf("warm-up relist: %w", err)
		}
		n := inspectedBy(&r)
		warm += n
		if i >= warmupRelists && n == 0 {
			break
		}
		if i == maxWarmupRelists {
			return i, fmt.Errorf("warm-up relist %d still inspected %d pods", i, n)
		}
	}
	// Every pod is new to the generator: each is inspected at least once.
	if warm < int64(pods) {
		return i, fmt.Errorf("warm-up relists inspected %d pods, want at least %d", warm, pods)
	}
	return i, nil
}

// runOne measures relists relists of one scenario with one column, against
// a fresh simulated runtime.
func runOne(ctx context.Context, o Options, sc Scenario, col column, relists int) (_ *RunResult, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rt, endpoint, err := startRuntime(ctx, o, simConfig{Pods: sc.Pods, Containers: sc.Containers})
	if err != nil {
		return nil, err
	}
	defer closeWith(rt, &err)
	var gen *lineproto.Child
	if col.kubelet {
		gen, _, err = lineproto.Start("kubelet relister", exec.CommandContext(ctx, o.Kubelet,
			"--endpoint", endpoint, "--runtime-request-timeout", sc.RequestTimeout.String()), nil)
	} else {
		// Driven by hand, the generator never waits a period; the
		// options must hold all the same (the threshold above it).
		gen, err = startPLEG(ctx, o, plegConfig{
			Endpoint: endpoint, RequestTimeout: sc.RequestTimeout, Parallel: col.parallel,
			InspectionTimeout: col.inspectionTimeout, RelistThreshold: sc.RelistThreshold, RelistPeriod: sc.Pause,
			ListStreaming: col.listStreaming,
		})
	}
	if err != nil {
		return nil, err
	}
	defer closeWith(gen, &err)
	relist := func() (*relistResult, error) {
		var r relistResult
		return &r, gen.CallJSON(&r, "relist")
	}

	if _, err := warmUp(gen, sc.Pods); err != nil {
		return nil, err
	}
	if sc.Latency > 0 {
		if _, err := rt.Call("latency %v", sc.Latency); err != nil {
			return nil, err
		}
	}
	for range sc.HungPods {
		if _, err := rt.Call("hang"); err != nil {
			return nil, err
		}
	}
	watches := !col.kubelet && sc.RelistThreshold > 0
	if watches {
		if _, err := gen.Call("watch"); err != nil {
			return nil, err
		}
	}
	simCPU0, err := rt.CallInt("cpu")
	if err != nil {
		return nil, err
	}
	var calls0 map[string]int64
	if err := rt.CallJSON(&calls0, "calls"); err != nil {
		return nil, err
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
	var (
		durs, lists    []time.Duration
		cpu            time.Duration
		mallocs, bytes uint64
		inspected      []int64
		beyondList     time.Duration
		events         int
		calls          = map[string]float64{}
	)
	for i := range relists {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if sc.Changed > 0 {
			n, err := rt.CallInt("change %d", sc.Changed)
			if err != nil {
				return nil, err
			}
			if n != int64(sc.Changed) {
				return nil, fmt.Errorf("changed %d pods, want %d", n, sc.Changed)
			}
		}
		r, err := relist()
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
		events += r.Events
		res.DiscardedEvents += r.Discarded
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

	if watches {
		if err := gen.CallJSON(&res.Health, "health"); err != nil {
			return nil, err
		}
	}
	if res.PeakRSSBytes, err = gen.CallInt("rss"); err != nil {
		return nil, err
	}
	res.ResidentFileBytes, res.ListFloorCPUMs, res.ListBytes = -1, -1, -1
	if !col.kubelet {
		if res.ResidentFileBytes, err = gen.CallInt("rssfile"); err != nil {
			return nil, err
		}
	}
	simCPU1, err := rt.CallInt("cpu")
	if err != nil {
		return nil, err
	}
	var calls1 map[string]int64
	if err := rt.CallJSON(&calls1, "calls"); err != nil {
		return nil, err
	}
	if !col.kubelet && sc.Changed == 0 && sc.HungPods == 0 && cpuMeasured {
		// After the relists, so that the simulator's CPU above is theirs.
		var f floorResult
		if err := gen.CallJSON(&f, "floor %d", relists); err != nil {
			return nil, err
		}
		res.ListFloorCPUMs, res.ListBytes = ms(time.Duration(f.CPUNs)), f.Bytes
	}

	n := float64(relists)
	for _, d := range durs {
		res.RelistMs = append(res.RelistMs, ms(d))
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
	res.ListRPCs = map[string]float64{}
	for _, m := range listMethods {
		if d := calls1[m] - calls0[m]; d > 0 {
			res.ListRPCs[m] = float64(d) / n
		}
	}
	res.CallsByOp = map[string]float64{}
	for op, v := range calls {
		res.CallsByOp[op] = v / n
		res.CallsPerRelist += v / n
	}
	var sum int64
	for _, v := range inspected {
		sum += v
	}
	res.InspectedMin, res.InspectedMax = slices.Min(inspected), slices.Max(inspected)
	res.PodsInspectedPerRelist = float64(sum) / n
	if sc.HungPods == 0 {
		want := int64(sc.Changed)
		res.InspectedAsChanged = res.InspectedMin == want && res.InspectedMax == want
	}
	res.EventsPerRelist = float64(events) / n
	res.CPUPerRelistMs = -1
	if cpuMeasured {
		res.CPUPerRelistMs = ms(cpu) / n
	}
	res.AllocsPerRelist = float64(mallocs) / n
	res.AllocBytesPerRelist = float64(bytes) / n
	res.SimCPUPerRelistMs = -1
	if simCPU0 >= 0 && cpuMeasured {
		res.SimCPUPerRelistMs = ms(time.Duration(simCPU1-simCPU0)) / n
	}
	return res, nil
}

// listMethods are the CRI methods that list a node's sandboxes and
// containers: unary and streamed (KEP-5825).
var listMethods = []string{"ListPodSandbox", "ListContainers", "StreamPodSandboxes", "StreamContainers"}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var errNoKubelet = errors.New("needs the kubelet baseline (--kubelet)")

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Report is the result of a benchmark run.
type Report struct {
	Date       time.Time `json:"date"`
	GoVersion  string    `json:"goVersion"`
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	CPUModel   string    `json:"cpuModel"`
	NumCPU     int       `json:"numCPU"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	// Notes say what the figures include and how the run was driven.
	Notes     []string         `json:"notes"`
	Scenarios []ScenarioResult `json:"scenarios"`
}

// ScenarioResult holds the runs of one scenario.
type ScenarioResult struct {
	Scenario    Scenario   `json:"scenario"`
	Description string     `json:"description"`
	PLEG        *RunResult `json:"pleg,omitempty"`
	// Kubelet is the kubelet v1.37.2's own relist, measured in the same
	// run (Options.Kubelet).
	Kubelet *RunResult `json:"kubelet,omitempty"`
	// PLEGUnary is pleg listing with the unary calls, when the run
	// compares list streaming (Options.CompareListStreaming; PLEG then
	// streams).
	PLEGUnary *RunResult `json:"plegUnary,omitempty"`
	// Live holds the runs of a live scenario (instead of PLEG and
	// Kubelet), the baseline first.
	Live    []*LiveResult `json:"live,omitempty"`
	Targets []Target      `json:"targets,omitempty"`
}

// RunResult holds the figures of one run (one algorithm). Times are in
// milliseconds; per-relist figures are averages over the measured relists.
type RunResult struct {
	Algorithm              string  `json:"algorithm"` // "pleg" or "kubelet"
	MaxParallelInspections int     `json:"maxParallelInspections"`
	PodInspectionTimeoutMs float64 `json:"podInspectionTimeoutMs"` // -1: disabled
	RequestTimeoutMs       float64 `json:"runtimeRequestTimeoutMs"`
	Relists                int     `json:"relists"`
	RelistErrors           int     `json:"relistErrors"`

	// RelistMs is the wall time of every measured Generator.Relist call.
	RelistMs    []float64 `json:"relistMs"`
	RelistP50Ms float64   `json:"relistP50Ms"`
	RelistP99Ms float64   `json:"relistP99Ms"`
	RelistMaxMs float64   `json:"relistMaxMs"`
	// ListP50Ms and ListP99Ms are the durations of the generator's
	// listing (ListPodSandbox then ListContainers): one list round trip;
	// -1 for the kubelet (not measured).
	ListP50Ms float64 `json:"listP50Ms"`
	ListP99Ms float64 `json:"listP99Ms"`
	// MaxBeyondListMs is the longest time a relist took beyond its own
	// listing (relist duration minus that relist's list round trip); -1
	// for the kubelet.
	MaxBeyondListMs float64 `json:"maxBeyondListMs"`

	// CallsPerRelist counts kubelet_runtime_operations_total (the CRI
	// client's own counters), CallsByOp by operation_type.
	CallsPerRelist float64            `json:"runtimeCallsPerRelist"`
	CallsByOp      map[string]float64 `json:"runtimeCallsPerRelistByOp"`
	// ListRPCs is the list calls the simulated runtime received per
	// measured relist, by CRI method (ListPodSandbox and ListContainers,
	// or the streamed StreamPodSandboxes and StreamContainers): which of
	// them the generator listed through.
	ListRPCs map[string]float64 `json:"listRpcsPerRelist,omitempty"`
	// PodsInspectedPerRelist counts pod status fetches that reached the
	// runtime client (for the kubelet: its PodSandboxStatus calls, one per
	// inspected simulated pod); InspectedMin and InspectedMax bound it per
	// relist.
	PodsInspectedPerRelist float64 `json:"podsInspectedPerRelist"`
	InspectedMin           int64   `json:"podsInspectedMin"`
	InspectedMax           int64   `json:"podsInspectedMax"`
	// InspectedAsChanged is true when every relist inspected exactly the
	// scenario's number of changed pods (scenarios without a hung pod).
	InspectedAsChanged bool    `json:"podsInspectedAsChanged"`
	EventsPerRelist    float64 `json:"eventsPerRelist"`
	// DiscardedEvents counts events the generator dropped in the measured
	// relists (the kubelet's event channel full).
	DiscardedEvents    float64 `json:"discardedEvents"`
	InspectionTimeouts float64 `json:"podInspectionTimeouts"`

	// CPUPerRelistMs is the generator process's CPU time (user + system,
	// all threads) during the relists; -1 when not measured.
	CPUPerRelistMs float64 `json:"cpuPerRelistMs"`
	// AllocsPerRelist and AllocBytesPerRelist are the generator process's
	// heap allocations (runtime.MemStats Mallocs and TotalAlloc) during
	// the relists.
	AllocsPerRelist     float64 `json:"allocsPerRelist"`
	AllocBytesPerRelist float64 `json:"allocBytesPerRelist"`
	// SimCPUPerRelistMs is the simulated runtime's CPU time per relist
	// when it runs in a child process (not included above; it includes
	// applying the changes between relists); -1 otherwise.
	SimCPUPerRelistMs float64 `json:"simulatedRuntimeCpuPerRelistMs"`
	// ListFloorCPUMs is the CPU time of a listing's two calls made bare,
	// their replies discarded undecoded, in pleg's process after its
	// relists (cri.Client.ListDiscard): the transport's floor under an
	// idle relist, which no decoding can go below. ListBytes is the size
	// of both replies. -1 where not measured (the kubelet's column, and
	// scenarios where pods change).
	ListFloorCPUMs float64 `json:"bareListCallsCpuMs"`
	ListBytes      int     `json:"listReplyBytes"`
	// PeakRSSBytes is the generator process's peak resident set size
	// (VmHWM) at the end of the run, warm-up included.
	PeakRSSBytes int64 `json:"peakRssBytes"`
	// ResidentFileBytes is the part of pleg's resident set mapped from
	// files at the end of the run (RssFile): the binary's pages, shared
	// and reclaimable, which the peak includes; -1 where not measured.
	ResidentFileBytes int64 `json:"residentFileBytes"`

	Health *HealthResult `json:"health,omitempty"`
}

// HealthResult is what Healthy said during the measured relists.
type HealthResult struct {
	ThresholdMs      float64 `json:"relistThresholdMs"`
	Samples          int     `json:"samples"`
	UnhealthySamples int     `json:"unhealthySamples"`
	// LongestWithoutMs is the longest time without a successful relist
	// start, from the health timestamps.
	LongestWithoutMs  float64 `json:"longestWithoutRelistMs"`
	HealthyThroughout bool    `json:"healthyThroughout"`
	FirstError        string  `json:"firstError,omitempty"`
}

// Target is one of the project's performance targets, checked against this
// run.
type Target struct {
	Goal    string `json:"goal"`
	Figure  string `json:"figure"`
	Checked bool   `json:"checked"`
	Met     bool   `json:"met"`
}

// mib is a mebibyte.
const mib = 1 << 20

// ratioTarget checks p <= k*limit (limit a fraction such as 1/5) for one
// figure of a scenario, pleg p against the kubelet k.
func ratioTarget(goal, unit string, p, k float64, limit float64, f func(float64) string) Target {
	t := Target{Goal: goal}
	switch {
	case k <= 0:
		t.Figure = errNoKubelet.Error()
		return t
	case p < 0:
		t.Figure = unit + " not measured"
		return t
	}
	r := p / k
	t.Checked, t.Met = true, r <= limit
	t.Figure = fmt.Sprintf("pleg %s / kubelet %s = %.3f (1/%.1f)", f(p), f(k), r, 1/r)
	return t
}

// withFloor adds to an idle relist's CPU target what the bare list calls
// cost (RunResult.ListFloorCPUMs) against the kubelet's CPU k: a ratio
// below theirs is out of reach of any client of the same transport.
func withFloor(t Target, p *RunResult, k float64) Target {
	if p.ListFloorCPUMs < 0 || k <= 0 || !t.Checked {
		return t
	}
	t.Figure += fmt.Sprintf("; the bare list calls alone %s = %.3f of the kubelet's, pleg's decoding and diff %s",
		fmtMs(p.ListFloorCPUMs), p.ListFloorCPUMs/k, fmtMs(p.CPUPerRelistMs-p.ListFloorCPUMs))
	return t
}

// rssTarget checks pleg's peak RSS against a bound.
func rssTarget(p *RunResult, limit float64) Target {
	t := Target{Goal: fmt.Sprintf("pleg's peak RSS at most %s", fmtBytes(limit)), Checked: true}
	t.Met = float64(p.PeakRSSBytes) <= limit
	t.Figure = fmtBytes(float64(p.PeakRSSBytes))
	if p.ResidentFileBytes > 0 {
		t.Figure += fmt.Sprintf(", of which the binary's pages %s at the end", fmtBytes(float64(p.ResidentFileBytes)))
	}
	return t
}

// evaluate checks the targets of a standard scenario, pleg p against the
// kubelet k (nil without the baseline).
func evaluate(sc Scenario, p, k *RunResult) []Target {
	kv := func(f func(*RunResult) float64) float64 {
		if k == nil {
			return 0
		}
		return f(k)
	}
	calls := func(r *RunResult) float64 { return r.CallsPerRelist }
	p50 := func(r *RunResult) float64 { return r.RelistP50Ms }
	cpu := func(r *RunResult) float64 { return r.CPUPerRelistMs }
	switch sc.Name {
	case "500x10":
		return []Target{
			ratioTarget("runtime calls per relist at most 1/5 of the kubelet's", "calls", calls(p), kv(calls), 1.0/5, fmtCount),
			ratioTarget("relist p50 at most 1/20 of the kubelet's", "relist time", p50(p), kv(p50), 1.0/20, fmtMs),
		}
	case "1000x10-idle":
		return []Target{
			withFloor(ratioTarget("CPU per relist at most 1/10 of the kubelet's", "CPU time", cpu(p), kv(cpu), 1.0/10, fmtMs), p, kv(cpu)),
			rssTarget(p, 40*mib),
		}
	case "110x5-idle":
		return []Target{
			withFloor(ratioTarget("CPU per relist at most 1/10 of the kubelet's", "CPU time", cpu(p), kv(cpu), 1.0/10, fmtMs), p, kv(cpu)),
			rssTarget(p, 20*mib),
		}
	case "110x5-hung":
		bound := p.PodInspectionTimeoutMs + p.ListP99Ms
		t1 := Target{
			Goal:    "relist p99 at most the pod inspection timeout plus one list round trip",
			Checked: true, Met: p.RelistP99Ms <= bound,
			Figure: fmt.Sprintf("p99 %s <= %s + %s (list p99) = %s; the slowest relist took %s beyond its own listing",
				fmtMs(p.RelistP99Ms), fmtMs(p.PodInspectionTimeoutMs), fmtMs(p.ListP99Ms), fmtMs(bound), fmtMs(p.MaxBeyondListMs)),
		}
		if !t1.Met {
			t1.Figure = strings.Replace(t1.Figure, "<=", ">", 1)
		}
		t2 := Target{Goal: "health stays true the whole time"}
		if p.Health != nil {
			t2.Checked, t2.Met = true, p.Health.HealthyThroughout
			t2.Figure = fmt.Sprintf("longest without a relist %s, threshold %s; Healthy() false %d of %d times (before and after every relist)",
				fmtMs(p.Health.LongestWithoutMs), fmtMs(p.Health.ThresholdMs), p.Health.UnhealthySamples, p.Health.Samples)
		}
		return []Target{t1, t2}
	}
	return nil
}

func newReport(o Options) *Report {
	r := &Report{
		Date:       time.Now().UTC().Truncate(time.Second),
		GoVersion:  goruntime.Version(),
		OS:         goruntime.GOOS,
		Arch:       goruntime.GOARCH,
		CPUModel:   cpuModel(),
		NumCPU:     goruntime.NumCPU(),
		GOMAXPROCS: goruntime.GOMAXPROCS(0),
		Notes:      []string{"The simulated CRI runtime (cruntime/sim, real gRPC on a unix socket) runs in a child process, and each generator in a process of its own: CPU time, allocations and peak RSS are that process's own (generator, CRI client, Go runtime and GC), CPU and allocations measured around each relist; the simulator's CPU is shown apart."},
	}
	driven, live, idle := false, false, false
	for _, sc := range o.Scenarios {
		switch {
		case sc.Live != nil && sc.Live.Idle:
			idle = true
		case sc.Live != nil:
			live = true
		default:
			driven = true
		}
	}
	if driven {
		r.Notes = append(r.Notes,
			fmt.Sprintf("Relists are driven by hand (Generator.Relist) after %d warm-up relists without latency (more while one still inspects a pod); between two relists exactly N pods change (one container restarted with a new ID, its old attempt removed: 3 events; the kubelet's GetPodStatus then makes 1+C status calls for the pod, pleg's delta inspection fetches the changed items only).", warmupRelists),
			"pleg: the library (bounded parallel inspection, pod inspection timeout). kubelet: the kubelet v1.37.2's own GenericPLEG.Relist over its kuberuntime manager and CRI client (the kubelet-relist program, --kubelet), same run, identical simulated node, same changes.",
			"ratio = pleg / kubelet. Percentiles are nearest-rank over the measured relists.")
	}
	if live {
		r.Notes = append(r.Notes,
			"Live scenarios run a started generator (Generator.Start: real clock, relist goroutine) for a wall-time window after its warm-up; the relist figures are those of Generator.RecentRelists whose start falls in the window, Healthy() is checked every "+healthEvery.String()+", runtime calls are those the simulated runtime received, CPU is per second of the window. Percentiles are nearest-rank. They have no kubelet baseline (the kubelet makes no single-pod relists from runtime events): where a scenario has several runs, the first is its baseline and ratio = run / baseline. A run with the adaptive global relist (MaxRelistPeriod) starts its window once the period has grown to its maximum.")
	}
	if idle {
		r.Notes = append(r.Notes,
			"Idle scenarios run each relister started, on its own clock, on a node where nothing changes: the kubelet v1.37.2's PLEG (the kubelet-relist program, --kubelet: GenericPLEG.Start, a relist every period after the end of the last; its warm-up relists by hand), pleg with its period fixed and with the adaptive global relist (its window starts once the period has grown to its maximum, two minutes after its stream connected at 30s), each pleg run with the daemon's readiness check (a CRI Status call every 5s; while the adaptive relist is stretched, as rarely as it, at most every 10s). Every CRI call the simulated runtime received in the window is counted (the bench's own commands go over the children's line protocols, not CRI); CPU is each process's own per second of the window; ratio = run / the kubelet's.")
	}
	return r
}

// cpuModel returns the CPU model from /proc/cpuinfo, or GOARCH.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return goruntime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return goruntime.GOARCH
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as one table per scenario.
func (r *Report) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "pleg bench  %s  %s/%s  %s  %s (%d CPUs, GOMAXPROCS %d)\n",
		r.Date.Format(time.RFC3339), r.OS, r.Arch, r.GoVersion, r.CPUModel, r.NumCPU, r.GOMAXPROCS)
	for _, n := range r.Notes {
		fmt.Fprintf(bw, "  %s\n", n)
	}
	for _, s := range r.Scenarios {
		writeScenario(bw, s)
	}
	return bw.Flush()
}

func writeScenario(w io.Writer, s ScenarioResult) {
	if s.Live != nil {
		if s.Scenario.Live != nil && s.Scenario.Live.Idle {
			writeIdle(w, s)
		} else {
			writeLive(w, s)
		}
		return
	}
	p, b := s.PLEG, s.Kubelet
	fmt.Fprintf(w, "\n== %s: %s\n", s.Scenario.Name, s.Description)
	line := fmt.Sprintf("   runtime request timeout %s; pleg: MaxParallelInspections %d, pod inspection timeout %s",
		fmtMs(p.RequestTimeoutMs), p.MaxParallelInspections, fmtMs(p.PodInspectionTimeoutMs))
	if s.Scenario.RelistThreshold > 0 {
		line += fmt.Sprintf("; relist threshold %s", fmtMs(ms(s.Scenario.RelistThreshold)))
	}
	if s.Scenario.Pause > 0 {
		line += fmt.Sprintf("; %s between relists", fmtMs(ms(s.Scenario.Pause)))
	}
	fmt.Fprintln(w, line)
	runs, heads, ratios := []*RunResult{p}, []string{"pleg"}, map[int][2]int(nil)
	if b != nil {
		runs, heads, ratios = append(runs, b), append(heads, "kubelet v1.37.2"), map[int][2]int{1: {0, 1}}
		fmt.Fprintf(w, "   measured relists: pleg %d, kubelet %d\n", p.Relists, b.Relists)
	} else {
		fmt.Fprintf(w, "   measured relists: pleg %d (no kubelet baseline: --kubelet names the kubelet-relist program)\n", p.Relists)
	}

	// Every run, the unary lists' included: their checks and warnings.
	all := slices.Clip(runs)
	if u := s.PLEGUnary; u != nil {
		all = append(all, u)
	}

	f := newFigures(heads, ratios)
	get := func(g func(*RunResult) float64) []float64 { return each(runs, g) }
	f.row("relist p50", fmtMs, true, get(func(r *RunResult) float64 { return r.RelistP50Ms }))
	f.row("relist p99", fmtMs, true, get(func(r *RunResult) float64 { return r.RelistP99Ms }))
	f.row("  list round trip p50", fmtMs, true, get(func(r *RunResult) float64 { return r.ListP50Ms }))
	f.row("runtime calls / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.CallsPerRelist }))
	for _, op := range []string{"list_podsandbox", "list_containers", "podsandbox_status", "container_status"} {
		if v := get(func(r *RunResult) float64 { return r.CallsByOp[op] }); anyPositive(v) {
			f.row("  "+op, fmtCount, true, v)
		}
	}
	f.row("pods inspected / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.PodsInspectedPerRelist }))
	f.row("events / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.EventsPerRelist }))
	if v := get(func(r *RunResult) float64 { return r.DiscardedEvents }); anyPositive(v) {
		f.row("events discarded (channel full)", fmtCount, false, v)
	}
	f.row("CPU / relist", fmtMs, true, get(func(r *RunResult) float64 { return r.CPUPerRelistMs }))
	if p.ListFloorCPUMs >= 0 {
		name, v := fmt.Sprintf("  the bare list calls (%s)", fmtBytes(float64(p.ListBytes))), fmtMs(p.ListFloorCPUMs)
		if b == nil {
			f.text(name, v)
		} else {
			r := "-"
			if b.CPUPerRelistMs > 0 {
				r = fmt.Sprintf("%.2f", p.ListFloorCPUMs/b.CPUPerRelistMs)
			}
			f.text(name, v, "-", r)
		}
	}
	f.row("allocations / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.AllocsPerRelist }))
	f.row("bytes allocated / relist", fmtBytes, true, get(func(r *RunResult) float64 { return r.AllocBytesPerRelist }))
	f.row("peak RSS (VmHWM)", fmtBytes, true, get(func(r *RunResult) float64 { return float64(r.PeakRSSBytes) }))
	if p.ResidentFileBytes >= 0 {
		f.text("  the binary's pages (RssFile, at the end)", fmtBytes(float64(p.ResidentFileBytes)), "-", "-")
	}
	if p.SimCPUPerRelistMs >= 0 {
		f.row("(simulator CPU / relist)", fmtMs, false, get(func(r *RunResult) float64 { return r.SimCPUPerRelistMs }))
	}
	if v := get(func(r *RunResult) float64 { return r.InspectionTimeouts }); anyPositive(v) {
		f.row("pod inspection timeouts", fmtCount, false, v)
	}
	if p.Health != nil {
		f.row("longest without a relist", fmtMs, true, get(func(r *RunResult) float64 {
			if r.Health == nil {
				return -1
			}
			return r.Health.LongestWithoutMs
		}))
		unhealthy, whole := []string{}, []string{}
		for _, r := range runs {
			unhealthy, whole = append(unhealthy, "-"), append(whole, "-")
			if h := r.Health; h != nil {
				unhealthy[len(unhealthy)-1] = fmt.Sprintf("%d of %d", h.UnhealthySamples, h.Samples)
				whole[len(whole)-1] = yesNo(h.HealthyThroughout)
			}
		}
		f.text("Healthy() false (checks)", append(unhealthy, "-")...)
		f.text("healthy the whole time", append(whole, "-")...)
	}
	f.t.write(w, "   ")
	if u := s.PLEGUnary; u != nil {
		writeStreamVsUnary(w, p, u)
	}

	if s.Scenario.Changed > 0 {
		var checks []string
		for _, r := range all {
			if r.InspectedAsChanged {
				checks = append(checks, fmt.Sprintf("%s: every relist inspected exactly %d pods", r.Algorithm, s.Scenario.Changed))
			} else {
				checks = append(checks, fmt.Sprintf("%s: WARNING: relists inspected %d to %d pods, want %d", r.Algorithm, r.InspectedMin, r.InspectedMax, s.Scenario.Changed))
			}
		}
		fmt.Fprintf(w, "   check: %s\n", strings.Join(checks, "; "))
	}
	for _, r := range all {
		if r.RelistErrors > 0 {
			fmt.Fprintf(w, "   WARNING: %s: %d relists failed to list\n", r.Algorithm, r.RelistErrors)
		}
	}
	writeTargets(w, s.Targets)
}

func writeTargets(w io.Writer, targets []Target) {
	for _, t := range targets {
		verdict := "not checked"
		if t.Checked {
			verdict = "MET"
			if !t.Met {
				verdict = "NOT MET"
			}
		}
		fmt.Fprintf(w, "   target: %s: %s  [%s]\n", t.Goal, t.Figure, verdict)
	}
}

// writeLive writes the table of a live scenario: one column per run, and
// each run after the first beside its ratio to the first.
func writeLive(w io.Writer, s ScenarioResult) {
	runs, r0 := s.Live, s.Live[0]
	fmt.Fprintf(w, "\n== %s: %s\n", s.Scenario.Name, s.Description)
	fmt.Fprintf(w, "   live: Generator.Start (real clock, relist goroutine) measured for %s after its first %d relists (startup %s, not measured)\n",
		fmtMs(r0.WindowMs), r0.WarmupRelists, fmtMs(r0.StartupMs))
	fmt.Fprintf(w, "   relist period %s; pod inspection timeout %s; runtime request timeout %s; relist threshold %s; MaxParallelInspections %d\n",
		fmtMs(r0.RelistPeriodMs), fmtMs(r0.PodInspectionTimeoutMs), fmtMs(r0.RequestTimeoutMs), fmtMs(r0.RelistThresholdMs), r0.MaxParallelInspections)
	fmt.Fprintln(w, "   kubelet: not applicable: the kubelet makes no single-pod relists from runtime events, so it has no baseline here")
	f := liveFigures(runs)
	get := func(g func(*LiveResult) float64) []float64 { return each(runs, g) }
	texts := func(g func(*LiveResult) string) []string {
		var out []string
		for i, r := range runs {
			out = append(out, g(r))
			if i > 0 {
				out = append(out, "-")
			}
		}
		return out
	}
	f.text("global relists in the window", texts(func(r *LiveResult) string { return fmt.Sprintf("%d (%d failed)", r.Relists, r.RelistErrors) })...)
	f.row("relist interval p50 (start to start)", fmtMs, true, get(func(r *LiveResult) float64 { return r.IntervalP50Ms }))
	f.row("relist interval p99", fmtMs, true, get(func(r *LiveResult) float64 { return r.IntervalP99Ms }))
	f.row("relist interval max", fmtMs, true, get(func(r *LiveResult) float64 { return r.IntervalMaxMs }))
	f.row("relist p50", fmtMs, true, get(func(r *LiveResult) float64 { return r.RelistP50Ms }))
	f.row("relist p99", fmtMs, true, get(func(r *LiveResult) float64 { return r.RelistP99Ms }))
	f.row("relist max", fmtMs, true, get(func(r *LiveResult) float64 { return r.RelistMaxMs }))
	f.text("  list round trip p50 / p99", texts(func(r *LiveResult) string { return fmtMs(r.ListP50Ms) + " / " + fmtMs(r.ListP99Ms) })...)
	f.text(fmt.Sprintf("Healthy() false (checks every %v)", healthEvery), texts(func(r *LiveResult) string { return fmt.Sprintf("%d of %d", r.Unhealthy, r.HealthChecks) })...)
	f.text("event stream connected throughout", texts(func(r *LiveResult) string {
		if !r.Events {
			return "off"
		}
		return yesNo(r.StreamConnected)
	})...)
	f.text("runtime events emitted / received", texts(func(r *LiveResult) string {
		return fmtCount(float64(r.EventsEmitted)) + " / " + fmtCount(float64(r.EventsReceived))
	})...)
	if v := get(func(r *LiveResult) float64 { return float64(r.EventsDropped) }); anyPositive(v) {
		f.row("  dropped by the runtime (stream behind)", fmtCount, false, v)
	}
	if v := get(func(r *LiveResult) float64 { return float64(r.EventsDelivered) }); anyPositive(v) {
		f.row("pleg events delivered", fmtCount, true, v)
	}
	f.row("runtime calls / second (received)", fmtCount, true, get(func(r *LiveResult) float64 { return r.RuntimeCallsPerSecond }))
	for _, m := range []string{"ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus"} {
		if v := get(func(r *LiveResult) float64 { return float64(r.RuntimeCalls[m]) / (r.WindowMs / 1000) }); anyPositive(v) {
			f.row("  "+m, fmtCount, true, v)
		}
	}
	if v := get(func(r *LiveResult) float64 { return r.CPUPerSecondMs }); anyPositive(v) {
		f.row("pleg CPU / second", fmtMs, true, v)
		f.row("(simulator CPU / second)", fmtMs, true, get(func(r *LiveResult) float64 { return r.RuntimeCPUPerSecondMs }))
	}
	if v := get(func(r *LiveResult) float64 { return float64(r.Watchers) }); anyPositive(v) {
		f.row("lifecycle API watchers", fmtCount, true, v)
		f.row("  messages they received in the window", fmtCount, true, get(func(r *LiveResult) float64 { return float64(r.WatcherMessages) }))
	}
	if v := get(func(r *LiveResult) float64 { return float64(r.PeakRSSBytes) }); anyPositive(v) {
		f.row("pleg's RSS at the window's end (VmRSS)", fmtBytes, true, get(func(r *LiveResult) float64 { return float64(r.RSSBytes) }))
		f.row("pleg's peak RSS (VmHWM)", fmtBytes, true, v)
		f.row("pleg's goroutines at the window's end", fmtCount, true, get(func(r *LiveResult) float64 { return float64(r.Goroutines) }))
		f.row("  their stacks (StackInuse)", fmtBytes, true, get(func(r *LiveResult) float64 { return float64(r.StackBytes) }))
		f.row("  the heap's spans in use (HeapInuse)", fmtBytes, true, get(func(r *LiveResult) float64 { return float64(r.HeapInuseBytes) }))
	}
	f.row("single-pod lists (ListPod)", fmtCount, true, get(func(r *LiveResult) float64 { return float64(r.PodLists) }))
	f.row("pod status fetches (ItemStatuses)", fmtCount, true, get(func(r *LiveResult) float64 { return float64(r.PodStatuses) }))
	for _, what := range []struct {
		name string
		m    func(*LiveResult) map[string]float64
	}{
		{"pod relist requests skipped: ", func(r *LiveResult) map[string]float64 { return r.Skipped }},
		{"pod relist requests deferred: ", func(r *LiveResult) map[string]float64 { return r.Deferred }},
	} {
		reasons := map[string]bool{}
		for _, r := range runs {
			for k := range what.m(r) {
				reasons[k] = true
			}
		}
		for _, reason := range slices.Sorted(maps.Keys(reasons)) {
			f.row(what.name+reason, fmtCount, true, get(func(r *LiveResult) float64 { return what.m(r)[reason] }))
		}
	}
	if v := get(func(r *LiveResult) float64 { return r.EarlyRelists }); anyPositive(v) {
		f.row("early global relists", fmtCount, true, v)
	}
	if v := get(func(r *LiveResult) float64 { return r.QueueDropped }); anyPositive(v) {
		f.row("pod relist requests dropped (queue full)", fmtCount, true, v)
	}
	f.row("pod inspection timeouts", fmtCount, true, get(func(r *LiveResult) float64 { return r.InspectionTimeouts }))
	if v := get(func(r *LiveResult) float64 { return float64(r.ChurnedPods) }); anyPositive(v) {
		f.row("pods changed by the churn", fmtCount, true, v)
	}
	if r0.Changes > 0 {
		f.text("changes delivered", texts(func(r *LiveResult) string { return strconv.Itoa(r.Changes) })...)
		f.row("  delivery p50 (change to event)", fmtMs, true, get(func(r *LiveResult) float64 { return r.LatencyP50Ms }))
		f.row("  delivery p99", fmtMs, true, get(func(r *LiveResult) float64 { return r.LatencyP99Ms }))
		f.row("  delivery max", fmtMs, true, get(func(r *LiveResult) float64 { return r.LatencyMaxMs }))
	}
	if r0.HungPod != "" {
		f.text("hung pod: ListPod / ItemStatuses by pleg", texts(func(r *LiveResult) string { return fmt.Sprintf("%d / %d", r.HungPodLists, r.HungPodStatuses) })...)
		f.text("hung pod: runtime calls received (window)", texts(func(r *LiveResult) string { return fmtCalls(r.HungCallsWindow) })...)
		f.text("hung pod: runtime calls received (whole run)", texts(func(r *LiveResult) string { return fmtCalls(r.HungCallsRun) })...)
	}
	f.t.write(w, "   ")
	if r0.HungPod != "" {
		fmt.Fprintf(w, "   hung pod %s\n", r0.HungPod)
	}
	writeTargets(w, s.Targets)
}

// each returns a figure of every run.
func each[R any](runs []R, figure func(R) float64) []float64 {
	out := make([]float64, 0, len(runs))
	for _, r := range runs {
		out = append(out, figure(r))
	}
	return out
}

// anyPositive reports whether some figure is positive.
func anyPositive(vals []float64) bool {
	return slices.ContainsFunc(vals, func(v float64) bool { return v > 0 })
}

// figures lays out the figures of several runs side by side: a column per
// run, and after run i, when ratios has i, a column with the ratio of the
// figures of the two runs it names (numerator, denominator).
type figures struct {
	t      *table
	ratios map[int][2]int
}

func newFigures(heads []string, ratios map[int][2]int) *figures {
	f := &figures{t: &table{}, ratios: ratios}
	row := []string{"metric"}
	for i, h := range heads {
		row = append(row, h)
		if _, ok := ratios[i]; ok {
			row = append(row, "ratio")
		}
	}
	f.t.add(row...)
	return f
}

// row adds a figure of every run, formatted by format; ratio says whether
// the ratio columns show it.
func (f *figures) row(name string, format func(float64) string, ratio bool, vals []float64) {
	row := []string{name}
	for i, v := range vals {
		row = append(row, format(v))
		if nd, ok := f.ratios[i]; ok {
			r := "-"
			if num, den := vals[nd[0]], vals[nd[1]]; ratio && den > 0 && num >= 0 {
				r = fmt.Sprintf("%.2f", num/den)
			}
			row = append(row, r)
		}
	}
	f.t.add(row...)
}

// text adds a row of cells as they are, ratio columns included: as many
// as the columns, or only the first when there is one run.
func (f *figures) text(name string, cells ...string) {
	if len(f.ratios) == 0 {
		cells = cells[:1]
	}
	f.t.add(append([]string{name}, cells...)...)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// fmtCalls writes calls per CRI method, "none" when there are none.
func fmtCalls(calls map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(calls)) {
		if calls[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, calls[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func fmtMs(v float64) string {
	switch {
	case v < 0:
		return "n/a"
	case v == 0:
		return "0"
	case v < 1:
		return fmt.Sprintf("%.0fµs", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2fms", v)
	case v < 1000:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.2fs", v/1000)
}

func fmtCount(v float64) string {
	if v == float64(int64(v)) {
		return groupThousands(int64(v))
	}
	switch {
	case v >= 100:
		return groupThousands(int64(v + 0.5))
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// table is a text table: the first column left-aligned, the others right.
type table struct{ rows [][]string }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer, indent string) {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		b.WriteString(indent)
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

// writeStreamVsUnary writes pleg's figures with streamed lists (s) beside
// those with unary lists (u), same scenario, same run.
func writeStreamVsUnary(w io.Writer, s, u *RunResult) {
	fmt.Fprintf(w, "   pleg's lists streamed (StreamPodSandboxes, StreamContainers) vs unary (ListPodSandbox, ListContainers); measured relists %d and %d:\n", s.Relists, u.Relists)
	f := newFigures([]string{"streamed", "unary"}, map[int][2]int{1: {0, 1}})
	runs := []*RunResult{s, u}
	get := func(g func(*RunResult) float64) []float64 { return each(runs, g) }
	f.row("relist p50", fmtMs, true, get(func(r *RunResult) float64 { return r.RelistP50Ms }))
	f.row("  list round trip p50", fmtMs, true, get(func(r *RunResult) float64 { return r.ListP50Ms }))
	f.row("CPU / relist", fmtMs, true, get(func(r *RunResult) float64 { return r.CPUPerRelistMs }))
	f.row("allocations / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.AllocsPerRelist }))
	f.row("bytes allocated / relist", fmtBytes, true, get(func(r *RunResult) float64 { return r.AllocBytesPerRelist }))
	f.row("peak RSS (VmHWM)", fmtBytes, true, get(func(r *RunResult) float64 { return float64(r.PeakRSSBytes) }))
	f.row("events / relist", fmtCount, true, get(func(r *RunResult) float64 { return r.EventsPerRelist }))
	f.text("list RPCs / relist", fmtPerMethod(s.ListRPCs), fmtPerMethod(u.ListRPCs), "-")
	f.t.write(w, "   ")
}

// fmtPerMethod writes figures per CRI method, "none" when there are none.
func fmtPerMethod(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+" "+fmtCount(m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// liveFigures is the table of a live scenario's runs: a column each, and
// each run after the first with its ratio to the first.
func liveFigures(runs []*LiveResult) *figures {
	var heads []string
	ratios := map[int][2]int{}
	for i, r := range runs {
		heads = append(heads, r.Run)
		if i > 0 {
			ratios[i] = [2]int{i, 0}
		}
	}
	return newFigures(heads, ratios)
}

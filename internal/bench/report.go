package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"slices"
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
	// Runtime says where the simulated runtime ran: "child-process" or
	// "in-process".
	Runtime string `json:"simulatedRuntime"`
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
	// Live holds the figures of a live scenario (instead of PLEG and
	// Kubelet).
	Live    *LiveResult `json:"live,omitempty"`
	Targets []Target    `json:"targets,omitempty"`
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
	// (VmHWM) at the end of the run, warm-up included; -1 when the
	// generator ran in the bench's own process (Options.InProcess).
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
	t := Target{Goal: fmt.Sprintf("pleg's peak RSS at most %s", fmtBytes(limit))}
	if p.PeakRSSBytes < 0 {
		t.Figure = "not measured (pleg ran in the bench's process: --in-process)"
		return t
	}
	t.Checked, t.Met = true, float64(p.PeakRSSBytes) <= limit
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
		Runtime:    "child-process",
	}
	if o.InProcess {
		r.Runtime = "in-process"
		r.Notes = append(r.Notes,
			"The simulated CRI runtime (cruntime/sim, real gRPC on a unix socket) and pleg's generator serve from this process: pleg's CPU time and allocations include the simulator's server work, and its peak RSS is not measured.")
	} else {
		r.Notes = append(r.Notes,
			"The simulated CRI runtime (cruntime/sim, real gRPC on a unix socket) runs in a child process, and each generator in a process of its own: CPU time, allocations and peak RSS are that process's own (generator, CRI client, Go runtime and GC), CPU and allocations measured around each relist; the simulator's CPU is shown apart.")
	}
	driven, live := false, false
	for _, sc := range o.Scenarios {
		if sc.Live != nil {
			live = true
		} else {
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
			"Live scenarios (hung-pod-events, hint-storm) run a started generator (Generator.Start: real clock, relist goroutine, runtime events on) for a fixed wall time, after its first relists; the relist figures are those of Generator.RecentRelists whose start falls in the window, read every "+healthEvery.String()+" together with Healthy(). Percentiles are nearest-rank. They have no kubelet baseline: the kubelet makes no single-pod relists from runtime events.")
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
		writeLive(w, s)
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
	relists := fmt.Sprintf("   measured relists: pleg %d", p.Relists)
	if b != nil {
		relists += fmt.Sprintf(", kubelet %d", b.Relists)
	}
	if b == nil {
		relists += " (no kubelet baseline: --kubelet names the kubelet-relist program)"
	}
	fmt.Fprintln(w, relists)

	t := &table{}
	if b != nil {
		t.add("metric", "pleg", "kubelet v1.37.2", "ratio")
	} else {
		t.add("metric", "pleg")
	}
	row := func(name string, pv, bv float64, f func(float64) string, ratio bool) {
		if b == nil {
			t.add(name, f(pv))
			return
		}
		r := "-"
		if ratio && bv > 0 && pv >= 0 {
			r = fmt.Sprintf("%.2f", pv/bv)
		}
		t.add(name, f(pv), f(bv), r)
	}
	get := func(f func(*RunResult) float64) (float64, float64) {
		if b == nil {
			return f(p), 0
		}
		return f(p), f(b)
	}
	pv, bv := get(func(r *RunResult) float64 { return r.RelistP50Ms })
	row("relist p50", pv, bv, fmtMs, true)
	pv, bv = get(func(r *RunResult) float64 { return r.RelistP99Ms })
	row("relist p99", pv, bv, fmtMs, true)
	pv, bv = get(func(r *RunResult) float64 { return r.ListP50Ms })
	row("  list round trip p50", pv, bv, fmtMs, true)
	pv, bv = get(func(r *RunResult) float64 { return r.CallsPerRelist })
	row("runtime calls / relist", pv, bv, fmtCount, true)
	for _, op := range []string{"list_podsandbox", "list_containers", "podsandbox_status", "container_status"} {
		pv, bv = get(func(r *RunResult) float64 { return r.CallsByOp[op] })
		if pv > 0 || bv > 0 {
			row("  "+op, pv, bv, fmtCount, true)
		}
	}
	pv, bv = get(func(r *RunResult) float64 { return r.PodsInspectedPerRelist })
	row("pods inspected / relist", pv, bv, fmtCount, true)
	pv, bv = get(func(r *RunResult) float64 { return r.EventsPerRelist })
	row("events / relist", pv, bv, fmtCount, true)
	pv, bv = get(func(r *RunResult) float64 { return r.DiscardedEvents })
	if pv > 0 || bv > 0 {
		row("events discarded (channel full)", pv, bv, fmtCount, false)
	}
	pv, bv = get(func(r *RunResult) float64 { return r.CPUPerRelistMs })
	row("CPU / relist", pv, bv, fmtMs, true)
	if p.ListFloorCPUMs >= 0 {
		name := fmt.Sprintf("  the bare list calls (%s)", fmtBytes(float64(p.ListBytes)))
		if b == nil {
			t.add(name, fmtMs(p.ListFloorCPUMs))
		} else {
			r := "-"
			if b.CPUPerRelistMs > 0 {
				r = fmt.Sprintf("%.2f", p.ListFloorCPUMs/b.CPUPerRelistMs)
			}
			t.add(name, fmtMs(p.ListFloorCPUMs), "-", r)
		}
	}
	pv, bv = get(func(r *RunResult) float64 { return r.AllocsPerRelist })
	row("allocations / relist", pv, bv, fmtCount, true)
	pv, bv = get(func(r *RunResult) float64 { return r.AllocBytesPerRelist })
	row("bytes allocated / relist", pv, bv, fmtBytes, true)
	pv, bv = get(func(r *RunResult) float64 { return float64(r.PeakRSSBytes) })
	row("peak RSS (VmHWM)", pv, bv, fmtRSS, true)
	if p.ResidentFileBytes >= 0 {
		name, v := "  the binary's pages (RssFile, at the end)", fmtRSS(float64(p.ResidentFileBytes))
		if b == nil {
			t.add(name, v)
		} else {
			t.add(name, v, "-", "-")
		}
	}
	if p.SimCPUPerRelistMs >= 0 {
		pv, bv = get(func(r *RunResult) float64 { return r.SimCPUPerRelistMs })
		row("(simulator CPU / relist)", pv, bv, fmtMs, false)
	}
	pv, bv = get(func(r *RunResult) float64 { return r.InspectionTimeouts })
	if pv > 0 || bv > 0 {
		row("pod inspection timeouts", pv, bv, fmtCount, false)
	}
	if p.Health != nil {
		pv, bv = get(func(r *RunResult) float64 {
			if r.Health == nil {
				return -1
			}
			return r.Health.LongestWithoutMs
		})
		row("longest without a relist", pv, bv, fmtMs, true)
		unhealthy := func(h *HealthResult) string {
			if h == nil {
				return "-"
			}
			return fmt.Sprintf("%d of %d", h.UnhealthySamples, h.Samples)
		}
		if b != nil {
			t.add("Healthy() false (checks)", unhealthy(p.Health), unhealthy(b.Health), "-")
			t.add("healthy the whole time", fmtHealth(p.Health), fmtHealth(b.Health), "-")
		} else {
			t.add("Healthy() false (checks)", unhealthy(p.Health))
			t.add("healthy the whole time", fmtHealth(p.Health))
		}
	}
	t.write(w, "   ")
	if u := s.PLEGUnary; u != nil {
		writeStreamVsUnary(w, p, u)
	}

	if s.Scenario.Changed > 0 {
		check := func(r *RunResult) string {
			if r.InspectedAsChanged {
				return fmt.Sprintf("%s: every relist inspected exactly %d pods", r.Algorithm, s.Scenario.Changed)
			}
			return fmt.Sprintf("%s: WARNING: relists inspected %d to %d pods, want %d", r.Algorithm, r.InspectedMin, r.InspectedMax, s.Scenario.Changed)
		}
		c := check(p)
		if b != nil {
			c += "; " + check(b)
		}
		fmt.Fprintf(w, "   check: %s\n", c)
	}
	for _, r := range []*RunResult{p, b, s.PLEGUnary} {
		if r != nil && r.RelistErrors > 0 {
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

// writeLive writes the table of a live scenario.
func writeLive(w io.Writer, s ScenarioResult) {
	r := s.Live
	fmt.Fprintf(w, "\n== %s: %s\n", s.Scenario.Name, s.Description)
	fmt.Fprintf(w, "   live: Generator.Start (real clock, relist goroutine, runtime events on) measured for %s after its first %d relists (startup %s, not measured)\n",
		fmtMs(r.WindowMs), r.WarmupRelists, fmtMs(r.StartupMs))
	fmt.Fprintf(w, "   relist period %s; pod inspection timeout %s; runtime request timeout %s; relist threshold %s; MaxParallelInspections %d\n",
		fmtMs(r.RelistPeriodMs), fmtMs(r.PodInspectionTimeoutMs), fmtMs(r.RequestTimeoutMs), fmtMs(r.RelistThresholdMs), r.MaxParallelInspections)
	fmt.Fprintln(w, "   kubelet: not applicable: the kubelet makes no single-pod relists from runtime events, so it has no baseline here")
	t := &table{}
	t.add("metric", "pleg")
	t.add("global relists in the window", fmt.Sprintf("%d (%d failed)", r.Relists, r.RelistErrors))
	t.add("relist interval p50 (start to start)", fmtMs(r.IntervalP50Ms))
	t.add("relist interval p99", fmtMs(r.IntervalP99Ms))
	t.add("relist interval max", fmtMs(r.IntervalMaxMs))
	t.add("relist p50", fmtMs(r.RelistP50Ms))
	t.add("relist p99", fmtMs(r.RelistP99Ms))
	t.add("relist max", fmtMs(r.RelistMaxMs))
	t.add("  list round trip p50 / p99", fmtMs(r.ListP50Ms)+" / "+fmtMs(r.ListP99Ms))
	t.add(fmt.Sprintf("Healthy() false (checks every %v)", healthEvery), fmt.Sprintf("%d of %d", r.Unhealthy, r.HealthChecks))
	t.add("event stream connected throughout", yesNo(r.StreamConnected))
	t.add("runtime events emitted / received", fmtCount(float64(r.EventsEmitted))+" / "+fmtCount(float64(r.EventsReceived)))
	if r.EventsDropped > 0 {
		t.add("  dropped by the runtime (stream behind)", fmtCount(float64(r.EventsDropped)))
	}
	t.add("single-pod lists (ListPod)", fmtCount(float64(r.PodLists)))
	t.add("pod status fetches (PodStatus)", fmtCount(float64(r.PodStatuses)))
	for _, reason := range sortedKeys(r.Skipped) {
		t.add("pod relist requests skipped: "+reason, fmtCount(r.Skipped[reason]))
	}
	if r.QueueDropped > 0 {
		t.add("pod relist requests dropped (queue full)", fmtCount(r.QueueDropped))
	}
	t.add("pod inspection timeouts", fmtCount(r.InspectionTimeouts))
	if r.HungPod != "" {
		t.add("hung pod: ListPod / PodStatus by pleg", fmt.Sprintf("%d / %d", r.HungPodLists, r.HungPodStatuses))
		t.add("hung pod: runtime calls received (window)", fmtCalls(r.HungCallsWindow))
		t.add("hung pod: runtime calls received (whole run)", fmtCalls(r.HungCallsRun))
	}
	t.write(w, "   ")
	if r.HungPod != "" {
		fmt.Fprintf(w, "   hung pod %s\n", r.HungPod)
	}
	writeTargets(w, s.Targets)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// fmtCalls writes calls per CRI method, "none" when there are none.
func fmtCalls(calls map[string]int64) string {
	var parts []string
	for _, k := range sortedKeys(calls) {
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

// fmtRSS writes a peak RSS; negative: not measured.
func fmtRSS(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmtBytes(v)
}

func fmtHealth(h *HealthResult) string {
	if h == nil {
		return "-"
	}
	if h.HealthyThroughout {
		return "yes"
	}
	return "no"
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
	t := &table{}
	t.add("metric", "streamed", "unary", "ratio")
	row := func(name string, sv, uv float64, f func(float64) string) {
		r := "-"
		if uv > 0 && sv >= 0 {
			r = fmt.Sprintf("%.2f", sv/uv)
		}
		t.add(name, f(sv), f(uv), r)
	}
	row("relist p50", s.RelistP50Ms, u.RelistP50Ms, fmtMs)
	row("  list round trip p50", s.ListP50Ms, u.ListP50Ms, fmtMs)
	row("CPU / relist", s.CPUPerRelistMs, u.CPUPerRelistMs, fmtMs)
	row("allocations / relist", s.AllocsPerRelist, u.AllocsPerRelist, fmtCount)
	row("bytes allocated / relist", s.AllocBytesPerRelist, u.AllocBytesPerRelist, fmtBytes)
	row("peak RSS (VmHWM)", float64(s.PeakRSSBytes), float64(u.PeakRSSBytes), fmtRSS)
	row("events / relist", s.EventsPerRelist, u.EventsPerRelist, fmtCount)
	t.write(w, "   ")
}

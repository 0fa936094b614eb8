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
	Serial      *RunResult `json:"serial,omitempty"`
	// Live holds the figures of a live scenario (instead of PLEG and
	// Serial).
	Live    *LiveResult `json:"live,omitempty"`
	Targets []Target    `json:"targets,omitempty"`
	// Reference is the kubelet's figure for this scenario, as given in the
	// project's issue (measured separately, not by this run).
	Reference string `json:"kubeletReference,omitempty"`
}

// RunResult holds the figures of one run (one algorithm). Times are in
// milliseconds; per-relist figures are averages over the measured relists.
type RunResult struct {
	Algorithm              string  `json:"algorithm"` // "pleg" or "serial"
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
	// listing (ListPodSandbox then ListContainers): one list round trip.
	ListP50Ms float64 `json:"listP50Ms"`
	ListP99Ms float64 `json:"listP99Ms"`
	// MaxBeyondListMs is the longest time a relist took beyond its own
	// listing (relist duration minus that relist's list round trip).
	MaxBeyondListMs float64 `json:"maxBeyondListMs"`

	// CallsPerRelist counts kubelet_runtime_operations_total (the CRI
	// client's own counters), CallsByOp by operation_type.
	CallsPerRelist float64            `json:"runtimeCallsPerRelist"`
	CallsByOp      map[string]float64 `json:"runtimeCallsPerRelistByOp"`
	// PodsInspectedPerRelist counts pod status fetches that reached the
	// runtime client; InspectedMin and InspectedMax bound it per relist.
	PodsInspectedPerRelist float64 `json:"podsInspectedPerRelist"`
	InspectedMin           int64   `json:"podsInspectedMin"`
	InspectedMax           int64   `json:"podsInspectedMax"`
	// InspectedAsChanged is true when every relist inspected exactly the
	// scenario's number of changed pods (scenarios without a hung pod).
	InspectedAsChanged bool    `json:"podsInspectedAsChanged"`
	EventsPerRelist    float64 `json:"eventsPerRelist"`
	InspectionTimeouts float64 `json:"podInspectionTimeouts"`

	// CPUPerRelistMs is this process's CPU time (user + system, all
	// threads) during the relists; -1 when not measured.
	CPUPerRelistMs float64 `json:"cpuPerRelistMs"`
	// AllocsPerRelist and AllocBytesPerRelist are this process's heap
	// allocations (runtime.MemStats Mallocs and TotalAlloc) during the
	// relists.
	AllocsPerRelist     float64 `json:"allocsPerRelist"`
	AllocBytesPerRelist float64 `json:"allocBytesPerRelist"`
	// SimCPUPerRelistMs is the simulated runtime's CPU time per relist
	// when it runs in a child process (not included above; it includes
	// applying the changes between relists); -1 otherwise.
	SimCPUPerRelistMs float64 `json:"simulatedRuntimeCpuPerRelistMs"`

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

// kubeletIdleCPU is the kubelet v1.36 relist's CPU time per idle relist of
// 1,000 pods x 10 containers against a simulated runtime, as given in the
// project's issue.
const kubeletIdleCPU = 120 * time.Millisecond

// kubeletReference returns the kubelet's figure for a standard scenario.
func kubeletReference(name string) string {
	switch name {
	case "66x7":
		return "relist about 120 ms"
	case "500x10":
		return "relist about 870 ms"
	case "1000x10-idle":
		return "about 120 ms of CPU per relist"
	case "110x5-hung":
		return "every relist lasts the full runtime request timeout"
	}
	return ""
}

// evaluate checks the targets of a standard scenario.
func evaluate(sc Scenario, p, s *RunResult, inProcess bool) []Target {
	switch sc.Name {
	case "500x10":
		t := Target{Goal: "relist p50 at most 1/10 of the serial baseline"}
		if s == nil || s.RelistP50Ms <= 0 {
			t.Figure = errNoSerial.Error()
			return []Target{t}
		}
		r := p.RelistP50Ms / s.RelistP50Ms
		t.Checked, t.Met = true, r <= 0.1
		t.Figure = fmt.Sprintf("%s / %s = %.3f (1/%.1f)", fmtMs(p.RelistP50Ms), fmtMs(s.RelistP50Ms), r, 1/r)
		return []Target{t}
	case "1000x10-idle":
		limit := ms(kubeletIdleCPU) / 4
		t := Target{Goal: fmt.Sprintf("CPU per relist at most 1/4 of the kubelet's (%s of %s)", fmtMs(limit), fmtMs(ms(kubeletIdleCPU)))}
		if p.CPUPerRelistMs < 0 {
			t.Figure = "CPU time not measured on this platform"
			return []Target{t}
		}
		t.Checked, t.Met = true, p.CPUPerRelistMs <= limit
		t.Figure = fmt.Sprintf("%s per relist = 1/%.1f of the kubelet's", fmtMs(p.CPUPerRelistMs), ms(kubeletIdleCPU)/p.CPUPerRelistMs)
		if inProcess {
			t.Figure += " (includes the in-process simulated runtime)"
		}
		return []Target{t}
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
			"The simulated CRI runtime (runtime/sim, real gRPC on a unix socket) serves from this process: CPU time and allocations include its server work.")
	} else {
		r.Notes = append(r.Notes,
			"The simulated CRI runtime (runtime/sim, real gRPC on a unix socket) runs in a child process: CPU time and allocations are the generator's own (generator, CRI client, Go runtime and GC), measured around each relist; the simulator's CPU is shown apart.")
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
			fmt.Sprintf("Relists are driven by hand (Generator.Relist) after %d warm-up relists without latency; between two relists exactly N pods change (one container restarted with a new ID, its old attempt removed: 3 events, 1+C status calls per pod).", warmupRelists),
			"pleg: the library's algorithm (bounded parallel inspection, pod inspection timeout). serial: the kubelet's (MaxParallelInspections 1, no pod inspection timeout), same run, same simulated node.",
			"ratio = pleg / serial. Percentiles are nearest-rank over the measured relists.")
	}
	if live {
		r.Notes = append(r.Notes,
			"Live scenarios (hung-pod-events, hint-storm) run a started generator (Generator.Start: real clock, relist goroutine, runtime events on) for a fixed wall time, after its first relists; the relist figures are those of Generator.RecentRelists whose start falls in the window, read every "+healthEvery.String()+" together with Healthy(). Percentiles are nearest-rank. They have no serial baseline: the kubelet makes no single-pod relists from runtime events.")
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
	p, b := s.PLEG, s.Serial
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
		relists += fmt.Sprintf(", serial %d", b.Relists)
	}
	fmt.Fprintln(w, relists)

	t := &table{}
	if b != nil {
		t.add("metric", "pleg", "serial (kubelet algorithm)", "ratio")
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
	pv, bv = get(func(r *RunResult) float64 { return r.CPUPerRelistMs })
	row("CPU / relist", pv, bv, fmtMs, true)
	pv, bv = get(func(r *RunResult) float64 { return r.AllocsPerRelist })
	row("allocations / relist", pv, bv, fmtCount, true)
	pv, bv = get(func(r *RunResult) float64 { return r.AllocBytesPerRelist })
	row("bytes allocated / relist", pv, bv, fmtBytes, true)
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
	for _, r := range []*RunResult{p, b} {
		if r != nil && r.RelistErrors > 0 {
			fmt.Fprintf(w, "   WARNING: %s: %d relists failed to list\n", r.Algorithm, r.RelistErrors)
		}
	}
	if s.Reference != "" {
		fmt.Fprintf(w, "   kubelet v1.36 reference (from the issue, not measured here): %s\n", s.Reference)
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
		fmtMs(r.WindowMs), liveWarmupRelists, fmtMs(r.StartupMs))
	fmt.Fprintf(w, "   relist period %s; pod inspection timeout %s; runtime request timeout %s; relist threshold %s; MaxParallelInspections %d\n",
		fmtMs(r.RelistPeriodMs), fmtMs(r.PodInspectionTimeoutMs), fmtMs(r.RequestTimeoutMs), fmtMs(r.RelistThresholdMs), r.MaxParallelInspections)
	fmt.Fprintln(w, "   serial (kubelet algorithm): not applicable: the kubelet makes no single-pod relists from runtime events, so it has no baseline here")
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

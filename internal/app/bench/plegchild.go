package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/api/lifecycle/server"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/internal/lineproto"
	"github.com/podlifecycle/pleg/internal/stats"
	"github.com/podlifecycle/pleg/metrics"
)

// plegConfig configures pleg's generator: the pleg child's configuration
// line.
type plegConfig struct {
	Endpoint          string        `json:"endpoint"`
	RequestTimeout    time.Duration `json:"requestTimeout"`
	Parallel          int           `json:"maxParallelInspections"`
	InspectionTimeout time.Duration `json:"podInspectionTimeout"` // negative: none
	RelistPeriod      time.Duration `json:"relistPeriod"`         // started generators'; 0: the default
	RelistThreshold   time.Duration `json:"relistThreshold"`      // positive: health is watched
	// MaxRelistPeriod is pleg.Options.MaxRelistPeriod (above RelistPeriod:
	// the adaptive global relist).
	MaxRelistPeriod time.Duration `json:"maxRelistPeriod,omitempty"`
	// Readiness runs the daemon's readiness check (pleg.Readiness, a CRI
	// Status call every 5 s) beside a started generator.
	Readiness bool `json:"readiness,omitempty"`
	// Events turns the runtime's event stream on as hints (a started
	// generator); it is off otherwise.
	Events bool   `json:"events"`
	Budget Budget `json:"budget"`
	// ListStreaming is the CRI client's list streaming mode: auto, on or
	// off ("": auto).
	ListStreaming string `json:"listStreaming,omitempty"`
	// GCPercent, when positive, is the garbage collector's target, unless
	// GOGC says otherwise (the daemon's: Options.GCPercent).
	GCPercent int `json:"gcPercent,omitempty"`
	// CPUProfile, when set, is the file to write a CPU profile of the
	// process to, from its start to its end.
	CPUProfile string `json:"cpuProfile,omitempty"`
	// HeapProfile, when set, is the file to write a heap profile of the
	// process to as it ends (what is live then).
	HeapProfile string `json:"heapProfile,omitempty"`
}

// Budget is the hint budget of started generators; zero fields are the
// library's defaults (pleg.Options).
type Budget struct {
	PodRelistRate    float64       `json:"podRelistRate,omitempty"`
	PodRelistBurst   int           `json:"podRelistBurst,omitempty"`
	PodRelistSpacing time.Duration `json:"podRelistSpacing,omitempty"`
	EarlyRelistGap   time.Duration `json:"earlyRelistGap,omitempty"`
}

// servePLEG is the pleg child: pleg's generator over its CRI client
// against the configured endpoint. It answers "ready", then:
//
//	relist     one relist driven by hand; answers a relistResult as JSON
//	floor <n>  the listing's two calls made bare n times; a floorResult
//	watch      watch health around every relist from now on
//	health     what Healthy said since watch, as JSON (null: not watched)
//	rss        the process's peak resident set size in bytes (VmHWM)
//	rssfile    its resident pages mapped from files in bytes (RssFile)
//	rssnow     its resident set size now in bytes (VmRSS)
//	api        serve the lifecycle API (api/lifecycle/server, the
//	           daemon's defaults) on a unix socket; answers its path
//	start      start the generator and wait until its warm-up is over:
//	           some global relists, the last of which inspected nothing,
//	           and the event stream connected if on; answers a liveStart
//	hung <uid> count the calls for this pod apart
//	begin [idle]
//	           begin a measured window: health checked every healthEvery
//	           (idle: nothing runs in the window but the generator and,
//	           if on, the readiness check; health is checked at its end)
//	next       wait for the end of the next global relist
//	end        end the window; answers a LiveResult as JSON (pleg's
//	           figures)
//	await <uid> <after>
//	           wait for an event about the pod delivered after the Unix
//	           time <after> (ns); answers its delivery time (Unix ns)
//
// Either relist or start is used, not both.
func servePLEG(in io.Reader, out io.Writer) (err error) {
	sc := lineproto.NewScanner(in)
	var cfg plegConfig
	if err := lineproto.ReadConfig(sc, &cfg); err != nil {
		return err
	}
	if _, set := os.LookupEnv("GOGC"); cfg.GCPercent > 0 && !set {
		debug.SetGCPercent(cfg.GCPercent)
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	p, err := newPLEGChild(cfg)
	if err != nil {
		return err
	}
	defer p.close()
	if cfg.HeapProfile != "" {
		defer func() {
			if werr := writeHeapProfile(cfg.HeapProfile); err == nil {
				err = werr
			}
		}()
	}
	return lineproto.Serve(sc, out, "ready", p.command)
}

// plegChild is pleg's generator and what measures it.
type plegChild struct {
	cfg    plegConfig
	reg    *prometheus.Registry
	client *cri.Client
	probe  *probe
	g      *pleg.Generator
	events <-chan *pleg.Event // driven by hand: drained after each relist
	health *healthWatch       // driven by hand, after watch
	sink   *sink              // started
	win    *window            // between begin and end
	api    *apiServer         // after api
	ready  *readiness         // started, with cfg.Readiness
}

// readiness is the daemon's readiness check, run beside a started
// generator.
type readiness struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *readiness) stop() {
	r.cancel()
	<-r.done
}

// apiServer is the lifecycle API the pleg child serves after "api", as
// the daemon does, on a unix socket in a directory of its own.
type apiServer struct {
	dir    string
	cancel context.CancelFunc
	done   chan error
}

// serveAPI serves the lifecycle API of the generator's journal and
// returns its socket's path.
func (p *plegChild) serveAPI() (string, error) {
	if p.api != nil {
		return "", errors.New("api: already served")
	}
	dir, err := os.MkdirTemp("", "pleg-bench-api-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "lifecycle.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	srv, err := server.New(server.Config{Journal: p.g.Journal(), Logger: logr.Discard()})
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &apiServer{dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- srv.Serve(ctx, ln) }()
	p.api = a
	return path, nil
}

// stop stops the server and waits for it.
func (a *apiServer) stop() {
	a.cancel()
	<-a.done
	os.RemoveAll(a.dir)
}

func newPLEGChild(c plegConfig) (*plegChild, error) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	streaming := cri.ListStreamingAuto
	if c.ListStreaming != "" {
		var err error
		if streaming, err = cri.ParseListStreaming(c.ListStreaming); err != nil {
			return nil, err
		}
	}
	client, err := cri.Dial(c.Endpoint, cri.WithTimeout(c.RequestTimeout), cri.WithMetrics(m), cri.WithLogger(logr.Discard()),
		cri.WithListStreaming(streaming))
	if err != nil {
		return nil, err
	}
	pr := &probe{Runtime: client}
	events := pleg.EventsOff
	if c.Events {
		events = pleg.EventsOn
	}
	g, err := pleg.New(pleg.Options{
		Runtime:                pr,
		EventSource:            client,
		Events:                 events,
		Metrics:                m,
		RelistPeriod:           c.RelistPeriod,
		MaxRelistPeriod:        c.MaxRelistPeriod,
		RelistThreshold:        c.RelistThreshold,
		PodInspectionTimeout:   c.InspectionTimeout,
		MaxParallelInspections: c.Parallel,
		PodRelistRate:          c.Budget.PodRelistRate,
		PodRelistBurst:         c.Budget.PodRelistBurst,
		PodRelistSpacing:       c.Budget.PodRelistSpacing,
		EarlyRelistGap:         c.Budget.EarlyRelistGap,
	})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &plegChild{cfg: c, reg: reg, client: client, probe: pr, g: g, events: g.Watch()}, nil
}

// period is the generator's relist period.
func (p *plegChild) period() time.Duration {
	if p.cfg.RelistPeriod > 0 {
		return p.cfg.RelistPeriod
	}
	return pleg.DefaultRelistPeriod
}

func (p *plegChild) close() {
	if p.win != nil {
		p.win.stop()
	}
	if p.api != nil {
		p.api.stop()
	}
	if p.ready != nil {
		p.ready.stop()
	}
	// Stop cancels the calls still out (a hung pod's), so it returns at
	// once; it closes the Watch channel, which ends the sink.
	p.g.Stop()
	if p.sink != nil {
		<-p.sink.done
	}
	p.client.Close()
}

func (p *plegChild) command(name, arg string) (string, error) {
	switch name {
	case "relist":
		return lineproto.JSON(p.relist())
	case "floor":
		n, err := strconv.Atoi(arg)
		if err != nil {
			return "", err
		}
		f, err := p.floor(n)
		if err != nil {
			return "", err
		}
		return lineproto.JSON(f)
	case "watch":
		if p.cfg.RelistThreshold > 0 {
			p.health = newHealthWatch(p.g, p.cfg.RelistThreshold)
		}
		return "", nil
	case "health":
		if p.health == nil {
			return "null", nil
		}
		return lineproto.JSON(p.health.result())
	case "api":
		return p.serveAPI()
	case "rss", "rssfile", "rssnow":
		field := map[string]string{"rss": "VmHWM", "rssfile": "RssFile", "rssnow": "VmRSS"}[name]
		n, err := procStatusBytes(field)
		return strconv.FormatInt(n, 10), err
	case "start":
		st, err := p.start()
		if err != nil {
			return "", err
		}
		return lineproto.JSON(st)
	case "hung":
		p.probe.setHung(types.UID(arg))
		return "", nil
	case "begin":
		if p.sink == nil || p.win != nil {
			return "", errors.New("begin: not started, or a window is open")
		}
		if arg != "" && arg != "idle" {
			return "", fmt.Errorf("begin %q: want nothing or idle", arg)
		}
		p.win = p.beginWindow(arg == "idle")
		return "", nil
	case "next":
		if p.sink == nil {
			return "", errors.New("next: not started")
		}
		return "", p.nextRelist()
	case "end":
		if p.win == nil {
			return "", errors.New("end: no window")
		}
		r := p.endWindow(p.win)
		p.win = nil
		// A live run's heap profile is of the window's end, while what
		// it measures (its watchers, say) is still there; the child's end
		// writes it again, after them.
		if p.cfg.HeapProfile != "" {
			if err := writeHeapProfile(p.cfg.HeapProfile + ".window"); err != nil {
				return "", err
			}
		}
		return lineproto.JSON(r)
	case "await":
		if p.sink == nil {
			return "", errors.New("await: not started")
		}
		uid, after, _ := strings.Cut(arg, " ")
		ns, err := strconv.ParseInt(after, 10, 64)
		if err != nil {
			return "", err
		}
		at, err := p.sink.await(types.UID(uid), time.Unix(0, ns), awaitLimit)
		return strconv.FormatInt(at.UnixNano(), 10), err
	}
	return "", fmt.Errorf("unknown command %q", name)
}

// relistResult is one relist driven by hand, as its process measured it.
// Its JSON form is the answer to "relist"; the kubelet-relist program
// answers with the same field names.
type relistResult struct {
	WallNs     int64              `json:"wallNs"`
	CPUNs      int64              `json:"cpuNs"`
	Mallocs    uint64             `json:"mallocs"`
	AllocBytes uint64             `json:"allocBytes"`
	Calls      map[string]float64 `json:"calls"` // kubelet_runtime_operations_total by operation_type
	Events     int                `json:"events"`
	// Discarded counts events the generator dropped (the kubelet's full
	// event channel).
	Discarded float64 `json:"discardedEvents"`
	// Inspected counts pods whose status was fetched; ListNs is the
	// listing's round trip; Timeouts counts pod inspection timeouts. The
	// kubelet's program does not report them.
	Inspected  *int64  `json:"inspected,omitempty"`
	ListFailed bool    `json:"listFailed"`
	ListNs     *int64  `json:"listNs,omitempty"`
	Timeouts   float64 `json:"inspectionTimeouts"`
}

// relist runs one relist by hand and measures it. A failed listing is
// reported, not fatal, as the kubelet's.
func (p *plegChild) relist() *relistResult {
	if p.health != nil {
		p.health.check()
	}
	c0 := counters(p.reg)
	s0 := p.probe.statuses.Load()
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	cpu0 := processCPU()
	t0 := time.Now()
	// The parent bounds the relist (it kills this process when its
	// context ends); the runtime request timeout bounds every call.
	err := p.g.Relist(context.Background())
	wall := time.Since(t0)
	cpu1 := processCPU()
	goruntime.ReadMemStats(&m1)
	list := p.probe.lastList()
	if p.health != nil {
		p.health.relisted(list)
		p.health.check()
	}
	d := delta(c0, counters(p.reg))
	inspected, listNs := p.probe.statuses.Load()-s0, int64(list)
	events := 0
	for drained := false; !drained; {
		select {
		case <-p.events:
			events++
		default:
			drained = true
		}
	}
	return &relistResult{
		WallNs: int64(wall), CPUNs: int64(cpu1 - cpu0),
		Mallocs: m1.Mallocs - m0.Mallocs, AllocBytes: m1.TotalAlloc - m0.TotalAlloc,
		Calls: byLabel(d, "kubelet_runtime_operations_total"), Events: events,
		Inspected: &inspected, ListNs: &listNs,
		Timeouts: d["pleg_pod_inspection_timeouts_total"], ListFailed: err != nil,
	}
}

// floorResult is what a listing's two calls cost made bare, their replies
// discarded undecoded (cri.Client.ListDiscard), in the generator's process:
// the transport's floor under a relist.
type floorResult struct {
	CPUNs int64 `json:"cpuNs"` // mean per pair of calls
	Bytes int   `json:"bytes"` // both replies
}

// floor makes the bare list calls n times, one pair at a time as a relist
// makes them, on the generator's own connection.
func (p *plegChild) floor(n int) (*floorResult, error) {
	if n < 1 {
		return nil, fmt.Errorf("floor: %d rounds", n)
	}
	var cpu time.Duration
	var bytes int
	for range n {
		c0 := processCPU()
		b, err := p.client.ListDiscard(context.Background())
		cpu += processCPU() - c0
		if err != nil {
			return nil, fmt.Errorf("bare list calls: %w", err)
		}
		bytes = b
	}
	return &floorResult{CPUNs: int64(cpu) / int64(n), Bytes: bytes}, nil
}

// liveStart is the answer to start: the warm-up, not measured.
type liveStart struct {
	StartupMs     float64 `json:"startupMs"`
	WarmupRelists int     `json:"warmupRelists"`
}

// liveWarmupRelists is the least number of global relists before a window;
// liveStartLimit bounds the warm-up.
const (
	liveWarmupRelists = 2
	liveStartLimit    = time.Minute
)

// start starts the generator and waits for the end of its warm-up: the
// first global relist (it inspects every pod), the second (the first whose
// health timestamp is not the startup's), the event stream's connection,
// and more relists until one has nothing left to inspect. On a busy
// machine some of the first relist's inspections time out and the next
// relist inspects those pods again, each for up to the pod inspection
// timeout; a window must start in the steady state it measures, not in
// the startup's tail.
//
// With the adaptive global relist on, the warm-up also lasts until the
// period has grown to its maximum (after AdaptiveTrust maximum periods of
// a clean stream at least): until the last relist started at least
// (nearly) MaxRelistPeriod after the end of the one before.
func (p *plegChild) start() (*liveStart, error) {
	p.sink = newSink(p.events)
	started := time.Now()
	p.g.Start()
	if p.cfg.Readiness {
		ctx, cancel := context.WithCancel(context.Background())
		r := &readiness{cancel: cancel, done: make(chan struct{})}
		check := pleg.NewReadiness(p.g, pleg.ReadinessOptions{Runtime: p.client, Timeout: p.cfg.RequestTimeout})
		go func() {
			defer close(r.done)
			check.Run(ctx)
		}()
		p.ready = r
	}
	adaptive := p.cfg.MaxRelistPeriod > p.period()
	limit := started.Add(liveStartLimit)
	if adaptive {
		// The clean time the maximum needs (pleg.AdaptiveTrust), the
		// doublings up to it, and a hold at the base.
		limit = limit.Add((pleg.AdaptiveTrust + 4) * p.cfg.MaxRelistPeriod)
	}
	for {
		recent := p.g.RecentRelists()
		if len(recent) >= liveWarmupRelists && (!p.cfg.Events || p.g.EventStream().State == pleg.StreamConnected) {
			last, prev := recent[len(recent)-1], recent[len(recent)-2]
			stretched := !adaptive || last.Start.Sub(prev.Start.Add(prev.Duration)) >= p.cfg.MaxRelistPeriod*95/100
			if last.Err == "" && last.Inspected == 0 && stretched {
				return &liveStart{StartupMs: ms(time.Since(started)), WarmupRelists: len(recent)}, nil
			}
		}
		if time.Now().After(limit) {
			return nil, fmt.Errorf("no global relist that inspected nothing, with the event stream connected if on (and the period at its maximum if adaptive), within %v (relists %d, stream %+v)",
				limit.Sub(started), len(recent), p.g.EventStream())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nextLimit bounds the wait for the next global relist.
const nextLimit = 5 * time.Minute

// nextRelist waits for the end of the next global relist: for its listing
// to return (the probe says when, without waking this process before),
// then for its RelistStat, which comes once it ends (at once on an idle
// node).
func (p *plegChild) nextRelist() error {
	recent := p.g.RecentRelists()
	var last time.Time
	if len(recent) > 0 {
		last = recent[len(recent)-1].Start
	}
	select {
	case <-p.probe.listed():
	case <-time.After(nextLimit):
		return fmt.Errorf("next: no global listing within %v", nextLimit)
	}
	for limit := time.Now().Add(nextLimit); ; {
		if recent := p.g.RecentRelists(); len(recent) > 0 && recent[len(recent)-1].Start.After(last) {
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("next: the global relist did not end within %v of its listing", nextLimit)
		}
		time.Sleep(time.Millisecond)
	}
}

// healthEvery is how often a window checks Healthy (and the event stream's
// state).
const healthEvery = 50 * time.Millisecond

// awaitLimit bounds the wait for one change's event.
const awaitLimit = 30 * time.Second

// window measures a started generator between begin and end.
type window struct {
	t0   time.Time
	s0   liveSnapshot
	quit chan struct{}
	done chan struct{}

	idle bool // no checker goroutine: health is checked at the end

	mu        sync.Mutex // the checker goroutine writes what follows
	checks    int
	unhealthy int
	first     string // the first Healthy error, and when
	connected bool   // the event stream stayed connected
	seen      map[time.Time]pleg.RelistStat
}

// liveSnapshot holds the counters read at each edge of a window.
type liveSnapshot struct {
	counters                                 map[string]float64
	lists, statuses, hungLists, hungStatuses int64
	received, delivered                      int64
	cpu                                      time.Duration
}

func (p *plegChild) snapshot() liveSnapshot {
	return liveSnapshot{
		counters: counters(p.reg),
		lists:    p.probe.podLists.Load(), statuses: p.probe.statuses.Load(),
		hungLists: p.probe.hungLists.Load(), hungStatuses: p.probe.hungStatuses.Load(),
		received: p.g.EventStream().Events, delivered: p.sink.delivered.Load(),
		cpu: processCPU(),
	}
}

// beginWindow starts checking health every healthEvery, and keeping the
// global relists: the generator keeps its last 300, read as often as 100
// relist periods (at least every healthEvery) and at the end.
//
// An idle window runs no goroutine: the generator's last 300 relists are
// read at the end (idle windows are minutes of relists a second at most),
// and health is checked once then.
func (p *plegChild) beginWindow(idle bool) *window {
	w := &window{quit: make(chan struct{}), done: make(chan struct{}), connected: true, seen: map[time.Time]pleg.RelistStat{}, idle: idle}
	w.s0 = p.snapshot()
	w.t0 = time.Now()
	if idle {
		close(w.done)
		return w
	}
	collectEvery := max(healthEvery, 100*p.period())
	go func() {
		defer close(w.done)
		tick := time.NewTicker(healthEvery)
		defer tick.Stop()
		collected := w.t0
		for {
			select {
			case <-w.quit:
				return
			case now := <-tick.C:
				ok, err := p.g.Healthy()
				connected := !p.cfg.Events || p.g.EventStream().State == pleg.StreamConnected
				w.mu.Lock()
				w.checks++
				if !ok {
					w.unhealthy++
					if w.first == "" {
						w.first = fmt.Sprintf("after %v: %v", now.Sub(w.t0).Round(time.Millisecond), err)
					}
				}
				w.connected = w.connected && connected
				if now.Sub(collected) >= collectEvery {
					w.collect(p.g)
					collected = now
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *window) collect(g *pleg.Generator) {
	for _, st := range g.RecentRelists() {
		w.seen[st.Start] = st
	}
}

func (w *window) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// endWindow ends the window and returns pleg's figures in it.
func (p *plegChild) endWindow(w *window) *LiveResult {
	w.stop()
	t1 := time.Now()
	s1 := p.snapshot()
	w.collect(p.g)
	if w.idle {
		ok, err := p.g.Healthy()
		w.checks, w.connected = 1, !p.cfg.Events || p.g.EventStream().State == pleg.StreamConnected
		if !ok {
			w.unhealthy, w.first = 1, fmt.Sprintf("at the window's end: %v", err)
		}
	}
	s0 := w.s0
	c := p.cfg
	r := &LiveResult{
		WindowMs:               ms(t1.Sub(w.t0)),
		RelistPeriodMs:         ms(p.period()),
		MaxRelistPeriodMs:      ms(p.cfg.MaxRelistPeriod),
		PodInspectionTimeoutMs: ms(c.InspectionTimeout),
		RequestTimeoutMs:       ms(c.RequestTimeout),
		RelistThresholdMs:      ms(p.g.RelistThreshold()),
		MaxParallelInspections: c.Parallel,
		HealthChecks:           w.checks,
		Unhealthy:              w.unhealthy,
		FirstUnhealthy:         w.first,
		EverUnhealthy:          w.unhealthy > 0,
		StreamConnected:        c.Events && w.connected,
		EventsReceived:         s1.received - s0.received,
		EventsDelivered:        s1.delivered - s0.delivered,
		PodLists:               s1.lists - s0.lists,
		PodStatuses:            s1.statuses - s0.statuses,
		HungPodLists:           s1.hungLists - s0.hungLists,
		HungPodStatuses:        s1.hungStatuses - s0.hungStatuses,
		CPUPerSecondMs:         -1,
		Goroutines:             goruntime.NumGoroutine(),
	}
	var mem goruntime.MemStats
	goruntime.ReadMemStats(&mem)
	r.StackBytes, r.HeapInuseBytes = int64(mem.StackInuse), int64(mem.HeapInuse)
	if cpuMeasured {
		r.CPUPerSecondMs = ms(s1.cpu-s0.cpu) / t1.Sub(w.t0).Seconds()
	}
	d := delta(s0.counters, s1.counters)
	r.Skipped = byLabel(d, "pleg_pod_relist_requests_skipped_total")
	r.Deferred = byLabel(d, "pleg_pod_relist_requests_deferred_total")
	r.EarlyRelists = d["pleg_early_relists_total"]
	r.QueueDropped = d["pleg_pod_relist_requests_dropped_total"]
	r.InspectionTimeouts = d["pleg_pod_inspection_timeouts_total"]
	r.Unannounced = d["pleg_unannounced_changes_total"]

	var starts []time.Time
	var durs []time.Duration
	for _, st := range w.seen {
		if st.Start.Before(w.t0) || st.Start.After(t1) {
			continue
		}
		starts = append(starts, st.Start)
		durs = append(durs, st.Duration)
		if st.Err != "" {
			r.RelistErrors++
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	r.Relists = len(starts)
	intervals := liveIntervals(w.t0, t1, starts)
	r.Intervals = len(intervals)
	r.IntervalP50Ms = ms(stats.Percentile(intervals, 0.50))
	r.IntervalP99Ms = ms(stats.Percentile(intervals, 0.99))
	r.IntervalMaxMs = ms(slices.Max(intervals))
	if len(durs) > 0 {
		var sum time.Duration
		for _, d := range durs {
			sum += d
		}
		r.RelistMeanMs = ms(sum) / float64(len(durs))
		r.RelistP50Ms = ms(stats.Percentile(durs, 0.50))
		r.RelistP99Ms = ms(stats.Percentile(durs, 0.99))
		r.RelistMaxMs = ms(slices.Max(durs))
	}
	lists := p.probe.listsIn(w.t0, t1)
	r.ListP50Ms = ms(stats.Percentile(lists, 0.50))
	r.ListP99Ms = ms(stats.Percentile(lists, 0.99))
	return r
}

// liveIntervals returns the times from each relist start to the next, with
// the window's edges as the first and last bounds: a relist goroutine that
// stops relisting shows as a long interval rather than as none.
func liveIntervals(t0, t1 time.Time, starts []time.Time) []time.Duration {
	prev := t0
	out := make([]time.Duration, 0, len(starts)+1)
	for _, s := range starts {
		out = append(out, s.Sub(prev))
		prev = s
	}
	return append(out, t1.Sub(prev))
}

// sink drains a started generator's Watch channel, as the kubelet's sync
// loop does, and notes when each pod's last event was delivered.
type sink struct {
	delivered atomic.Int64
	done      chan struct{} // closed when the channel is

	mu      sync.Mutex
	last    map[types.UID]time.Time
	changed chan struct{} // closed and replaced on every event
}

func newSink(events <-chan *pleg.Event) *sink {
	s := &sink{done: make(chan struct{}), last: map[types.UID]time.Time{}, changed: make(chan struct{})}
	go func() {
		defer close(s.done)
		for e := range events {
			now := time.Now()
			s.delivered.Add(1)
			s.mu.Lock()
			s.last[e.PodUID] = now
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
		}
	}()
	return s
}

// await returns when an event about pod uid was delivered after after,
// waiting up to limit.
func (s *sink) await(uid types.UID, after time.Time, limit time.Duration) (time.Time, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		at, changed := s.last[uid], s.changed
		s.mu.Unlock()
		if at.After(after) {
			return at, nil
		}
		select {
		case <-changed:
		case <-s.done:
			return time.Time{}, errors.New("the generator stopped")
		case <-timer.C:
			return time.Time{}, fmt.Errorf("no event about pod %s within %v", uid, limit)
		}
	}
}

// probe wraps pleg's runtime client: it times the global listings and
// counts the single-pod list calls and the status fetches (those of the
// hung pod apart).
type probe struct {
	cruntime.Runtime
	hung atomic.Pointer[types.UID]

	podLists, statuses      atomic.Int64
	hungLists, hungStatuses atomic.Int64

	mu     sync.Mutex
	lists  []timedCall   // the last maxTimedLists global listings
	listCh chan struct{} // closed and replaced as each listing returns
}

// listed returns a channel closed when the next global listing returns.
func (p *probe) listed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listCh == nil {
		p.listCh = make(chan struct{})
	}
	return p.listCh
}

type timedCall struct {
	start time.Time
	d     time.Duration
}

// maxTimedLists bounds the listings a probe keeps: minutes of 20 ms
// relists.
const maxTimedLists = 10000

func (p *probe) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	start := time.Now()
	pods, err := p.Runtime.ListPods(ctx)
	d := time.Since(start)
	p.mu.Lock()
	if len(p.lists) == maxTimedLists {
		p.lists = slices.Delete(p.lists, 0, maxTimedLists/2)
	}
	p.lists = append(p.lists, timedCall{start, d})
	if p.listCh != nil {
		close(p.listCh)
		p.listCh = nil
	}
	p.mu.Unlock()
	return pods, err
}

func (p *probe) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	p.podLists.Add(1)
	if p.isHung(uid) {
		p.hungLists.Add(1)
	}
	return p.Runtime.ListPod(ctx, uid)
}

func (p *probe) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	p.statuses.Add(1)
	if pod != nil && p.isHung(pod.UID) {
		p.hungStatuses.Add(1)
	}
	return p.Runtime.ItemStatuses(ctx, pod, sbs, cts)
}

func (p *probe) setHung(uid types.UID) { p.hung.Store(&uid) }

func (p *probe) isHung(uid types.UID) bool {
	h := p.hung.Load()
	return h != nil && *h == uid
}

// lastList returns the duration of the last global listing.
func (p *probe) lastList() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lists) == 0 {
		return 0
	}
	return p.lists[len(p.lists)-1].d
}

// listsIn returns the durations of the listings that started in [from, to].
func (p *probe) listsIn(from, to time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, l := range p.lists {
		if !l.start.Before(from) && !l.start.After(to) {
			out = append(out, l.d)
		}
	}
	return out
}

// healthWatch checks the health of a generator driven by hand without a
// poller (a goroutine waking every few milliseconds would add its own CPU
// time to the figures): it calls Healthy right before and right after every
// relist, and computes from the health timestamp (Generator.LastRelist) the
// longest time the generator went without a successful relist start, up to
// the moment each listing returned (when the timestamp moves) and to the
// end of the run. Healthy is false exactly when that time exceeds the
// threshold.
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

// counters reads every counter of the registry: the sum of each metric
// under its name, and the sum under each label value under
// "<name>/<value>".
func counters(g prometheus.Gatherer) map[string]float64 {
	out := map[string]float64{}
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			out[mf.GetName()] += v
			for _, l := range m.GetLabel() {
				out[mf.GetName()+"/"+l.GetValue()] += v
			}
		}
	}
	return out
}

// delta returns the counts that grew from before to after.
func delta[V int64 | float64](before, after map[string]V) map[string]V {
	out := map[string]V{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// byLabel returns the counts of one counter by label value.
func byLabel(counts map[string]float64, name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range counts {
		if value, ok := strings.CutPrefix(k, name+"/"); ok {
			out[value] = v
		}
	}
	return out
}

// procStatusBytes returns a field of /proc/self/status given in kB, in
// bytes.
func procStatusBytes(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

// writeHeapProfile writes the heap profile of what is live now to path.
func writeHeapProfile(path string) error {
	goruntime.GC() // the profile's in-use figures are as of the last GC
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

package pleg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/podcache"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Defaults, the kubelet's where it has one.
const (
	DefaultRelistPeriod           = time.Second
	DefaultRelistThreshold        = 3 * time.Minute
	DefaultChannelCapacity        = 1000
	DefaultMaxParallelInspections = 16
	DefaultPodInspectionTimeout   = 10 * time.Second
	DefaultPodRelistQueue         = 4096
	// The hint budget (docs/semantics.md, "Hints and their budget"),
	// chosen from measurements on containerd (docs/performance.md).
	DefaultPodRelistRate    = 5.0
	DefaultPodRelistBurst   = 10
	DefaultPodRelistSpacing = 100 * time.Millisecond
	DefaultEarlyRelistGap   = 500 * time.Millisecond
	// DefaultMaxRelistPeriod is the adaptive relist's maximum that pleg's
	// commands use unless told otherwise (--max-relist-period); the
	// library's is 0, off. Chosen so that, at rest beside the kubelet,
	// pleg's runtime calls are under a tenth of its PLEG's
	// (docs/performance.md).
	DefaultMaxRelistPeriod = 30 * time.Second
)

// Bounds of the options, checked by New: values outside make no sense or
// exhaust the node.
const (
	MinRelistPeriod           = 10 * time.Millisecond
	MaxMaxRelistPeriod        = time.Minute
	MaxMaxParallelInspections = 1024
	MaxQueue                  = 1 << 20 // ChannelCapacity, PodRelistQueue, Journal.Size
)

// Options configure a Generator. Only Runtime is required.
type Options struct {
	// Runtime is the container runtime to relist.
	Runtime cruntime.Runtime
	// Cache receives pod statuses; New creates one when nil.
	Cache *podcache.Cache
	// Clock drives every timing rule; the real clock when nil.
	Clock clock.WithTicker
	// Logger receives the generator's logs, at the kubelet's verbosity
	// levels (2: state changes, 4: per-event detail, 5/6: per relist).
	Logger logr.Logger
	// Metrics receives the generator's metrics; unregistered ones when nil.
	Metrics *metrics.Metrics

	// RelistPeriod is the sliding period between the end of a relist and
	// the start of the next. Default 1s; at least MinRelistPeriod.
	RelistPeriod time.Duration
	// MaxRelistPeriod turns the adaptive global relist on when above
	// RelistPeriod: while the runtime's event stream is connected and
	// global relists find nothing no event announced, the period doubles
	// after each relist, up to this (docs/semantics.md, "Relisting when
	// there is something to find"). 0 (the default) or RelistPeriod: off,
	// the period is RelistPeriod always. At most MaxMaxRelistPeriod and
	// below half of RelistThreshold.
	MaxRelistPeriod time.Duration
	// RelistThreshold is how long without a successful relist makes the
	// generator unhealthy. Default 3m; above RelistPeriod.
	RelistThreshold time.Duration
	// ChannelCapacity is the capacity of the kubelet-compatible Watch
	// channel. Default 1000.
	ChannelCapacity int
	// MaxParallelInspections bounds how many runtime calls for pods are out
	// at once (status fetches, single-pod list calls). 1 inspects changed
	// pods one after another, as the kubelet does. Default 16; at most
	// MaxMaxParallelInspections.
	MaxParallelInspections int
	// PodInspectionTimeout bounds how long a relist waits for one pod's
	// status. A pod that exceeds it is handled as a failed inspection and
	// reinspected later. Negative disables it for global relists (wait as
	// long as the runtime request timeout allows, as the kubelet does);
	// single-pod relists' calls then keep the default bound. Default 10s.
	PodInspectionTimeout time.Duration
	// FullInspection makes every inspection of a changed pod fetch the
	// status of all its sandboxes and containers, as the kubelet does. By
	// default only the items whose listing changed since their last status
	// are fetched and the others' last statuses reused (docs/semantics.md,
	// "Delta inspection").
	FullInspection bool
	// Journal configures the lifecycle stream's journal (retention by
	// count, bytes and age; bookmarks). Its Clock is Options.Clock.
	Journal journal.Options
	// PodRelistQueue bounds the pods waiting for a single-pod relist.
	// Default 4096.
	PodRelistQueue int
	// PodRelistRate and PodRelistBurst are the hint budget: single-pod
	// relists a second, and at once. Negative rate: unlimited. Defaults 5
	// and 10.
	PodRelistRate  float64
	PodRelistBurst int
	// PodRelistSpacing: after a single-pod relist of a pod that found
	// nothing, the least time before another. Negative: none. Default
	// 100ms.
	PodRelistSpacing time.Duration
	// EarlyRelistGap: when hints wait for the budget, the next global relist
	// starts this long after the end of the last instead of a period after
	// (never sooner than this). Negative: never early. Default 500ms.
	EarlyRelistGap time.Duration
	// Events says whether to use the runtime's container event stream as
	// hints that trigger single-pod relists. Default EventsAuto.
	Events EventsMode
	// EventSource is the event stream; the Runtime when it implements
	// cruntime.EventSource and this is nil.
	EventSource cruntime.EventSource
	// KubeletRequestTimeout is the kubelet's --runtime-request-timeout,
	// what one hanging call costs its relist in the forecast of the
	// kubelet's PLEG (Generator.Forecast, docs/forecast.md). Default 2m.
	KubeletRequestTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.Cache == nil {
		o.Cache = podcache.New()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New(nil)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.RelistPeriod, DefaultRelistPeriod)
	def(&o.RelistThreshold, DefaultRelistThreshold)
	def(&o.PodInspectionTimeout, DefaultPodInspectionTimeout)
	def(&o.PodRelistSpacing, DefaultPodRelistSpacing)
	def(&o.EarlyRelistGap, DefaultEarlyRelistGap)
	def(&o.KubeletRequestTimeout, forecast.DefaultRequestTimeout)
	defInt(&o.ChannelCapacity, DefaultChannelCapacity)
	defInt(&o.MaxParallelInspections, DefaultMaxParallelInspections)
	defInt(&o.PodRelistQueue, DefaultPodRelistQueue)
	defInt(&o.PodRelistBurst, DefaultPodRelistBurst)
	if o.PodRelistRate == 0 {
		o.PodRelistRate = DefaultPodRelistRate
	}
	if o.Events == "" {
		o.Events = EventsAuto
	}
	if o.EventSource == nil {
		o.EventSource, _ = o.Runtime.(cruntime.EventSource)
	}
}

func (o *Options) validate() error {
	switch {
	case o.Runtime == nil:
		return errors.New("pleg: Options.Runtime is required")
	case o.RelistPeriod < MinRelistPeriod:
		return fmt.Errorf("pleg: RelistPeriod %v is below %v", o.RelistPeriod, MinRelistPeriod)
	case o.RelistThreshold <= o.RelistPeriod:
		return fmt.Errorf("pleg: RelistThreshold %v is not above RelistPeriod (%v): the generator would be unhealthy between relists", o.RelistThreshold, o.RelistPeriod)
	case o.MaxRelistPeriod != 0 && (o.MaxRelistPeriod < o.RelistPeriod || o.MaxRelistPeriod > MaxMaxRelistPeriod || 2*o.MaxRelistPeriod >= o.RelistThreshold):
		return fmt.Errorf("pleg: MaxRelistPeriod %v is outside RelistPeriod (%v) .. %v, or not below half of RelistThreshold (%v)",
			o.MaxRelistPeriod, o.RelistPeriod, MaxMaxRelistPeriod, o.RelistThreshold)
	case o.ChannelCapacity < 0 || o.ChannelCapacity > MaxQueue:
		return fmt.Errorf("pleg: ChannelCapacity %d is outside 0..%d", o.ChannelCapacity, MaxQueue)
	case o.MaxParallelInspections < 0 || o.MaxParallelInspections > MaxMaxParallelInspections:
		return fmt.Errorf("pleg: MaxParallelInspections %d is outside 1..%d", o.MaxParallelInspections, MaxMaxParallelInspections)
	case o.PodRelistQueue < 0 || o.PodRelistQueue > MaxQueue:
		return fmt.Errorf("pleg: PodRelistQueue %d is outside 1..%d", o.PodRelistQueue, MaxQueue)
	case o.Journal.Size < 0 || o.Journal.Size > MaxQueue || o.Journal.MaxBytes < 0 || o.Journal.MaxAge < 0 || o.Journal.BookmarkInterval < 0:
		return fmt.Errorf("pleg: Journal options %+v out of range (Size at most %d, none negative)", o.Journal, MaxQueue)
	case o.PodRelistBurst < 0 || o.PodRelistBurst > MaxQueue:
		return fmt.Errorf("pleg: PodRelistBurst %d is outside 1..%d", o.PodRelistBurst, MaxQueue)
	case o.PodRelistRate > 1e6 || o.PodRelistRate != o.PodRelistRate:
		return fmt.Errorf("pleg: PodRelistRate %v is not a rate (at most 1e6 a second; negative: unlimited)", o.PodRelistRate)
	case o.KubeletRequestTimeout < 0:
		return fmt.Errorf("pleg: KubeletRequestTimeout %v is negative", o.KubeletRequestTimeout)
	case o.Events != EventsAuto && o.Events != EventsOn && o.Events != EventsOff:
		return fmt.Errorf("pleg: unknown Events mode %q (want auto, on or off)", o.Events)
	}
	return nil
}

// adaptive reports whether the adaptive global relist is on.
func (o *Options) adaptive() bool { return o.MaxRelistPeriod > o.RelistPeriod }

// coreConfig is the core's part of the options.
func (o *Options) coreConfig() coreConfig {
	cfg := coreConfig{period: o.RelistPeriod, maxPeriod: o.MaxRelistPeriod, trust: AdaptiveTrust, manual: true, slots: o.MaxParallelInspections,
		timeout: o.PodInspectionTimeout, statusTimeout: o.PodInspectionTimeout, full: o.FullInspection,
		budget: hintBudget{rate: o.PodRelistRate, burst: o.PodRelistBurst, spacing: o.PodRelistSpacing,
			early: o.EarlyRelistGap, queue: o.PodRelistQueue}}
	if o.PodInspectionTimeout < 0 {
		// The kubelet has no single-pod relists: its "no limit" does not
		// apply to them.
		cfg.timeout, cfg.statusTimeout = DefaultPodInspectionTimeout, 0
	}
	return cfg
}

// Generator is a pod lifecycle event generator: it relists the runtime,
// emits events for what changed and keeps the pod status cache fresh.
//
// One goroutine (the loop, loop.go) owns its state; the exported methods
// are safe for concurrent use and read what the loop publishes.
type Generator struct {
	opts  Options
	cache *podcache.Cache
	clock clock.WithTicker
	log   logr.Logger
	m     *metrics.Metrics

	// Owned by the loop (or by Relist's caller, for generators driven by
	// hand).
	core     *core
	pool     *pool
	logs     *logLimiter
	lastStat RelistStat
	// labeled: counters of the hint notes, by vector and label, resolved
	// once (the notes come with every runtime event).
	labeled map[labeledKey]prometheus.Counter

	// What the loop publishes.
	lastRelist         atomic.Int64 // the health timestamp, Unix nanoseconds; 0 before the first
	relistRunningSince atomic.Int64 // the start of the relist running now (0: none)
	nextPeriod         atomic.Int64 // the last relist's RelistStat.NextPeriod
	abandoned          atomic.Int64 // abandoned calls out
	stats              statsRing
	deliver            *hub
	journal            *journal.Journal
	subs               subscriptions
	stream             eventStream
	forecast           *forecast.Tracker

	inbox *inbox

	// lifecycle guards started and the start of goroutines against
	// Stop; it is never held across runtime I/O. manual serializes
	// Relist calls, which step the core on their caller's goroutine.
	lifecycle sync.Mutex
	manual    sync.Mutex
	started   bool
	cancel    context.CancelFunc
	rootCtx   context.Context
	wg        sync.WaitGroup // every goroutine the generator starts
}

// New returns a Generator. It does no I/O until Start.
func New(opts Options) (*Generator, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Generator{
		opts:    opts,
		cache:   opts.Cache,
		clock:   opts.Clock,
		log:     opts.Logger,
		m:       opts.Metrics,
		core:    newCore(opts.coreConfig()),
		inbox:   newInbox(opts.PodRelistQueue),
		rootCtx: ctx,
		cancel:  cancel,
	}
	g.pool = newPool(ctx, opts.Runtime, &g.wg, g.m)
	g.logs = newLogLimiter(g.log, g.m)
	g.labeled = make(map[labeledKey]prometheus.Counter)
	g.stream.status = EventStreamStatus{Mode: opts.Events, State: StreamOff}
	g.deliver = newHub(opts.ChannelCapacity, g.log, g.m)
	jo := opts.Journal
	jo.Clock = opts.Clock
	jo.OnIdentityWanted = g.SetIdentityWanted
	g.journal = journal.New(jo)
	g.m.TrackRelistProgress(g.RelistRunningFor)
	g.forecast = newForecast(opts)
	g.m.TrackForecast(g.forecastGauges)
	if opts.adaptive() {
		// The cache's timestamp moves between global relists only while a
		// reader waits (core_adapt.go): one that starts to wait wakes the
		// loop.
		g.cache.SetWaitHook(g.inbox.signal)
	}
	return g, nil
}

// Cache returns the pod status cache the generator keeps fresh.
func (g *Generator) Cache() *podcache.Cache { return g.cache }

// Start starts relisting: the first relist at once, then one period after
// the end of each. It returns at once; Stop ends it.
func (g *Generator) Start() {
	g.manual.Lock() // a Relist running steps the core: it ends first
	defer g.manual.Unlock()
	g.lifecycle.Lock()
	defer g.lifecycle.Unlock()
	if g.started || g.rootCtx.Err() != nil {
		return
	}
	g.started = true
	g.core.cfg.manual = false
	if g.opts.Events != EventsOff && g.opts.EventSource != nil {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.watchEvents(g.rootCtx, g.opts.EventSource)
		}()
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.run(g.rootCtx)
	}()
}

// Stop stops relisting, waits for every goroutine of the generator to end
// and closes the Watch channel; it ends every subscription (their Next
// returns ErrStopped) and closes their journal watchers. It is idempotent.
func (g *Generator) Stop() {
	// Cancel first, without the lock: a Relist running ends at once
	// (its calls and its wait end with the generator's context). Then
	// the lock: a Start or Relist that got past its check has added
	// its goroutine to wg by the time it is let go.
	g.cancel()
	g.lifecycle.Lock()
	g.lifecycle.Unlock() // an empty critical section: see above
	g.wg.Wait()
	g.deliver.close()
	g.endSubscriptions()
}

// Watch returns the kubelet-compatible event channel (capacity
// Options.ChannelCapacity). Sends never block: when the channel is full the
// event is dropped, counted in kubelet_pleg_discard_events and logged, as
// in the kubelet. Use Subscribe for delivery that loses nothing. The
// channel exists from the first call on; events before it are not queued.
func (g *Generator) Watch() <-chan *Event { return g.deliver.watch() }

// Journal returns the lifecycle stream's journal: every pod change and
// runtime status change, for watchers that resume by cursor.
func (g *Generator) Journal() *journal.Journal { return g.journal }

// RequestRelist asks for a relist of one pod (for example because
// something suggests it changed). It is a hint: it is served within the
// hint budget, and skipped when a global relist that started after it
// covers it. It never blocks; it returns false when the inbox is full (the
// next global relist covers the pod).
func (g *Generator) RequestRelist(uid types.UID) bool {
	return g.hint(hintIn{uid: uid, at: g.clock.Now()})
}

// SetIdentityWanted says whether some consumer wants containers'
// identities (init PID, cgroup path): while it does, the generator fetches
// them once per running container (one verbose status call each) and
// publishes them in the journal (PodUpdated). The journal calls it as its
// watchers that ask for identities (the lifecycle API's "identity" field)
// come and go.
func (g *Generator) SetIdentityWanted(wanted bool) { g.inbox.identityWanted(wanted) }

// RequestReinspect makes the next relist of pod uid inspect it even if
// nothing changed in its listing, emitting PodSync if no other event
// results. It is never dropped.
func (g *Generator) RequestReinspect(uid types.UID) { g.inbox.reinspectPod(uid) }

// DoubtRuntime tells the generator that the runtime may have stopped
// answering: a call to it outside the generator (the readiness check's
// Status, ReadinessOptions.Stalled) is slow or failed. A stretched
// relist falls back to its base period and the next global relist comes
// forward, so that a listing soon tells, and the forecast with it. Cheap
// and never blocking; doubts not taken yet coalesce.
func (g *Generator) DoubtRuntime() { g.inbox.doubtRuntime() }

var (
	errRelistStarted   = errors.New("pleg: Relist called on a started generator")
	errRelistStopped   = errors.New("pleg: Relist called on a stopped generator")
	errStoppedInRelist = errors.New("pleg: the generator was stopped during Relist")
)

// RelistThreshold returns the health threshold in force.
func (g *Generator) RelistThreshold() time.Duration { return g.opts.RelistThreshold }

// InspectionsOutstanding returns how many abandoned pod inspections have
// not returned yet.
func (g *Generator) InspectionsOutstanding() int { return int(g.abandoned.Load()) }

// Healthy reports whether a relist has succeeded recently enough: false
// before the first successful relist and when the last one started more
// than the relist threshold ago.
func (g *Generator) Healthy() (bool, error) {
	last := g.lastRelist.Load()
	if last == 0 {
		return false, errors.New("pleg has yet to be successful")
	}
	if elapsed := g.clock.Since(time.Unix(0, last)); elapsed > g.opts.RelistThreshold {
		return false, &NotHealthyError{Elapsed: elapsed, Threshold: g.opts.RelistThreshold}
	}
	return true, nil
}

// LastRelist returns the start of the last successful global relist, or the
// zero time.
func (g *Generator) LastRelist() time.Time {
	if last := g.lastRelist.Load(); last != 0 {
		return time.Unix(0, last)
	}
	return time.Time{}
}

// RelistPeriodNow returns the period the last global relist's end set to
// the next: RelistPeriod, or, with the adaptive relist, the period as far
// as it has stretched. 0 before a started generator's first relist ends.
// A fall back to RelistPeriod between relists (the event stream lost)
// shows once the relist it brings forward ends.
func (g *Generator) RelistPeriodNow() time.Duration {
	return time.Duration(g.nextPeriod.Load())
}

// StretchedRelistPeriod returns RelistPeriodNow while the adaptive relist
// has stretched it above RelistPeriod, and 0 otherwise (at the base
// period, or the adaptive relist off: a long fixed RelistPeriod is not a
// stretch). The daemon's readiness check follows it (ReadinessOptions.Period).
func (g *Generator) StretchedRelistPeriod() time.Duration {
	if p := g.RelistPeriodNow(); p > g.opts.RelistPeriod {
		return p
	}
	return 0
}

// RelistRunningFor returns how long the relist now running has been
// running, or 0.
func (g *Generator) RelistRunningFor() time.Duration {
	since := g.relistRunningSince.Load()
	if since == 0 {
		return 0
	}
	return g.clock.Since(time.Unix(0, since))
}

// NotHealthyError is the error of Healthy when the last successful relist is
// older than the threshold.
type NotHealthyError struct {
	Elapsed, Threshold time.Duration
}

func (e *NotHealthyError) Error() string {
	return "pleg was last seen active " + e.Elapsed.String() + " ago; threshold is " + e.Threshold.String()
}

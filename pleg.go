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
	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/podcache"
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
	DefaultSubscriberBuffer       = 10000
	DefaultPodRelistQueue         = 4096
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
	// the start of the next. Default 1s.
	RelistPeriod time.Duration
	// RelistThreshold is how long without a successful relist makes the
	// generator unhealthy. Default 3m.
	RelistThreshold time.Duration
	// ChannelCapacity is the capacity of the kubelet-compatible Watch
	// channel. Default 1000.
	ChannelCapacity int
	// MaxParallelInspections bounds how many changed pods are inspected at
	// once. 1 inspects them one after another, as the kubelet does.
	// Default 16.
	MaxParallelInspections int
	// PodInspectionTimeout bounds how long a relist waits for one pod's
	// status. A pod that exceeds it is handled as a failed inspection and
	// reinspected later. Negative disables it (wait as long as the runtime
	// request timeout allows, as the kubelet does). Default 10s.
	PodInspectionTimeout time.Duration
	// FullInspection makes every inspection of a changed pod fetch the
	// status of all its sandboxes and containers, as the kubelet does. By
	// default, when the Runtime implements cruntime.ItemStatuser, only the
	// items whose listing changed since their last status are fetched and
	// the others' last statuses reused (docs/semantics.md, "Delta
	// inspection").
	FullInspection bool
	// SubscriberBuffer is how many undelivered events one subscription
	// holds before it is resynced. Default 10000.
	SubscriberBuffer int
	// PodRelistQueue bounds the queue of single-pod relist requests.
	// Default 4096.
	PodRelistQueue int
	// Events says whether to use the runtime's container event stream as
	// hints that trigger single-pod relists. Default EventsAuto.
	Events EventsMode
	// EventSource is the event stream; the Runtime when it implements
	// cruntime.EventSource and this is nil.
	EventSource cruntime.EventSource
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
	if o.RelistPeriod == 0 {
		o.RelistPeriod = DefaultRelistPeriod
	}
	if o.RelistThreshold == 0 {
		o.RelistThreshold = DefaultRelistThreshold
	}
	if o.ChannelCapacity == 0 {
		o.ChannelCapacity = DefaultChannelCapacity
	}
	if o.MaxParallelInspections == 0 {
		o.MaxParallelInspections = DefaultMaxParallelInspections
	}
	if o.PodInspectionTimeout == 0 {
		o.PodInspectionTimeout = DefaultPodInspectionTimeout
	}
	if o.SubscriberBuffer == 0 {
		o.SubscriberBuffer = DefaultSubscriberBuffer
	}
	if o.PodRelistQueue == 0 {
		o.PodRelistQueue = DefaultPodRelistQueue
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
	case o.RelistPeriod < 0:
		return errors.New("pleg: RelistPeriod must not be negative")
	case o.RelistThreshold < 0:
		return errors.New("pleg: RelistThreshold must not be negative")
	case o.ChannelCapacity < 0:
		return errors.New("pleg: ChannelCapacity must not be negative")
	case o.MaxParallelInspections < 0:
		return errors.New("pleg: MaxParallelInspections must not be negative")
	case o.SubscriberBuffer < 0 || o.PodRelistQueue < 0:
		return errors.New("pleg: SubscriberBuffer and PodRelistQueue must not be negative")
	case o.Events != EventsAuto && o.Events != EventsOn && o.Events != EventsOff:
		return fmt.Errorf("pleg: unknown Events mode %q (want auto, on or off)", o.Events)
	}
	return nil
}

// Generator is a pod lifecycle event generator: it relists the runtime,
// emits events for what changed and keeps the pod status cache fresh.
//
// Every relist runs on one goroutine owned by the Generator; the exported
// methods are safe for concurrent use.
type Generator struct {
	opts  Options
	rt    cruntime.Runtime
	cache *podcache.Cache
	clock clock.WithTicker
	log   logr.Logger
	m     *metrics.Metrics

	// Owned by the relist goroutine: the kubelet's rules (core.go).
	core *core
	// listing is the last global listing that was checked and counted in
	// the gauges: a runtime that returns the same pods again (cruntime/cri
	// does when nothing changed) needs neither again.
	listing []*cruntime.Pod
	// again: pods to relist on their own when their single-pod relist
	// call returns (a hint or a global relist came while it was out).
	again map[types.UID]struct{}
	// podCalls is how many single-pod relist calls are out (not
	// abandoned); podResults hands them back to the relist goroutine.
	podCalls   int
	podResults chan *inspection

	// lastRelist is the start of the last successful global relist (the
	// health timestamp), as Unix nanoseconds; 0 before the first.
	lastRelist atomic.Int64
	// relistRunningSince is the start of the relist running now (0: none).
	relistRunningSince atomic.Int64

	inflight inflightSet
	requests requestQueue
	deliver  *hub
	stream   eventStream
	stats    statsRing

	extReinspectMu sync.Mutex
	// extReinspect: RequestReinspect's pods, each with the number of its
	// request (extSeq), so that a single-pod relist clears only a request
	// it has served.
	extReinspect map[types.UID]uint64
	extSeq       uint64

	lifecycle sync.Mutex
	started   bool
	cancel    context.CancelFunc
	rootCtx   context.Context
	wg        sync.WaitGroup // every goroutine the generator starts
	done      chan struct{}
}

// New returns a Generator. It does no I/O until Start.
func New(opts Options) (*Generator, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Generator{
		opts:         opts,
		rt:           opts.Runtime,
		cache:        opts.Cache,
		clock:        opts.Clock,
		log:          opts.Logger,
		m:            opts.Metrics,
		core:         newCore(opts.FullInspection),
		again:        make(map[types.UID]struct{}),
		extReinspect: make(map[types.UID]uint64),
		rootCtx:      ctx,
		cancel:       cancel,
		done:         make(chan struct{}),
	}
	g.inflight.pods = make(map[types.UID]*inspection)
	g.podResults = make(chan *inspection, max(1, opts.MaxParallelInspections))
	g.requests.init(opts.PodRelistQueue)
	g.stream.hints = make(map[types.UID]time.Time)
	g.stream.status = EventStreamStatus{Mode: opts.Events, State: StreamOff}
	g.deliver = newHub(opts.ChannelCapacity, opts.SubscriberBuffer, g.log, g.m)
	g.m.TrackRelistProgress(g.RelistRunningFor)
	return g, nil
}

// Cache returns the pod status cache the generator keeps fresh.
func (g *Generator) Cache() *podcache.Cache { return g.cache }

// Start starts relisting: the first relist at once, then one period after
// the end of each. It returns at once; Stop ends it.
func (g *Generator) Start() {
	g.lifecycle.Lock()
	defer g.lifecycle.Unlock()
	if g.started || g.rootCtx.Err() != nil {
		return
	}
	g.started = true
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
		defer close(g.done)
		g.run(g.rootCtx)
	}()
}

// Stop stops relisting, waits for every goroutine of the generator to end
// and closes the Watch channel and every subscription. It is idempotent.
func (g *Generator) Stop() {
	g.lifecycle.Lock()
	g.cancel()
	g.lifecycle.Unlock()
	g.wg.Wait()
	g.deliver.close()
}

// Watch returns the kubelet-compatible event channel (capacity
// Options.ChannelCapacity). Sends never block: when the channel is full the
// event is dropped, counted in kubelet_pleg_discard_events and logged, as
// in the kubelet. Use Subscribe for delivery that loses nothing. The
// channel exists from the first call on; events before it are not queued.
func (g *Generator) Watch() <-chan *Event { return g.deliver.watch() }

// Subscribe returns a subscription that receives every event, in order per
// pod. Its first update is a resync with the state of every pod; a
// subscription that falls more than Options.SubscriberBuffer events behind
// gets a resync instead of the events it missed. Close it when done.
func (g *Generator) Subscribe() *Subscription { return g.deliver.subscribe() }

// RequestRelist asks for a relist of one pod (for example because the
// runtime reported an event for it). Requests for the same pod coalesce;
// a request older than the start of the last global relist is skipped
// because that relist already covered it. It never blocks; it returns false
// when the bounded queue is full (the next global relist covers the pod).
func (g *Generator) RequestRelist(uid types.UID) bool {
	ok := g.requests.add(uid, g.clock.Now())
	if !ok {
		g.m.PodRelistQueueDropped.Inc()
		g.log.V(4).Info("Single-pod relist queue is full; the next relist covers the pod", "podUID", uid)
	}
	return ok
}

// RequestReinspect makes the next relist inspect pod uid even if nothing
// changed in its listing, emitting PodSync if no other event results.
func (g *Generator) RequestReinspect(uid types.UID) {
	g.extReinspectMu.Lock()
	g.extSeq++
	g.extReinspect[uid] = g.extSeq
	g.extReinspectMu.Unlock()
}

// Relist runs one global relist on the calling goroutine and returns the
// listing error, if any; then it runs the single-pod relists requested so
// far to the end. It is for generators that are driven by hand
// (benchmarks, tools, tests) and fails if Start was called.
func (g *Generator) Relist(ctx context.Context) error {
	g.lifecycle.Lock()
	defer g.lifecycle.Unlock()
	if g.started {
		return errors.New("pleg: Relist called on a started generator")
	}
	if g.rootCtx.Err() != nil {
		return errors.New("pleg: Relist called on a stopped generator")
	}
	err := g.relist(ctx)
	if serr := g.settlePodRelists(ctx); err == nil {
		err = serr
	}
	return err
}

// RelistThreshold returns the health threshold in force.
func (g *Generator) RelistThreshold() time.Duration { return g.opts.RelistThreshold }

// InspectionsOutstanding returns how many abandoned pod inspections have
// not returned yet.
func (g *Generator) InspectionsOutstanding() int { return g.inflight.Len() }

// run is the relist goroutine: the global relist every period, and in
// between, the single-pod relists' bookkeeping. It never waits for a
// single-pod relist's runtime call (see podrelist.go), so hints, however
// many and however slow their pods, delay a global relist by at most the
// handling of one result.
func (g *Generator) run(ctx context.Context) {
	var due time.Time // zero: the first relist is immediate
	for ctx.Err() == nil {
		if !g.clock.Now().Before(due) {
			g.relist(ctx)
			due = g.clock.Now().Add(g.opts.RelistPeriod)
		}
		g.dispatchPodRelists()
		timer := g.clock.NewTimer(due.Sub(g.clock.Now()))
		select {
		case <-ctx.Done():
		case <-timer.C():
		case <-g.requests.wake:
		case in := <-g.podResults:
			g.podCallDone(in)
		}
		timer.Stop()
	}
}

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

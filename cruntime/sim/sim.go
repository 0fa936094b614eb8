package sim

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"
)

// Runtime is a simulated container runtime: a node model plus a CRI v1
// RuntimeService gRPC server over it. It is safe for concurrent use.
type Runtime struct {
	clock       clock.Clock
	eventBuffer int
	crioMux     bool
	kubeletMeta bool

	// mu guards the model, the workload settings and the subscribers.
	// Lock order: mu before kmu.
	mu         sync.Mutex
	rng        *rand.Rand
	step       uint64
	pods       map[string]*pod
	order      []*pod // creation order
	sandboxes  map[string]*sandbox
	containers map[string]*container
	ipNext     uint32
	subs       []*subscriber
	kept       []*runtimeapi.ContainerEventResponse // events emitted while nobody subscribed (SetKeepEvents)
	churn      int
	replace    int // pods replaced per Step (Config.ReplacePerStep)
	sbAnnBytes int // Config.SandboxAnnotationBytes
	mix        Mix
	keepExited int

	// kmu guards the fault knobs and the fault generator.
	kmu            sync.Mutex
	frng           *rand.Rand
	latency        Latency
	errorRate      float64
	events         bool
	listStreaming  bool
	streamBatch    int
	dropRate       float64
	reorderRate    float64
	hung           map[string]bool
	hungLists      map[string]bool
	hungChanged    chan struct{}         // closed and replaced when hung or hungLists changes
	emitters       map[string]*generator // EmitEvents, by pod UID
	storm          *generator            // SetEventStorm (nil: none)
	stormEvents    StormEvents           // SetStormEvents
	keepEvents     time.Duration         // SetKeepEvents
	replayN        int                   // SetReplay
	replayAge      time.Duration
	runtimeReady   bool
	notReadyReason string
	notReadyMsg    string

	callsMu  sync.Mutex
	calls    map[string]int64
	podCalls map[string]map[string]int64 // pod UID -> method -> calls

	evEmitted, evQueued, evDroppedFull, evDroppedRandom, evReordered atomic.Int64

	// smu guards serving.
	smu       sync.Mutex
	path      string
	srv       *grpc.Server
	genQuit   chan struct{} // closed when the current server goes away
	serveDone chan struct{}
	stopped   bool
	stopCh    chan struct{}
	wg        sync.WaitGroup // owned goroutines (Run, Serve)

	handlers tracker
}

// New returns a simulated runtime with cfg.Pods running pods. It does not
// serve until Serve is called.
func New(cfg Config) *Runtime {
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	r := &Runtime{
		clock:         clk,
		eventBuffer:   cfg.EventBuffer,
		crioMux:       cfg.CRIOMux,
		kubeletMeta:   cfg.KubeletMetadata,
		rng:           rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		pods:          map[string]*pod{},
		sandboxes:     map[string]*sandbox{},
		containers:    map[string]*container{},
		ipNext:        2,
		churn:         max(cfg.ChurnPerStep, 0),
		replace:       max(cfg.ReplacePerStep, 0),
		sbAnnBytes:    max(cfg.SandboxAnnotationBytes, 0),
		mix:           cfg.Mix,
		keepExited:    cfg.KeepExitedAttempts,
		frng:          rand.New(rand.NewPCG(cfg.Seed^0x5851f42d4c957f2d, cfg.Seed+1)),
		latency:       cfg.Latency,
		errorRate:     clamp01(cfg.ErrorRate),
		events:        !cfg.DisableEvents,
		listStreaming: !cfg.DisableListStreaming,
		streamBatch:   cfg.ListStreamBatch,
		dropRate:      clamp01(cfg.EventDropRate),
		reorderRate:   clamp01(cfg.EventReorderRate),
		hung:          map[string]bool{},
		hungLists:     map[string]bool{},
		hungChanged:   make(chan struct{}),
		emitters:      map[string]*generator{},
		keepEvents:    max(cfg.KeepEvents, 0),
		replayN:       max(cfg.ReplayEvents, 0),
		replayAge:     cfg.ReplayAge,
		runtimeReady:  true,
		calls:         map[string]int64{},
		podCalls:      map[string]map[string]int64{},
		stopCh:        make(chan struct{}),
	}
	if r.eventBuffer <= 0 {
		r.eventBuffer = 1000
	}
	if r.mix.total() <= 0 {
		r.mix = DefaultMix
	}
	switch {
	case r.keepExited == 0:
		r.keepExited = 1
	case r.keepExited < 0:
		r.keepExited = 0
	}
	perPod := cfg.ContainersPerPod
	if perPod <= 0 {
		perPod = 1
	}
	if r.replayAge <= 0 {
		r.replayAge = DefaultReplayAge
	}
	r.mu.Lock()
	for i := 0; i < cfg.Pods; i++ {
		p := r.newWorkloadPodLocked(r.pickBehaviourLocked(), perPod, "", "")
		if i < cfg.HangPods {
			r.hung[p.uid] = true
		}
	}
	r.mu.Unlock()
	for _, uid := range cfg.HangUIDs {
		r.hung[uid] = true
	}
	if cfg.HangLists {
		for uid := range r.hung {
			r.hungLists[uid] = true
		}
	}
	// The event generators start with the runtime (they emit whether or
	// not anyone serves or subscribes, as a runtime's containers flap
	// whether or not anyone watches).
	if cfg.HungPodEvents > 0 {
		for _, uid := range r.Hung() {
			r.EmitEvents(uid, cfg.HungPodEvents)
		}
	}
	if cfg.EventStorm > 0 {
		r.SetEventStorm(cfg.EventStorm)
	}
	return r
}

// Knobs. Every setter is safe for concurrent use and takes effect for the
// next call (SetHung also for calls already hanging).

// SetLatency sets the latency of unary calls.
func (r *Runtime) SetLatency(l Latency) {
	r.kmu.Lock()
	r.latency = l
	r.kmu.Unlock()
}

// SetErrorRate sets the fraction of calls that fail (clamped to [0, 1]).
func (r *Runtime) SetErrorRate(rate float64) {
	r.kmu.Lock()
	r.errorRate = clamp01(rate)
	r.kmu.Unlock()
}

// SetEventReorderRate sets the fraction of events each subscriber gets
// out of order (clamped to [0, 1]): such an event is held back and sent
// right after the next one sent to that subscriber, so that the two
// arrive swapped. One is held at a time per subscriber; one still held
// when its subscriber's stream ends, or when no other event follows, is
// never sent (as a runtime that loses it).
func (r *Runtime) SetEventReorderRate(rate float64) {
	r.kmu.Lock()
	r.reorderRate = clamp01(rate)
	r.kmu.Unlock()
}

// SetEventDropRate sets the fraction of events not sent (clamped to [0, 1]).
func (r *Runtime) SetEventDropRate(rate float64) {
	r.kmu.Lock()
	r.dropRate = clamp01(rate)
	r.kmu.Unlock()
}

// SetEvents switches container events on or off. Switching them off ends
// every open GetContainerEvents stream with codes.Unimplemented, as does
// every later call, until they are switched on again.
// SetListStreaming turns the streaming list RPCs (StreamPodSandboxes,
// StreamContainers) on or off (Unimplemented), and sets the items per
// message when batch is positive; calls in flight are not affected.
func (r *Runtime) SetListStreaming(on bool, batch int) {
	r.kmu.Lock()
	r.listStreaming = on
	if batch > 0 {
		r.streamBatch = batch
	}
	r.kmu.Unlock()
}

// listStreamingBatch returns the items per message of a streamed listing,
// or 0 when streaming lists are off.
func (r *Runtime) listStreamingBatch() int {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	if !r.listStreaming {
		return 0
	}
	if r.streamBatch > 0 {
		return r.streamBatch
	}
	return DefaultListStreamBatch
}

func (r *Runtime) SetEvents(on bool) {
	r.kmu.Lock()
	r.events = on
	r.kmu.Unlock()
	if !on {
		r.closeSubscribers()
	}
}

// SetHung makes the PodSandboxStatus and ContainerStatus calls for the
// sandboxes and containers of pod uid hang (or answer again).
func (r *Runtime) SetHung(uid string, hung bool) {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	r.setHungLocked(r.hung, uid, hung)
}

// SetHungLists makes the list calls filtered to pod uid hang (or answer
// again): ListPodSandbox and ListContainers whose filter selects the pod by
// its UID label (io.kubernetes.pod.uid), by the ID of one of its sandboxes
// (Id, or PodSandboxId for containers) or by the ID of one of its
// containers. Unfiltered list calls, and list calls filtered otherwise (by
// state, by other labels), keep answering. It is independent of SetHung;
// a runtime whose pod is stuck (a blocked shim, say) typically has both.
func (r *Runtime) SetHungLists(uid string, hung bool) {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	r.setHungLocked(r.hungLists, uid, hung)
}

func (r *Runtime) setHungLocked(set map[string]bool, uid string, hung bool) {
	if set[uid] == hung {
		return
	}
	if hung {
		set[uid] = true
	} else {
		delete(set, uid)
	}
	close(r.hungChanged)
	r.hungChanged = make(chan struct{})
}

// Hung returns the UIDs of the pods whose status calls hang, sorted.
func (r *Runtime) Hung() []string {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return slices.Sorted(maps.Keys(r.hung))
}

// HungLists returns the UIDs of the pods whose filtered list calls hang,
// sorted.
func (r *Runtime) HungLists() []string {
	r.kmu.Lock()
	defer r.kmu.Unlock()
	return slices.Sorted(maps.Keys(r.hungLists))
}

// SetRuntimeReady sets the RuntimeReady condition that Status reports; when
// not ready, reason and message explain why.
func (r *Runtime) SetRuntimeReady(ready bool, reason, message string) {
	r.kmu.Lock()
	r.runtimeReady, r.notReadyReason, r.notReadyMsg = ready, reason, message
	r.kmu.Unlock()
}

// SetChurn sets the number of workload actions per Step.
func (r *Runtime) SetChurn(n int) {
	r.mu.Lock()
	r.churn = max(n, 0)
	r.mu.Unlock()
}

// Calls returns the number of calls received per CRI method name (for
// example "ListContainers"), counted whether they succeeded or not.
func (r *Runtime) Calls() map[string]int64 {
	r.callsMu.Lock()
	defer r.callsMu.Unlock()
	out := make(map[string]int64, len(r.calls))
	for k, v := range r.calls {
		out[k] = v
	}
	return out
}

// PodCalls returns the number of calls received for pod uid per CRI
// method name: PodSandboxStatus and ContainerStatus calls for its sandboxes
// and containers, and ListPodSandbox and ListContainers calls whose filter
// selects it (see SetHungLists). Calls are counted when they reach the
// model, hung or not; calls failed by the error rate or for IDs the model
// does not know are not counted here (they are in Calls).
func (r *Runtime) PodCalls(uid string) map[string]int64 {
	r.callsMu.Lock()
	defer r.callsMu.Unlock()
	out := make(map[string]int64, len(r.podCalls[uid]))
	for k, v := range r.podCalls[uid] {
		out[k] = v
	}
	return out
}

// ResetCalls sets every call counter back to zero (Calls and PodCalls).
func (r *Runtime) ResetCalls() {
	r.callsMu.Lock()
	clear(r.calls)
	clear(r.podCalls)
	r.callsMu.Unlock()
}

func (r *Runtime) countCall(method string) {
	r.callsMu.Lock()
	r.calls[method]++
	r.callsMu.Unlock()
}

func (r *Runtime) countPodCall(uid, method string) {
	r.callsMu.Lock()
	m := r.podCalls[uid]
	if m == nil {
		m = map[string]int64{}
		r.podCalls[uid] = m
	}
	m[method]++
	r.callsMu.Unlock()
}

// Serving.

// ErrStopped is returned when serving a runtime that was stopped.
var ErrStopped = errors.New("sim: runtime stopped")

// Service returns the CRI RuntimeService implementation, for callers that
// run their own gRPC server. Faults apply as with Serve (except GoAway).
func (r *Runtime) Service() runtimeapi.RuntimeServiceServer { return &service{r: r} }

// Serve listens on the unix socket socketPath (a stale socket file there is
// removed) and serves the CRI RuntimeService on it from an owned goroutine.
// It returns once the socket accepts connections.
func (r *Runtime) Serve(socketPath string) error {
	r.smu.Lock()
	defer r.smu.Unlock()
	if r.stopped {
		return ErrStopped
	}
	if r.path != "" {
		return fmt.Errorf("sim: already serving on %s", r.path)
	}
	if err := r.listenLocked(socketPath); err != nil {
		return err
	}
	r.path = socketPath
	return nil
}

func (r *Runtime) listenLocked(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		_ = os.Remove(path)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(16<<20), grpc.MaxSendMsgSize(16<<20))
	runtimeapi.RegisterRuntimeServiceServer(srv, &service{r: r})
	runtimeapi.RegisterImageServiceServer(srv, &imageService{r: r})
	r.srv = srv
	r.genQuit = make(chan struct{})
	done := make(chan struct{})
	r.serveDone = done
	served := lis
	var mux cmux.CMux
	if r.crioMux {
		mux = cmux.New(lis)
		served = mux.MatchWithWriters(cmux.HTTP2MatchHeaderFieldSendSettings("content-type", "application/grpc"))
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = mux.Serve() // ends when srv.Stop closes served, or lis fails
		}()
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		_ = srv.Serve(served)
		if mux != nil {
			mux.Close()
			_ = lis.Close()
		}
	}()
	return nil
}

// shutdownLocked stops the current server, if any, and removes its socket.
func (r *Runtime) shutdownLocked() {
	if r.srv == nil {
		return
	}
	close(r.genQuit)
	r.srv.Stop()
	<-r.serveDone
	r.srv, r.serveDone = nil, nil
	_ = os.Remove(r.path)
}

// quitChan returns a channel closed when the server currently serving goes
// away (nil when not serving, e.g. calls through Service).
func (r *Runtime) quitChan() chan struct{} {
	r.smu.Lock()
	defer r.smu.Unlock()
	return r.genQuit
}

// Endpoint returns the CRI endpoint, "unix://" + the socket path, or "" if
// Serve was never called.
func (r *Runtime) Endpoint() string {
	r.smu.Lock()
	defer r.smu.Unlock()
	if r.path == "" {
		return ""
	}
	return "unix://" + r.path
}

// GoAway simulates the runtime going away: the server stops, open calls and
// streams fail, and the socket is removed. The model is kept.
func (r *Runtime) GoAway() {
	r.smu.Lock()
	defer r.smu.Unlock()
	r.shutdownLocked()
}

// ComeBack serves again on the socket path of Serve, with the same model,
// after GoAway. It does nothing when already serving.
func (r *Runtime) ComeBack() error {
	r.smu.Lock()
	defer r.smu.Unlock()
	switch {
	case r.stopped:
		return ErrStopped
	case r.path == "":
		return errors.New("sim: ComeBack before Serve")
	case r.srv != nil:
		return nil
	}
	return r.listenLocked(r.path)
}

// Serving reports whether the server is up (Serve or ComeBack called and
// neither GoAway nor Stop since).
func (r *Runtime) Serving() bool {
	r.smu.Lock()
	defer r.smu.Unlock()
	return r.srv != nil
}

// Stop stops serving, removes the socket, ends hung calls and event
// streams, stops Run, and waits for every goroutine the runtime started and
// every call in progress. It is idempotent.
func (r *Runtime) Stop() {
	r.smu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.stopCh)
	}
	r.shutdownLocked()
	r.smu.Unlock()
	r.handlers.closeAndWait()
	r.wg.Wait()
}

// tracker counts calls in progress; once closed it admits none.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{}
}

func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) exit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	if t.zero == nil {
		t.zero = make(chan struct{})
	}
	z := t.zero
	t.mu.Unlock()
	<-z
}

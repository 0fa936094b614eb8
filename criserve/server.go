// Package criserve serves the CRI (runtime.v1.RuntimeService and
// runtime.v1.ImageService) read-only, for the node's unmodified agents,
// from a generator's journal instead of from the runtime:
//
//   - from pleg's state, with no runtime call: ListPodSandbox,
//     ListContainers and their streamed forms, non-verbose PodSandboxStatus
//     and ContainerStatus, Status (the conditions pleg's readiness check
//     last saw), and GetContainerEvents from the journal;
//   - passed through to the runtime, bounded (a concurrency limit, a rate
//     and a timeout per call): verbose statuses, images, stats, metrics and
//     the runtime's config; Version is cached;
//   - refused with PermissionDenied, never reaching the runtime: every
//     other method of the generated services, so that a method cri-api adds
//     later is refused until it is classified here.
//
// A pod-scoped server (Config.Scope) shows a caller only its own pod,
// found from its peer credentials. docs/cri.md states what differs from the
// runtime's own answers.
package criserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/internal/unixgrpc"
	"github.com/podlifecycle/pleg/journal"
)

// Defaults of Config.
const (
	DefaultTimeout         = 2 * time.Minute
	DefaultMaxInFlight     = 4
	DefaultRate            = 20
	DefaultBurst           = 40
	DefaultStallTimeout    = outbox.DefaultStallTimeout
	DefaultQueueSize       = 64
	DefaultMaxStreams      = 256
	DefaultMaxConnections  = 1024
	DefaultShutdownTimeout = 5 * time.Second
	DefaultVersionTTL      = time.Minute
)

// Conditions is where Status's answer comes from: the runtime's conditions
// as pleg's periodic Status call last saw them (pleg.Readiness).
type Conditions interface {
	RuntimeConditions() (conds []cruntime.Condition, at time.Time, lastErr error)
}

// Scope finds the pod of a caller of a pod-scoped server.
type Scope interface {
	// PodOf returns the pod whose container process pid runs in, as the
	// journal j knows it; ok is false when it is in none.
	PodOf(pid int32, j *journal.Journal) (pod *journal.Pod, ok bool)
}

// Config configures a Server. Journal is required; Runtime and Images are
// required for the passed-through calls (without them those answer
// Unavailable).
type Config struct {
	Journal *journal.Journal
	// Runtime and Images are the runtime's services, for the calls passed
	// through.
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	// Conditions answers Status (nil: Status is passed through).
	Conditions Conditions
	// Flag names the flag that serves this endpoint, in refusals
	// ("--cri-socket").
	Flag string
	// Scope, when set, makes the server pod-scoped: a caller sees only the
	// pod its process runs in (nothing when none), and the calls that
	// cannot be limited to one pod are refused.
	Scope Scope
	// Access restricts the peers of the unix socket (the lifecycle
	// socket's rules).
	Access unixgrpc.Access
	Logger logr.Logger
	// Metrics receives the pleg_cri_* metrics (none when nil), labelled
	// with Flag.
	Metrics *Metrics

	// Timeout bounds every passed-through call, its wait for admission
	// included (default DefaultTimeout).
	Timeout time.Duration
	// MaxInFlight passed-through calls run at once (default
	// DefaultMaxInFlight); more wait, within Timeout.
	MaxInFlight int
	// Rate and Burst bound the passed-through calls per second (a token
	// bucket; defaults DefaultRate and DefaultBurst); a call that would
	// wait past its Timeout gets ResourceExhausted at once.
	Rate  float64
	Burst int
	// Verbose, if set, holds the verbose ContainerStatus answers pleg's
	// own relisting got (cri.WithVerboseStatuses with Verbose as its
	// sink): a verbose ContainerStatus of a container pleg inspected after
	// its last state change is answered from it, with no runtime call.
	// Servers may share one.
	Verbose *VerboseStore
	// VersionTTL is how long Version's answer is kept (default
	// DefaultVersionTTL).
	VersionTTL time.Duration

	// StallTimeout cuts a GetContainerEvents client that reads nothing for
	// this long while events wait (default DefaultStallTimeout).
	StallTimeout time.Duration
	// QueueSize is how many events a stream converts ahead of its client
	// (default DefaultQueueSize).
	QueueSize int
	// MaxStreams caps the GetContainerEvents streams open at once (default
	// DefaultMaxStreams); more get ResourceExhausted.
	MaxStreams int
	// MaxConnections caps each listener's open connections (default
	// DefaultMaxConnections).
	MaxConnections int
	// ShutdownTimeout bounds the graceful stop (default
	// DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Clock times the stall timeout, the rate and the version cache.
	Clock clock.WithTickerAndDelayedExecution
}

// Server serves the CRI from a journal. Create it with New, serve it with
// Serve (or Register it on a gRPC server of your own).
type Server struct {
	cfg    Config
	j      *journal.Journal
	log    logr.Logger
	slots  chan struct{} // passed-through calls in flight
	bucket *bucket
	events chan struct{} // one token per open GetContainerEvents
	// watching counts the GetContainerEvents streams watching the
	// journal (tests wait for it).
	watching atomic.Int32

	verbose  verboseCache
	vmu      sync.Mutex
	version  *runtimeapi.VersionResponse
	versionT time.Time

	stopping context.Context
	stop     context.CancelCauseFunc
	served   atomic.Bool
	senders  sync.WaitGroup
}

// New returns a server of cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Journal == nil {
		return nil, errors.New("CRI endpoint: Config.Journal is required")
	}
	if cfg.Timeout < 0 || cfg.MaxInFlight < 0 || cfg.Rate < 0 || cfg.Burst < 0 || cfg.StallTimeout < 0 || cfg.QueueSize < 0 ||
		cfg.MaxStreams < 0 || cfg.MaxConnections < 0 || cfg.ShutdownTimeout < 0 || cfg.VersionTTL < 0 {
		return nil, fmt.Errorf("CRI endpoint: negative limit in %+v", cfg)
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
	def(&cfg.Timeout, DefaultTimeout)
	def(&cfg.StallTimeout, DefaultStallTimeout)
	def(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	def(&cfg.VersionTTL, DefaultVersionTTL)
	defInt(&cfg.MaxInFlight, DefaultMaxInFlight)
	defInt(&cfg.Burst, DefaultBurst)
	defInt(&cfg.QueueSize, DefaultQueueSize)
	defInt(&cfg.MaxStreams, DefaultMaxStreams)
	defInt(&cfg.MaxConnections, DefaultMaxConnections)
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Flag == "" {
		cfg.Flag = "--cri-socket"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	if cfg.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		cfg.Metrics = m
	}
	s := &Server{cfg: cfg, j: cfg.Journal, log: cfg.Logger, slots: make(chan struct{}, cfg.MaxInFlight),
		bucket: newBucket(cfg.Clock, cfg.Rate, cfg.Burst), events: make(chan struct{}, cfg.MaxStreams)}
	s.stopping, s.stop = context.WithCancelCause(context.Background())
	s.verbose.stopping = s.stopping
	if cfg.Verbose != nil {
		cfg.Verbose.watch(cfg.Journal)
	}
	return s, nil
}

// errShutdown ends the event streams when Serve stops.
var errShutdown = errors.New("pleg is shutting down")

// served is how a full method name is served.
var served = Methods()

// method is the short name of a full method name.
func method(full string) string {
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[i+1:]
		}
	}
	return full
}

func (s *Server) count(full string) {
	how, ok := served[full]
	if !ok {
		how = Refused
	}
	s.cfg.Metrics.calls.WithLabelValues(s.cfg.Flag, method(full), string(how)).Inc()
}

func (s *Server) countUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	s.count(info.FullMethod)
	return h(ctx, req)
}

func (s *Server) countStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	s.count(info.FullMethod)
	return h(srv, ss)
}

// Register registers both services on g. Serve does it for its own
// servers, and also stops what the services start; with Register alone,
// stop g before the server is dropped (its event streams and verbose
// fetches end with their calls).
func (s *Server) Register(g *grpc.Server) {
	rd := guarded(runtimeapi.RuntimeService_ServiceDesc, runtimeMethods, s.cfg.Flag, s.log)
	g.RegisterService(&rd, &runtimeServer{s: s})
	id := guarded(runtimeapi.ImageService_ServiceDesc, imageMethods, s.cfg.Flag, s.log)
	g.RegisterService(&id, &imageServer{s: s})
}

// Serve serves on every listener until ctx ends or one fails; unix
// listeners check their peers (Config.Access) and tell handlers who calls.
// It returns nil after a stop caused by ctx. Serve may be called once.
func (s *Server) Serve(ctx context.Context, lns ...net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("CRI endpoint: Serve called twice")
	}
	servers := make([]*grpc.Server, len(lns))
	for i, ln := range lns {
		if _, unix := ln.Addr().(*net.UnixAddr); !unix {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("CRI endpoint: %s %s is not a unix socket: only unix sockets carry the peer credentials it checks", ln.Addr().Network(), ln.Addr())
		}
		g := grpc.NewServer(
			grpc.MaxRecvMsgSize(1<<20),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 2 * time.Minute}),
			grpc.Creds(unixgrpc.NewPeerCredentials("CRI endpoint", s.cfg.Access, s.log, s.cfg.Metrics.rejected.WithLabelValues(s.cfg.Flag))),
			grpc.ChainUnaryInterceptor(s.countUnary),
			grpc.ChainStreamInterceptor(s.countStream),
		)
		s.Register(g)
		servers[i] = g
	}
	errc := make(chan error, len(lns))
	for i, ln := range lns {
		go func() {
			err := servers[i].Serve(unixgrpc.LimitListener(ln, s.cfg.MaxConnections))
			if err != nil {
				err = fmt.Errorf("serving the CRI endpoint on %s: %w", ln.Addr(), err)
			}
			errc <- err
		}()
	}
	var err error
	pending := len(lns)
	select {
	case <-ctx.Done():
	case err = <-errc:
		pending--
	}
	s.stop(errShutdown)
	unixgrpc.StopAll(servers, s.cfg.ShutdownTimeout)
	for ; pending > 0; pending-- {
		if e := <-errc; err == nil {
			err = e
		}
	}
	s.senders.Wait()
	s.verbose.fetches.Wait()
	return err
}

// How says how a method is served.
type How string

const (
	FromState   How = "state"
	PassThrough How = "pass-through"
	Refused     How = "refused"
)

// runtimeMethods and imageMethods are the methods served, and how; every
// other method of the generated services is refused.
var runtimeMethods = map[string]How{
	"Version":                 PassThrough, // cached
	"Status":                  FromState,
	"ListPodSandbox":          FromState,
	"StreamPodSandboxes":      FromState,
	"PodSandboxStatus":        FromState, // verbose: pass-through
	"ListContainers":          FromState,
	"StreamContainers":        FromState,
	"ContainerStatus":         FromState, // verbose: pass-through
	"GetContainerEvents":      FromState,
	"ContainerStats":          PassThrough,
	"ListContainerStats":      PassThrough,
	"StreamContainerStats":    PassThrough,
	"PodSandboxStats":         PassThrough,
	"ListPodSandboxStats":     PassThrough,
	"StreamPodSandboxStats":   PassThrough,
	"ListMetricDescriptors":   PassThrough,
	"ListPodSandboxMetrics":   PassThrough,
	"StreamPodSandboxMetrics": PassThrough,
	"RuntimeConfig":           PassThrough,
}

var imageMethods = map[string]How{
	"ListImages":   PassThrough,
	"StreamImages": PassThrough,
	"ImageStatus":  PassThrough,
	"ImageFsInfo":  PassThrough,
}

// Methods returns how every method of both generated services is served,
// by full method name ("/runtime.v1.RuntimeService/Version").
func Methods() map[string]How {
	out := map[string]How{}
	for _, d := range []struct {
		desc   grpc.ServiceDesc
		served map[string]How
	}{{runtimeapi.RuntimeService_ServiceDesc, runtimeMethods}, {runtimeapi.ImageService_ServiceDesc, imageMethods}} {
		add := func(name string) {
			how, ok := d.served[name]
			if !ok {
				how = Refused
			}
			out["/"+d.desc.ServiceName+"/"+name] = how
		}
		for _, m := range d.desc.Methods {
			add(m.MethodName)
		}
		for _, m := range d.desc.Streams {
			add(m.StreamName)
		}
	}
	return out
}

// refusal is the error of a refused method.
func refusal(service, method, flag string) error {
	return status.Errorf(codes.PermissionDenied,
		"pleg's CRI endpoint (%s) is read-only: /%s/%s is refused (it may create, change, remove, exec, attach or forward); call the runtime's own socket",
		flag, service, method)
}

// guarded is desc with every method that served does not list answering
// PermissionDenied without decoding its request.
func guarded(desc grpc.ServiceDesc, served map[string]How, flag string, log logr.Logger) grpc.ServiceDesc {
	out := desc
	out.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		out.Methods[i] = m
		if _, ok := served[m.MethodName]; ok {
			continue
		}
		name := m.MethodName
		out.Methods[i].Handler = func(srv any, ctx context.Context, _ func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			refuse := func(ctx context.Context, _ any) (any, error) {
				log.V(1).Info("Refused a CRI call", "method", name, "peer", peerString(ctx))
				return nil, refusal(desc.ServiceName, name, flag)
			}
			if icpt == nil {
				return refuse(ctx, nil)
			}
			return icpt(ctx, nil, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + desc.ServiceName + "/" + name}, refuse)
		}
	}
	out.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, m := range desc.Streams {
		out.Streams[i] = m
		if _, ok := served[m.StreamName]; ok {
			continue
		}
		name := m.StreamName
		out.Streams[i].Handler = func(_ any, stream grpc.ServerStream) error {
			log.V(1).Info("Refused a CRI call", "method", name, "peer", peerString(stream.Context()))
			return refusal(desc.ServiceName, name, flag)
		}
	}
	return out
}

// peerOf returns the caller's credentials, when it came over a unix
// socket.
func peerOf(ctx context.Context) (unixgrpc.Peer, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return unixgrpc.Peer{}, false
	}
	pi, ok := p.AuthInfo.(unixgrpc.PeerInfo)
	return pi.Peer, ok
}

func peerString(ctx context.Context) string {
	if p, ok := peerOf(ctx); ok {
		return p.String()
	}
	return "unknown"
}

// view is what one call may see: every pod, or one pod, or none.
type view struct {
	all bool
	pod *journal.Pod // the caller's pod (nil and !all: none)
}

// viewOf is the view of the caller of ctx.
func (s *Server) viewOf(ctx context.Context) view {
	if s.cfg.Scope == nil {
		return view{all: true}
	}
	p, ok := peerOf(ctx)
	if !ok || p.PID <= 0 {
		return view{}
	}
	pod, ok := s.cfg.Scope.PodOf(p.PID, s.j)
	if !ok {
		return view{}
	}
	return view{pod: pod}
}

// pods are the current pods v sees, sorted.
func (s *Server) pods(v view) []*journal.Pod {
	if v.all {
		pods, _ := s.j.Pods(nil)
		return pods
	}
	if v.pod == nil {
		return nil
	}
	// The pod's current state (the view's may be older).
	if p, ok := s.j.Pod(v.pod.UID); ok {
		return []*journal.Pod{p}
	}
	return nil
}

// sees reports whether v sees pod p.
func (v view) sees(p *journal.Pod) bool {
	return v.all || v.pod != nil && p.UID == v.pod.UID
}

// scopeRefusal is the error of a call a pod-scoped server cannot limit to
// the caller's pod.
func (s *Server) scopeRefusal(method string) error {
	return status.Errorf(codes.PermissionDenied,
		"pleg's pod-scoped CRI endpoint (%s) refuses %s: its answer cannot be limited to the caller's pod", s.cfg.Flag, method)
}

// sortByID sorts items by the ID id returns, for stable answers.
func sortByID[T any](items []T, id func(T) string) {
	sort.Slice(items, func(i, k int) bool { return id(items[i]) < id(items[k]) })
}

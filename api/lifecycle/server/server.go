// Package server serves the node's lifecycle stream (service
// pleg.lifecycle.v1.Lifecycle, api/lifecycle/v1/lifecycle.proto) over gRPC
// from a generator's journal, with the standard gRPC health service and
// server reflection.
//
// Every Watch reads the shared journal through its own journal.Watcher
// (which holds no buffer: a watcher that reads nothing costs its position)
// and hands the converted messages to its stream through a bounded queue.
// A client that does not read for the stall timeout (DefaultStallTimeout)
// is cut with codes.ResourceExhausted and a message naming the cursor to
// resume from; no other watcher, and never the generator, waits for it.
//
// On a unix socket (ListenUnix: file mode and group set before it
// appears), every connection's peer credentials (SO_PEERCRED: UID, GID,
// PID) are logged and, with Access lists, checked. docs/stream.md states
// the contract.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/entrycache"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"github.com/podlifecycle/pleg/internal/unixgrpc"
	"github.com/podlifecycle/pleg/journal"
)

// Defaults of Config. The caps fit the DaemonSet's 128 Mi limit: a watch
// costs pleg ~58 KiB (TestIdleSubscribers), so 1,024 of them take ~58 MiB
// beside the ~25 MiB pleg needs itself; 4,096 would pass the limit and get
// pleg OOM-killed by a flood of connections.
const (
	DefaultStallTimeout    = outbox.DefaultStallTimeout
	DefaultQueueSize       = 64
	DefaultMaxWatchers     = 1024
	DefaultMaxConnections  = 1024
	DefaultShutdownTimeout = 5 * time.Second
	DefaultIdleTimeout     = 2 * time.Minute
)

// maxRequestSize bounds a request: a filter of a few thousand pod UIDs.
const maxRequestSize = 1 << 20

// Config configures a Server. Journal is required.
type Config struct {
	Journal *journal.Journal
	// Logger receives connections (with the peer's credentials), cuts,
	// resyncs and, at V(1), every watch's start and end.
	Logger logr.Logger
	// Registerer receives the pleg_lifecycle_* metrics (none when nil).
	Registerer prometheus.Registerer
	// StallTimeout: a watcher whose client reads nothing for this long
	// while messages wait for it is cut (default DefaultStallTimeout).
	StallTimeout time.Duration
	// QueueSize is how many messages a watch converts ahead of its
	// client (default DefaultQueueSize).
	QueueSize int
	// MaxWatchers caps the watches served at once (default
	// DefaultMaxWatchers); more get ResourceExhausted.
	MaxWatchers int
	// MaxConnections caps each listener's open connections (default
	// DefaultMaxConnections); more wait to be accepted.
	MaxConnections int
	// IdleTimeout closes a connection that has had no call in progress
	// for this long (default DefaultIdleTimeout; a gRPC client reconnects
	// by itself when it next calls), so that connections a client leaves
	// open do not hold MaxConnections' slots, and tens of KiB each, for
	// ever. A connection with a Watch open is never idle.
	IdleTimeout time.Duration
	// Access restricts the unix socket's peers. It cannot apply to TCP,
	// whose peers carry no credentials: Serve refuses the combination.
	Access Access
	// ShutdownTimeout bounds the graceful stop of Serve's gRPC servers
	// once its context ends (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Clock times the stall timeout; the real clock when nil.
	Clock clock.WithTickerAndDelayedExecution
}

// Server is the Lifecycle service. Create it with New, serve it with Serve.
type Server struct {
	lifecyclev1.UnimplementedLifecycleServer
	cfg    Config
	j      *journal.Journal
	log    logr.Logger
	health *health.Server
	m      *serverMetrics
	// encoded holds recent entries' messages in their wire form.
	encoded *entrycache.Cache[*encoded]
	// perWatcherEncoding makes every watch encode its messages itself
	// (the benchmark's baseline).
	perWatcherEncoding bool
	slots              chan struct{} // one token per open watch

	// stopping ends every watch when Serve shuts down.
	stopping context.Context
	stop     context.CancelCauseFunc
	served   atomic.Bool

	mu      sync.Mutex
	watches map[*watch]struct{}
	// senders are the goroutines that Send a watch's messages: Serve waits
	// for them after stopping its gRPC servers.
	senders sync.WaitGroup
}

// errShutdown is the cause of the watches' end when Serve shuts down.
var errShutdown = errors.New("pleg is shutting down")

// New returns a server of cfg.Journal.
func New(cfg Config) (*Server, error) {
	if cfg.Journal == nil {
		return nil, errors.New("lifecycle server: Config.Journal is required")
	}
	if cfg.StallTimeout < 0 || cfg.QueueSize < 0 || cfg.MaxWatchers < 0 || cfg.MaxConnections < 0 || cfg.ShutdownTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("lifecycle server: negative limit in %+v", cfg)
	}
	if cfg.StallTimeout == 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.MaxWatchers == 0 {
		cfg.MaxWatchers = DefaultMaxWatchers
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	s := &Server{cfg: cfg, j: cfg.Journal, log: cfg.Logger, health: health.NewServer(), encoded: entrycache.New[*encoded](encodeCacheSize),
		slots: make(chan struct{}, cfg.MaxWatchers), watches: map[*watch]struct{}{}}
	s.stopping, s.stop = context.WithCancelCause(context.Background())
	m, err := newServerMetrics(cfg.Registerer, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(lifecyclev1.Lifecycle_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Serve serves on every listener until ctx ends or one of them fails,
// then stops: every watch ends with codes.Unavailable naming its cursor,
// other calls get up to the shutdown timeout. Unix socket listeners get
// the peer-credential checks; others (loopback TCP) serve plaintext. It
// returns nil after a stop caused by ctx. Serve may be called once.
func (s *Server) Serve(ctx context.Context, lns ...net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("lifecycle server: Serve called twice")
	}
	servers := make([]*grpc.Server, len(lns))
	for i, ln := range lns {
		bad := &badRequests{}
		opts := []grpc.ServerOption{
			grpc.MaxRecvMsgSize(maxRequestSize),
			grpc.ForceServerCodecV2(newServerCodec(bad)),
			grpc.UnaryInterceptor(bad.unary),
			grpc.StreamInterceptor(bad.stream),
			// Clients may keep idle connections alive (any language's
			// defaults are at least this long).
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.cfg.IdleTimeout}),
			// A watcher's connection mostly waits: it holds no buffer
			// of its own while it does. Writes borrow a buffer from a
			// pool for each flush, and reads go to the socket unbuffered
			// (clients send little: requests, window updates and pings).
			// With gRPC's defaults (32 KiB of each per connection) a
			// watcher cost about 100 KiB ('pleg bench --scenario
			// watchers').
			grpc.SharedWriteBuffer(true),
			grpc.ReadBufferSize(0),
		}
		if _, unix := ln.Addr().(*net.UnixAddr); unix {
			opts = append(opts, grpc.Creds(NewPeerCredentials("lifecycle API", s.cfg.Access, s.log, s.m.rejected)))
		} else if s.cfg.Access.Restricted() {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("lifecycle server: allowed UIDs/GIDs cannot apply to %s %s: its peers carry no credentials", ln.Addr().Network(), ln.Addr())
		}
		g := grpc.NewServer(opts...)
		lifecyclev1.RegisterLifecycleServer(g, s)
		healthpb.RegisterHealthServer(g, s.health)
		// Server reflection: grpcurl and other generic clients need no
		// copy of the .proto.
		reflection.Register(g)
		servers[i] = g
	}
	errc := make(chan error, len(lns))
	for i, ln := range lns {
		go func() {
			err := servers[i].Serve(unixgrpc.LimitListener(ln, s.cfg.MaxConnections))
			if err != nil {
				err = fmt.Errorf("serving the lifecycle API on %s: %w", ln.Addr(), err)
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
	s.health.Shutdown()
	s.stop(errShutdown)
	unixgrpc.StopAll(servers, s.cfg.ShutdownTimeout)
	for ; pending > 0; pending-- {
		if e := <-errc; err == nil {
			err = e
		}
	}
	// Every transport is closed: a sender blocked in Send returns.
	s.senders.Wait()
	return err
}

// Journal returns the journal served.
func (s *Server) Journal() *journal.Journal { return s.j }

// invalidArgument is the status of a bad request; a filter or field error
// carries a BadRequest detail naming the field.
func invalidArgument(err error) error {
	var fe *journal.FilterError
	var fl *FieldError
	field, msg := "", err.Error()
	switch {
	case errors.As(err, &fe):
		field = filterFieldNames[fe.Field]
		msg = fmt.Sprintf("invalid %s %s: %s", field, textfmt.Echo(fe.Value), fe.Reason)
	case errors.As(err, &fl):
		field = "fields"
	case errors.Is(err, journal.ErrInvalidCursor):
		field = "cursor"
	}
	// Every value echoed is bounded (textfmt.Echo); so is the whole.
	msg = textfmt.Bound(msg, 2*textfmt.ReasonMax+4*textfmt.EchoMax)
	st := status.New(codes.InvalidArgument, msg)
	if field != "" {
		if d, derr := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// Filter checks an API filter and field mask and returns the journal's
// filter; its error is one for InvalidArgument, naming the bad part.
func Filter(f *lifecyclev1.Filter, fields []string) (*journal.Filter, error) {
	spec, err := FilterSpec(f, fields)
	if err != nil {
		return nil, err
	}
	return journal.NewFilter(spec)
}

// ListPods returns the current pods that the filter selects, and the
// cursor they are current at.
func (s *Server) ListPods(_ context.Context, req *lifecyclev1.ListPodsRequest) (*lifecyclev1.ListPodsResponse, error) {
	f, err := Filter(req.GetFilter(), nil)
	if err != nil {
		return nil, invalidArgument(err)
	}
	pods, cursor := s.j.Pods(f)
	resp := &lifecyclev1.ListPodsResponse{Cursor: cursor.String(), Pods: make([]*lifecyclev1.Pod, len(pods))}
	for i, p := range pods {
		resp.Pods[i] = podMessage(p, true)
	}
	return resp, nil
}

// GetPod returns a current pod by UID.
func (s *Server) GetPod(_ context.Context, req *lifecyclev1.GetPodRequest) (*lifecyclev1.Pod, error) {
	if req.GetUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "uid is required")
	}
	p, ok := s.j.Pod(types.UID(req.GetUid()))
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no pod with UID %s", textfmt.Echo(req.GetUid()))
	}
	return podMessage(p, true), nil
}

// GetContainer returns a container or sandbox by ID, with its pod,
// including one removed within the journal's retention.
func (s *Server) GetContainer(_ context.Context, req *lifecyclev1.GetContainerRequest) (*lifecyclev1.GetContainerResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is required")
	}
	f, ok := s.j.Container(req.GetId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no container or sandbox with ID %s (current, or removed within the journal's retention)", textfmt.Echo(req.GetId()))
	}
	return containerResponse(f), nil
}

// peerOfContext describes the caller, for logs.
func peerOfContext(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "unknown"
	}
	if pi, ok := p.AuthInfo.(PeerInfo); ok {
		return pi.Peer.String()
	}
	return p.Addr.String()
}

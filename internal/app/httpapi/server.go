// Package httpapi serves the daemon's HTTP endpoints: health (/healthz),
// readiness as the node Ready condition (/readyz), Prometheus metrics
// (/metrics), the pod status cache (/api/v1/pods) and the lifecycle event
// stream as Server-Sent Events (/api/v1/events) and the recent relists
// (/api/v1/relists).
//
// Extra handlers (a dashboard on "/", for example) can be mounted with
// Handle before or while serving.
package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/entrycache"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/podcache"
)

// DefaultHeartbeat is the interval of SSE heartbeat comments on an idle
// event stream.
const DefaultHeartbeat = 15 * time.Second

// DefaultShutdownTimeout bounds how long Serve waits for requests in flight
// once its context ends.
const DefaultShutdownTimeout = 5 * time.Second

// DefaultMaxStreams is how many event streams (/api/v1/events) are served
// at once; more get 503.
const DefaultMaxStreams = 64

// DefaultStreamWriteTimeout bounds how long an event stream client may
// take nothing: a stream whose connection has taken none of the data
// waiting for it for this long is dropped.
const DefaultStreamWriteTimeout = 10 * time.Second

// DefaultStreamMaxQueuedBytes bounds the bytes queued in pleg for one event
// stream behind the message being sent; a stream that would queue more is
// dropped.
const DefaultStreamMaxQueuedBytes = 256 << 10

// encodeCacheSize is how many recent entries' SSE messages are kept for
// the streams to share (for each identity choice): 2.6 MiB for 1,024
// events of a kubelet pod of three containers. A burst of up to that many
// events is encoded once for every stream (a relist of a full node: 250
// pods, a few events each); in a longer one the streams spread out and
// some encode again (BenchmarkEventsFanout: 6.7 us per event per stream
// for 500 events, 16 us for 2,000, 43 us when each stream encoded all).
const encodeCacheSize = 1024

// sendBuffer is the kernel send buffer (SO_SNDBUF) of every connection
// (Linux doubles it for its bookkeeping). Left alone, the kernel grows it
// to megabytes (net.ipv4.tcp_wmem; on loopback at once): a client that
// does not read would make the kernel hold that much per connection, in
// pleg's memory cgroup, and an event stream client that stops reading
// would be noticed only once it is full. Small, it bounds what the kernel
// holds per connection and lets a stalled stream be seen at once; 32 KiB
// still carries tens of megabytes a second on loopback.
const sendBuffer = 32 << 10

// streamChunk is the largest write of an event stream: each chunk the
// connection takes is progress, so a large resync going out to a slow but
// reading client is not mistaken for a stall.
const streamChunk = 16 << 10

// DefaultMaxConnections caps the connections each listener serves at once.
// Legitimate clients need a few (probes, a Prometheus, node tools) plus
// the event streams (DefaultMaxStreams); each connection not in a request
// costs about 30 KiB (7 MiB for 256, measured by the cmd/pleg test
// TestRunIdleConnections), so the cap bounds what idle connections cost.
const DefaultMaxConnections = 256

// Timeouts of every server (they bound each request, not an event stream,
// which the stream write timeout bounds instead).
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultReadTimeout bounds reading a whole request.
	DefaultReadTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds writing a response (/metrics,
	// /api/v1/pods...), from the end of its request's headers.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultIdleTimeout closes keep-alive connections idle this long
	// (Prometheus reuses its connection across scrapes up to a minute
	// apart).
	DefaultIdleTimeout = 2 * time.Minute
	// maxHeaderBytes bounds a request's headers (browsers send a few KiB;
	// net/http's default is 1 MiB).
	maxHeaderBytes = 32 << 10
)

// Generator is what the server needs from a *pleg.Generator.
type Generator interface {
	Healthy() (bool, error)
	Journal() *journal.Journal
	Cache() *podcache.Cache
	LastRelist() time.Time
	RelistRunningFor() time.Duration
	EventStream() pleg.EventStreamStatus
	RecentRelists() []pleg.RelistStat
	RelistThreshold() time.Duration
	Forecast() forecast.Verdict
}

// ReadyConditioner reports the node Ready condition, like *pleg.Readiness.
type ReadyConditioner interface {
	Condition() pleg.Condition
}

// Config configures a Server. Generator is required.
type Config struct {
	Generator Generator
	// Readiness backs /readyz. When nil, /readyz reports a condition built
	// from the generator's health alone.
	Readiness ReadyConditioner
	// Gatherer backs /metrics; when nil, /metrics is not served.
	Gatherer prometheus.Gatherer
	// Logger receives request errors.
	Logger logr.Logger
	// Heartbeat is the interval of SSE heartbeats (default DefaultHeartbeat).
	Heartbeat time.Duration
	// ShutdownTimeout bounds the graceful shutdown of Serve (default
	// DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// MaxStreams caps the event streams served at once (default
	// DefaultMaxStreams). Each holds one subscription, whose memory is
	// bounded by the journal's retention.
	MaxStreams int
	// StreamWriteTimeout drops an event stream whose connection has taken
	// none of the data waiting for it for this long (default
	// DefaultStreamWriteTimeout).
	StreamWriteTimeout time.Duration
	// StreamMaxQueuedBytes bounds the bytes queued for one event stream
	// behind the message being sent (default DefaultStreamMaxQueuedBytes).
	StreamMaxQueuedBytes int
	// MaxConnections caps the connections each listener serves at once
	// (default DefaultMaxConnections). Past it, the connection not in a
	// request that has waited longest is closed to make room; when every
	// one is in a request, new ones are refused.
	MaxConnections int
	// AllowedHosts are the Host headers the full API (Serve, Handler)
	// answers besides loopback addresses and localhost, with any port:
	// host names or IP addresses without a port, or AnyHost to answer any.
	// Other hosts get 421. The public handler has no Host check.
	AllowedHosts []string
	// Registerer, when set, receives the server's metrics (connections,
	// connections shed, Host rejections, event streams and their drops).
	Registerer prometheus.Registerer
	// Timeouts of each request (defaults DefaultReadHeaderTimeout,
	// DefaultReadTimeout, DefaultWriteTimeout, DefaultIdleTimeout).
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
}

// Server is the HTTP API. Its zero value is not usable; create it with New.
type Server struct {
	cfg Config
	mux *http.ServeMux
	// api is mux behind the Host check.
	api     http.Handler
	hosts   hostPolicy
	metrics *serverMetrics
	// public serves what Prometheus and probes need, and nothing else.
	public *http.ServeMux
	// streamSlots holds one token per open event stream.
	streamSlots chan struct{}

	// streams is cancelled when the server shuts down, ending every open
	// event stream so that the graceful shutdown does not wait for them.
	streams      context.Context
	cancelStream context.CancelFunc
	once         sync.Once

	// encoded holds recent entries' SSE messages, shared by the streams.
	encoded *entrycache.Cache[[]byte]

	// outboxes holds the queue of each open event stream.
	outboxMu sync.Mutex
	outboxes map[*streamOutbox]struct{}
}

// New returns a server with every built-in endpoint registered.
func New(cfg Config) *Server {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.StreamWriteTimeout <= 0 {
		cfg.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	if cfg.StreamMaxQueuedBytes <= 0 {
		cfg.StreamMaxQueuedBytes = DefaultStreamMaxQueuedBytes
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&cfg.ReadTimeout, DefaultReadTimeout},
		{&cfg.WriteTimeout, DefaultWriteTimeout}, {&cfg.IdleTimeout, DefaultIdleTimeout}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if cfg.Readiness == nil {
		// The Ready condition of the generator's health alone.
		cfg.Readiness = pleg.NewReadiness(cfg.Generator, pleg.ReadinessOptions{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, mux: http.NewServeMux(), public: http.NewServeMux(),
		streamSlots: make(chan struct{}, cfg.MaxStreams), streams: ctx, cancelStream: cancel, encoded: entrycache.New[[]byte](encodeCacheSize),
		hosts: newHostPolicy(cfg.AllowedHosts), outboxes: map[*streamOutbox]struct{}{}}
	s.api = s.checkHost(s.mux)
	s.metrics = newServerMetrics(s)
	s.metrics.register(cfg.Registerer, cfg.Logger)
	for _, mux := range []*http.ServeMux{s.mux, s.public} {
		mux.HandleFunc("GET /healthz", s.healthz)
		mux.HandleFunc("GET /readyz", s.readyz)
		if cfg.Gatherer != nil {
			mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
				ErrorLog: promLogger{cfg.Logger},
			}))
		}
	}
	s.mux.HandleFunc("GET /api/v1/pods", s.pods)
	s.mux.HandleFunc("GET /api/v1/events", s.events)
	s.mux.HandleFunc("GET /api/v1/relists", s.relists)
	return s
}

// Handle mounts an extra handler (for example a dashboard on "/"). The
// pattern follows net/http.ServeMux; it panics if it conflicts with one
// already registered.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the server's handler, Host check included, for tests and
// custom servers (which should set timeouts and a connection cap of their
// own: Serve's are not in the handler).
func (s *Server) Handler() http.Handler { return s.api }

// PublicHandler serves only /healthz, /readyz and /metrics: what probes and
// Prometheus need, without the pod API (pod names, IPs, errors), the event
// stream or the dashboard. It is what to expose on a node's address.
func (s *Server) PublicHandler() http.Handler { return s.public }

// Close ends every open event stream. Serve calls it on shutdown.
func (s *Server) Close() { s.once.Do(s.cancelStream) }

// Serve serves the full API on ln until ctx ends, then shuts down
// gracefully: open event streams end at once, other requests get up to the
// shutdown timeout. It returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.api, ListenerAPI)
}

// ServePublic is Serve with PublicHandler.
func (s *Server) ServePublic(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.public, ListenerMetrics)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler, name string) error {
	s.metrics.initListener(name)
	limited := newConnLimiter(ln, s.cfg.MaxConnections, name, s.metrics)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         limited.connState,
	}
	srv.RegisterOnShutdown(s.Close)
	// net/http's shutdown waits up to 5 s for a new connection to send its
	// request; those that are not in a request go at once.
	srv.RegisterOnShutdown(limited.closeIdle)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(limited) }()
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// promLogger adapts a logr.Logger to promhttp's error logger.
type promLogger struct{ log logr.Logger }

func (l promLogger) Println(v ...any) { l.log.Error(nil, "Serving metrics failed", "error", v) }

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

// DefaultStreamWriteTimeout bounds each write to an event stream: a client
// that stops reading is disconnected when its socket buffers are full and
// a write has waited this long.
const DefaultStreamWriteTimeout = 10 * time.Second

// Generator is what the server needs from a *pleg.Generator.
type Generator interface {
	Healthy() (bool, error)
	Subscribe() *pleg.Subscription
	Cache() *podcache.Cache
	LastRelist() time.Time
	RelistRunningFor() time.Duration
	EventStream() pleg.EventStreamStatus
	RecentRelists() []pleg.RelistStat
	RelistThreshold() time.Duration
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
	// StreamWriteTimeout bounds each write to an event stream (default
	// DefaultStreamWriteTimeout).
	StreamWriteTimeout time.Duration
}

// Server is the HTTP API. Its zero value is not usable; create it with New.
type Server struct {
	cfg Config
	mux *http.ServeMux
	// public serves what Prometheus and probes need, and nothing else.
	public *http.ServeMux
	// streamSlots holds one token per open event stream.
	streamSlots chan struct{}

	// streams is cancelled when the server shuts down, ending every open
	// event stream so that the graceful shutdown does not wait for them.
	streams      context.Context
	cancelStream context.CancelFunc
	once         sync.Once
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
	if cfg.Readiness == nil {
		// The Ready condition of the generator's health alone.
		cfg.Readiness = pleg.NewReadiness(cfg.Generator, pleg.ReadinessOptions{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, mux: http.NewServeMux(), public: http.NewServeMux(),
		streamSlots: make(chan struct{}, cfg.MaxStreams), streams: ctx, cancelStream: cancel}
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

// Handler returns the server's handler, for tests and custom servers.
func (s *Server) Handler() http.Handler { return s.mux }

// PublicHandler serves only /healthz, /readyz and /metrics: what probes and
// Prometheus need, without the pod API (pod names, IPs, errors), the event
// stream or the dashboard. It is what to expose on a node's address.
func (s *Server) PublicHandler() http.Handler { return s.public }

// Close ends every open event stream. Serve calls it on shutdown.
func (s *Server) Close() { s.once.Do(s.cancelStream) }

// Serve serves on ln until ctx ends, then shuts down gracefully: open event
// streams end at once, other requests get up to the shutdown timeout. It
// returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.mux)
}

// ServePublic is Serve with PublicHandler.
func (s *Server) ServePublic(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.public)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          nil,
	}
	srv.RegisterOnShutdown(s.Close)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
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

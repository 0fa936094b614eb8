package httpapi

import (
	"errors"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg/internal/outbox"
)

// Listener labels of the connection metrics.
const (
	// ListenerAPI is the listener Serve serves on (pleg run's
	// --listen-address).
	ListenerAPI = "api"
	// ListenerMetrics is the listener ServePublic serves on (pleg run's
	// --metrics-address).
	ListenerMetrics = "metrics"
)

// Reasons of pleg_http_connections_shed_total.
const (
	// shedEvicted: a connection not in a request, closed to make room for
	// a new one.
	shedEvicted = "idle_evicted"
	// shedRefused: a new connection closed at once, every slot being in a
	// request.
	shedRefused = "refused"
)

// serverMetrics are the server's own metrics.
type serverMetrics struct {
	connections  *prometheus.GaugeVec
	shed         *prometheus.CounterVec
	hostRejected prometheus.Counter
	streamDrops  *prometheus.CounterVec
	streams      prometheus.GaugeFunc
	queued       prometheus.GaugeFunc
}

func newServerMetrics(s *Server) *serverMetrics {
	m := &serverMetrics{
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pleg_http_connections",
			Help: "Connections open on each HTTP listener (api: the full API, metrics: health and metrics only), at most the listener's connection cap.",
		}, []string{"listener"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_http_connections_shed_total",
			Help: "Connections closed because a listener was at its connection cap: idle_evicted (not in a request, closed to make room for a new one) or refused (a new one, every slot being in a request).",
		}, []string{"listener", "reason"}),
		hostRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_http_host_rejected_total",
			Help: "Requests to the full API refused (421) because their Host header is neither a loopback host nor an allowed one.",
		}),
		streamDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_event_stream_drops_total",
			Help: "Event stream (/api/v1/events) clients cut off by pleg: stalled (its connection took nothing for the stream write timeout while data waited for it; the stream's reader waits for room in its bounded queue instead of dropping).",
		}, []string{"reason"}),
	}
	m.streams = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_event_streams",
		Help: "Event streams (/api/v1/events) open.",
	}, func() float64 { n, _ := s.streamStats(); return float64(n) })
	m.queued = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_event_stream_queued_bytes",
		Help: "Bytes of event stream messages queued in pleg for their clients, summed over the open streams (each stream's bounded; the kernel's socket buffers not included).",
	}, func() float64 { _, b := s.streamStats(); return float64(b) })
	m.streamDrops.WithLabelValues(string(outbox.Stalled))
	return m
}

// initListener makes a listener's series exist before anything happens on
// it, so that rules see zeros rather than nothing.
func (m *serverMetrics) initListener(listener string) {
	m.connections.WithLabelValues(listener)
	m.shed.WithLabelValues(listener, shedEvicted)
	m.shed.WithLabelValues(listener, shedRefused)
}

// register registers every metric on reg, logging (not panicking) on
// conflicts: a second server on the same registry keeps the first's.
func (m *serverMetrics) register(reg prometheus.Registerer, log logr.Logger) {
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{m.connections, m.shed, m.hostRejected, m.streamDrops, m.streams, m.queued} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				log.Error(err, "Registering an HTTP server metric failed")
			}
		}
	}
}

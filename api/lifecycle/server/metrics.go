package server

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the pleg_lifecycle_* metrics.
type serverMetrics struct {
	cuts     *prometheus.CounterVec
	resyncs  *prometheus.CounterVec
	rejected prometheus.Counter
}

func newServerMetrics(reg prometheus.Registerer, s *Server) (*serverMetrics, error) {
	m := &serverMetrics{
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_lifecycle_watcher_cuts_total",
			Help: "Watches of the lifecycle API that pleg ended, by reason (not_reading: the client read nothing for the stall timeout while messages waited).",
		}, []string{"reason"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_lifecycle_watcher_resyncs_total",
			Help: "Watches of the lifecycle API answered with resync_required, by reason (other_epoch, too_old, fell_behind, future_cursor).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_lifecycle_connections_rejected_total",
			Help: "Connections to the lifecycle API's unix socket refused because neither the peer's UID nor its GID is allowed.",
		}),
	}
	watchers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_lifecycle_watchers",
		Help: "Watches of the lifecycle API open now.",
	}, func() float64 { n, _ := s.watchStats(); return float64(n) })
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_lifecycle_watcher_max_lag_entries",
		Help: "The largest lag among open watches: journal entries appended after the last message sent to the watcher.",
	}, func() float64 { _, l := s.watchStats(); return float64(l) })
	if reg != nil {
		for _, c := range []prometheus.Collector{m.cuts, m.resyncs, m.rejected, watchers, lag} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if errors.As(err, &are) {
					return nil, errors.New("lifecycle server: its metrics are registered already (one Server per registry)")
				}
				return nil, err
			}
		}
	}
	return m, nil
}

// watchStats returns how many watches are open and the largest lag.
func (s *Server) watchStats() (n int, maxLag uint64) {
	head := s.j.Head().Seq
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.watches {
		if sent := w.sent.Load(); head > sent && head-sent > maxLag {
			maxLag = head - sent
		}
	}
	return len(s.watches), maxLag
}

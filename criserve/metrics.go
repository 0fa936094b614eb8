package criserve

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pleg_cri_* metrics, shared by the CRI endpoints of one
// pleg (label socket: the flag that serves it).
type Metrics struct {
	calls    *prometheus.CounterVec
	runtime  *prometheus.CounterVec
	rejected *prometheus.CounterVec
	cuts     *prometheus.CounterVec
}

// NewMetrics returns the metrics, registered on reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_cri_requests_total",
			Help: "Calls to pleg's CRI endpoints, by socket flag, method and how the method is served (state: from pleg's state, its verbose form passed through; pass-through; refused). pleg_cri_runtime_calls_total counts what reached the runtime.",
		}, []string{"socket", "method", "served"}),
		runtime: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_cri_runtime_calls_total",
			Help: "Calls pleg's CRI endpoints passed through to the runtime, by socket flag and method (kept verbose statuses and callers sharing one call count once).",
		}, []string{"socket", "method"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_cri_connections_rejected_total",
			Help: "Connections to a CRI endpoint's socket refused because neither the peer's UID nor its GID is allowed.",
		}, []string{"socket"}),
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_cri_event_stream_cuts_total",
			Help: "GetContainerEvents streams pleg ended, by socket flag and reason (not_reading: nothing read for the stall timeout while events waited; fell_behind: past the journal's retention).",
		}, []string{"socket", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.calls, m.runtime, m.rejected, m.cuts} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Package metrics holds the Prometheus collectors of the generator. Names,
// types, labels, help strings and buckets of the kubelet_* collectors match
// the kubelet's, so existing dashboards and the kubernetes-mixin rules work
// unchanged; what the kubelet lacks lives under the pleg_ prefix.
package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg/internal/op"
)

// Runtime operation types, the values of the operation_type label: the
// runtime calls' names (defined in internal/op, as cruntime.Op*).
const (
	OpListPodSandbox     = op.ListPodSandbox
	OpListContainers     = op.ListContainers
	OpPodSandboxStatus   = op.PodSandboxStatus
	OpContainerStatus    = op.ContainerStatus
	OpGetContainerEvents = op.GetContainerEvents
	OpStatus             = op.Status
	OpVersion            = op.Version
)

// Method returns the CRI method of an operation type (internal/op).
func Method(o string) string { return op.Method(o) }

// Metrics is the set of collectors one generator (and its runtime client)
// reports to. Create it with New; the zero value is not usable.
type Metrics struct {
	RelistDuration    prometheus.Histogram
	RelistInterval    prometheus.Histogram
	PodRelistDuration prometheus.Histogram
	DiscardEvents     prometheus.Counter
	LastSeen          prometheus.Gauge
	RunningPods       prometheus.Gauge
	RunningContainers *prometheus.GaugeVec
	NodeName          *prometheus.GaugeVec

	RuntimeOperations        *prometheus.CounterVec
	RuntimeOperationErrors   *prometheus.CounterVec
	RuntimeOperationDuration *prometheus.HistogramVec

	EventedConnectionErrors  prometheus.Counter
	EventedConnectionSuccess prometheus.Counter
	EventedConnectionLatency prometheus.Histogram

	// pleg_ extras.
	RelistInProgress      prometheus.GaugeFunc
	InspectionTimeouts    *prometheus.CounterVec
	InspectionFailures    prometheus.Counter
	InspectionsInFlight   prometheus.Gauge
	SubscriberResyncs     prometheus.Counter
	EventsDelivered       *prometheus.CounterVec
	EventDeliveryLatency  prometheus.Histogram
	RuntimeEvents         *prometheus.CounterVec
	PodRelistQueueDropped prometheus.Counter
	HintsInboxDropped     prometheus.Counter
	PodRelistSkipped      *prometheus.CounterVec
	PodRelistDeferred     *prometheus.CounterVec
	PodRelistFailures     prometheus.Counter
	EarlyRelists          prometheus.Counter
	LogLinesSuppressed    *prometheus.CounterVec
	IdentityFailures      prometheus.Counter
	EventStreamUp         prometheus.Gauge
	StatusItems           *prometheus.CounterVec
	UnannouncedChanges    *prometheus.CounterVec

	// The forecast of the kubelet's PLEG (TrackForecast).
	KubeletRelistForecast  prometheus.GaugeFunc
	KubeletPLEGAtRisk      prometheus.GaugeFunc
	KubeletPLEGUnhealthyAt prometheus.GaugeFunc

	progress atomic.Pointer[func() time.Duration]
	forecast atomic.Pointer[func() Forecast]
}

// Forecast is what the forecast gauges report.
type Forecast struct {
	// RelistSeconds is the kubelet's relist as forecast; +Inf when its
	// listing does not answer.
	RelistSeconds float64
	AtRisk        bool
	// UnhealthyAt is the earliest time the kubelet's PLEG reports not
	// healthy when at risk (zero: not at risk, or unknown).
	UnhealthyAt time.Time
}

// TrackForecast makes the forecast gauges report f().
func (m *Metrics) TrackForecast(f func() Forecast) {
	m.forecast.Store(&f)
}

func (m *Metrics) forecastNow() Forecast {
	if f := m.forecast.Load(); f != nil {
		return (*f)()
	}
	return Forecast{}
}

// TrackRelistProgress makes pleg_relist_in_progress_seconds report f(): how
// long the running relist has been running (0 when none runs).
func (m *Metrics) TrackRelistProgress(f func() time.Duration) {
	m.progress.Store(&f)
}

// New creates the collectors and registers them on reg. A nil reg leaves
// them unregistered (useful in tests and benchmarks).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		RelistDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "pleg_relist_duration_seconds",
			Help:    "Duration in seconds for relisting pods in PLEG.",
			Buckets: prometheus.DefBuckets,
		}),
		RelistInterval: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "pleg_relist_interval_seconds",
			Help:    "Interval in seconds between relisting in PLEG.",
			Buckets: prometheus.DefBuckets,
		}),
		PodRelistDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "pleg_pod_relist_duration_seconds",
			Help:    "Duration in seconds for relisting a single pod in PLEG.",
			Buckets: prometheus.DefBuckets,
		}),
		DiscardEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "pleg_discard_events",
			Help: "The number of discard events in PLEG.",
		}),
		LastSeen: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubelet", Name: "pleg_last_seen_seconds",
			Help: "Timestamp in seconds when PLEG was last seen active.",
		}),
		RunningPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubelet", Name: "running_pods",
			Help: "Number of pods that have a running pod sandbox",
		}),
		RunningContainers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubelet", Name: "running_containers",
			Help: "Number of containers currently running",
		}, []string{"container_state"}),
		NodeName: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubelet", Name: "node_name",
			Help: "The node's name. The count is always 1.",
		}, []string{"node"}),
		RuntimeOperations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "runtime_operations_total",
			Help: "Cumulative number of runtime operations by operation type.",
		}, []string{"operation_type"}),
		RuntimeOperationErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "runtime_operations_errors_total",
			Help: "Cumulative number of runtime operation errors by operation type.",
		}, []string{"operation_type"}),
		RuntimeOperationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "runtime_operations_duration_seconds",
			Help:    "Duration in seconds of runtime operations. Broken down by operation type.",
			Buckets: prometheus.ExponentialBuckets(.005, 2.5, 14),
		}, []string{"operation_type"}),
		EventedConnectionErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "evented_pleg_connection_error_count",
			Help: "The number of errors encountered during the establishment of streaming connection with the CRI runtime.",
		}),
		EventedConnectionSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "evented_pleg_connection_success_count",
			Help: "The number of times a streaming client was obtained to receive CRI Events.",
		}),
		EventedConnectionLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "evented_pleg_connection_latency_seconds",
			Help:    "The latency of streaming connection with the CRI runtime, measured in seconds.",
			Buckets: prometheus.DefBuckets,
		}),
		InspectionTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_pod_inspection_timeouts_total",
			Help: "Pod inspections abandoned because they exceeded the pod inspection timeout, by the runtime call that was outstanding.",
		}, []string{"operation_type"}),
		InspectionFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_pod_inspection_failures_total",
			Help: "Pod inspections that failed (error or timeout); the pod is reinspected on a later relist.",
		}),
		InspectionsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_pod_inspections_in_flight",
			Help: "Runtime calls for one pod now outstanding (status fetches, single-pod list calls, identity calls), including abandoned ones that have not returned yet.",
		}),
		SubscriberResyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_subscriber_resyncs_total",
			Help: "Times a subscriber fell too far behind and was sent a resync marker followed by the state of every pod instead of the events it missed.",
		}),
		EventsDelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_events_total",
			Help: "Pod lifecycle events emitted, by event type.",
		}, []string{"type"}),
		EventDeliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pleg_runtime_event_to_delivery_seconds",
			Help:    "Time from a runtime container event (its created_at) to the lifecycle event it triggered being delivered.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		RuntimeEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_runtime_events_total",
			Help: "Container events received from the runtime's event stream, by event type.",
		}, []string{"type"}),
		PodRelistQueueDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_pod_relist_requests_dropped_total",
			Help: "Single-pod relist requests the bounded queue could not hold; the next global relist covers them.",
		}),
		HintsInboxDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_hints_inbox_dropped_total",
			Help: "Hints (runtime events, RequestRelist) dropped before the relist loop took them: the hand-off to the loop held PodRelistQueue hints already. The next global relist covers their pods.",
		}),
		PodRelistSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_pod_relist_requests_skipped_total",
			Help: "Single-pod relist requests (hints) dropped without a runtime call, by reason: covered (a global relist that started later listed the pod, including hints that waited for the budget), stale_event (the runtime event predates the last global relist, e.g. a replay after reconnecting) or unchanged (the runtime event names a container in the state pleg already shows).",
		}, []string{"reason"}),
		PodRelistDeferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_pod_relist_requests_deferred_total",
			Help: "Single-pod relist requests (hints) that had to wait, by reason: budget (no token of the single-pod relist rate left; an early global relist covers them) or spacing (the pod was relisted on its own too recently).",
		}, []string{"reason"}),
		PodRelistFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_pod_relist_failures_total",
			Help: "Single-pod relists whose list call failed; the next global relist covers the pod.",
		}),
		EarlyRelists: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_early_relists_total",
			Help: "Global relists started before their period because hints waited for the single-pod relist budget.",
		}),
		IdentityFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pleg_identity_failures_total",
			Help: "Calls for containers' identities (init PID, cgroup path; asked while a watcher wants them) that failed or timed out; those containers' identities stay unknown.",
		}),
		LogLinesSuppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_log_lines_suppressed_total",
			Help: "Repeated per-pod error lines not logged (a summary line is logged once a minute), by kind.",
		}, []string{"kind"}),
		EventStreamUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pleg_event_stream_connected",
			Help: "1 while the runtime's container event stream is connected, 0 otherwise.",
		}),
		StatusItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_pod_status_items_total",
			Help: "Sandbox and container statuses that went into inspected pods' statuses, by source: fetched (a runtime call) or reused (the item's listing had not changed since its last status, so its cached status was kept).",
		}, []string{"source"}),
		UnannouncedChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pleg_unannounced_changes_total",
			Help: "Pods a global relist found changed while the runtime's event stream was connected but no event about them had come, by the first change's kind: started, died, removed, created or other. Each brings an adaptive relist period (--max-relist-period) back to the base period.",
		}, []string{"kind"}),
	}
	m.RelistInProgress = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_relist_in_progress_seconds",
		Help: "How long the relist now running has been running, in seconds; 0 when no relist runs. Unlike the relist duration histogram it moves while a relist is stuck.",
	}, func() float64 {
		if f := m.progress.Load(); f != nil {
			return (*f)().Seconds()
		}
		return 0
	})
	m.KubeletRelistForecast = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_kubelet_relist_forecast_seconds",
		Help: "How long the kubelet's PLEG (v1.37) would take to relist this node now, in seconds, from what pleg's relists observe (docs/forecast.md); +Inf when the runtime does not answer its listing.",
	}, func() float64 { return m.forecastNow().RelistSeconds })
	m.KubeletPLEGAtRisk = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_kubelet_pleg_at_risk",
		Help: "1 when the kubelet's PLEG will report \"PLEG is not healthy\" (or does now) unless what is wrong ends first, else 0 (docs/forecast.md).",
	}, func() float64 {
		if m.forecastNow().AtRisk {
			return 1
		}
		return 0
	})
	m.KubeletPLEGUnhealthyAt = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pleg_kubelet_pleg_unhealthy_at_seconds",
		Help: "When at risk, the Unix time at which the kubelet's PLEG reports not healthy at the earliest; 0 when not at risk or unknown.",
	}, func() float64 {
		if t := m.forecastNow().UnhealthyAt; !t.IsZero() {
			return float64(t.UnixNano()) / 1e9
		}
		return 0
	})
	if reg != nil {
		reg.MustRegister(m.collectors()...)
	}
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.RelistDuration, m.RelistInterval, m.PodRelistDuration, m.DiscardEvents,
		m.LastSeen, m.RunningPods, m.RunningContainers, m.NodeName,
		m.RuntimeOperations, m.RuntimeOperationErrors, m.RuntimeOperationDuration,
		m.EventedConnectionErrors, m.EventedConnectionSuccess, m.EventedConnectionLatency,
		m.RelistInProgress, m.InspectionTimeouts, m.InspectionFailures, m.InspectionsInFlight,
		m.SubscriberResyncs, m.EventsDelivered, m.EventDeliveryLatency, m.RuntimeEvents,
		m.PodRelistQueueDropped, m.HintsInboxDropped, m.PodRelistSkipped, m.PodRelistDeferred, m.PodRelistFailures,
		m.EarlyRelists, m.LogLinesSuppressed, m.IdentityFailures, m.EventStreamUp, m.StatusItems, m.UnannouncedChanges,
		m.KubeletRelistForecast, m.KubeletPLEGAtRisk, m.KubeletPLEGUnhealthyAt,
	}
}

// ObserveRuntimeOperation counts and times one runtime call.
func (m *Metrics) ObserveRuntimeOperation(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.RuntimeOperations.WithLabelValues(op).Inc()
	m.RuntimeOperationDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.RuntimeOperationErrors.WithLabelValues(op).Inc()
	}
}

package pleg

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// report turns one of the core's notes into metrics and log lines. Errors
// that repeat per pod (inspection timeouts, failed single-pod relists) are
// logged through the limiter; every one is counted.
func (g *Generator) report(n note) {
	switch n.kind {
	case noteRelistInterval:
		g.m.RelistInterval.Observe(n.d.Seconds())
	case noteEarlyRelist:
		g.m.EarlyRelists.Inc()
	case noteListFailed:
		g.log.Error(n.err, "GenericPLEG: Unable to retrieve pods")
	case noteGauges:
		g.m.RunningPods.Set(float64(n.n))
		for s := cruntime.StateUnknown; s <= cruntime.StateExited; s++ {
			g.m.RunningContainers.WithLabelValues(s.String()).Set(float64(n.byState[s]))
		}
	case noteInspectionFailed:
		g.m.InspectionFailures.Inc()
		g.log.V(4).Info("PLEG: Ignoring events for pod", "pod", podRef(n.pod), "podUID", n.uid, "err", n.err.Error())
	case noteTimeout:
		g.m.InspectionTimeouts.WithLabelValues(n.op).Inc()
		te := n.err.(*InspectionTimeoutError)
		msg := "Pod inspection exceeded the timeout; the relist goes on without it"
		if n.single {
			msg = "Single-pod relist call exceeded the pod inspection timeout; the pod is retried later"
		}
		if g.logs.allow(logTimeout, n.uid) {
			g.log.Error(n.err, msg, "pod", podRef(n.pod), "podUID", n.uid, "call", te.Call(), "containerID", te.ID, "after", te.Waited)
		}
	case noteAbandonedReturned:
		g.log.V(2).Info("Abandoned pod inspection returned; relisting the pod", "pod", podRef(n.pod), "podUID", n.uid, "after", n.d)
	case notePodRelistFailed:
		g.m.PodRelistFailures.Inc()
		if g.logs.allow(logPodRelist, n.uid) {
			g.log.Error(n.err, "GenericPLEG: Unable to relist pod", "podUID", n.uid)
		}
	case notePodRelistDone:
		g.m.PodRelistDuration.Observe(n.d.Seconds())
	case noteStatusItems:
		g.m.StatusItems.WithLabelValues("fetched").Add(float64(n.n))
		if n.reused > 0 {
			g.m.StatusItems.WithLabelValues("reused").Add(float64(n.reused))
		}
	case noteHintSkipped:
		g.counter(g.m.PodRelistSkipped, n.reason).Inc()
		if l := g.log.V(6); l.Enabled() {
			l.Info("Hint made no runtime call", "podUID", n.uid, "containerID", n.container, "reason", n.reason)
		}
	case noteHintDropped:
		g.m.PodRelistQueueDropped.Inc()
		if l := g.log.V(4); l.Enabled() {
			l.Info("Single-pod relist queue is full; the next relist covers the pod", "podUID", n.uid)
		}
	case noteHintDeferred:
		g.counter(g.m.PodRelistDeferred, n.reason).Inc()
	case noteHintLatency:
		g.m.EventDeliveryLatency.Observe(n.d.Seconds())
	case noteUnannounced:
		g.counter(g.m.UnannouncedChanges, n.reason).Inc()
		if l := g.log.V(4); l.Enabled() {
			l.Info("Global relist found a change no runtime event announced", "podUID", n.uid, "kind", n.reason)
		}
	case noteIdentityFailed:
		g.m.IdentityFailures.Inc()
		if g.logs.allow(logIdentity, n.uid) {
			g.log.Error(n.err, "Fetching containers' identities failed; they stay unknown", "pod", podRef(n.pod), "podUID", n.uid)
		}
	}
}

// labeledKey names one counter of a vector with one label.
type labeledKey struct {
	vec   *prometheus.CounterVec
	label string
}

// counter returns vec's counter of label, resolved once: the hint notes
// come with every runtime event, and a vector's lookup hashes its label.
func (g *Generator) counter(vec *prometheus.CounterVec, label string) prometheus.Counter {
	k := labeledKey{vec, label}
	c := g.labeled[k]
	if c == nil {
		c = vec.WithLabelValues(label)
		g.labeled[k] = c
	}
	return c
}

// Kinds of repeated errors the limiter bounds.
const (
	logTimeout   = "pod inspection timeouts"
	logPodRelist = "single-pod relist failures"
	logIdentity  = "identity fetch failures"
)

// logLimiter bounds repeated per-pod error lines: in each window, the
// first burst lines of a kind are logged; the rest are counted
// (pleg_log_lines_suppressed_total) and summed up in one line when the
// window ends, naming up to ten of their pods.
type logLimiter struct {
	log    logr.Logger
	m      *metrics.Metrics
	window time.Duration
	burst  int
	kinds  map[string]*logWindow
	now    time.Time // the time of the step being reported
}

type logWindow struct {
	start      time.Time
	logged     int
	suppressed int
	pods       map[types.UID]struct{}
}

const (
	logWindowLength = time.Minute
	logWindowBurst  = 5
)

func newLogLimiter(log logr.Logger, m *metrics.Metrics) *logLimiter {
	return &logLimiter{log: log, m: m, window: logWindowLength, burst: logWindowBurst, kinds: make(map[string]*logWindow)}
}

// allow reports whether a line of kind about pod uid may be logged at now;
// the caller logs it if so.
func (l *logLimiter) allow(kind string, uid types.UID) bool {
	w := l.kinds[kind]
	if w == nil {
		w = &logWindow{pods: make(map[types.UID]struct{})}
		l.kinds[kind] = w
	}
	if w.start.IsZero() {
		w.start = l.now
	}
	if w.logged < l.burst {
		w.logged++
		return true
	}
	w.suppressed++
	if len(w.pods) < 10 {
		w.pods[uid] = struct{}{}
	}
	l.m.LogLinesSuppressed.WithLabelValues(kind).Inc()
	return false
}

// flush ends the windows that are over at now, logging a summary of what
// each suppressed.
func (l *logLimiter) flush(now time.Time) {
	for kind, w := range l.kinds {
		if w.start.IsZero() || now.Sub(w.start) < l.window {
			continue
		}
		if w.suppressed > 0 {
			pods := make([]string, 0, len(w.pods))
			for uid := range w.pods {
				pods = append(pods, string(uid))
			}
			sort.Strings(pods)
			l.log.Error(nil, fmt.Sprintf("%d more %s in the last %v were not logged", w.suppressed, kind, now.Sub(w.start).Round(time.Second)),
				"podUIDs", strings.Join(pods, ","))
		}
		delete(l.kinds, kind)
	}
}

package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/podlifecycle/pleg"
)

// unannouncedKinds are the kinds of pleg_unannounced_changes_total, in
// the order MEASURE lines give them.
var unannouncedKinds = []string{pleg.UnannouncedStarted, pleg.UnannouncedDied, pleg.UnannouncedRemoved,
	pleg.UnannouncedCreated, pleg.UnannouncedOther}

// measureUnannounced prints a MEASURE line of the changes a view's global
// relists found that no runtime event announced (issue 37: what the
// adaptive relist would have seen only at its next global relist), by
// kind, from count (the view's pleg_unannounced_changes_total for a
// kind). A runtime that drops or never sends an event shows here.
func measureUnannounced(t testing.TB, scenario, view string, count func(kind string) float64) {
	t.Helper()
	var parts []string
	total := 0.0
	for _, k := range unannouncedKinds {
		n := count(k)
		total += n
		parts = append(parts, fmt.Sprintf("%s=%g", k, n))
	}
	measure(t, "unannounced_changes scenario=%s view=%s total=%g %s", scenario, view, total, strings.Join(parts, " "))
}

// unannounced is a library view's count of unannounced changes of a
// kind.
func (v *libView) unannounced(t testing.TB) func(kind string) float64 {
	return func(kind string) float64 {
		return v.labelled(t, "pleg_unannounced_changes_total", "kind", kind)
	}
}

// unannounced is a pleg run's count of unannounced changes of a kind,
// from its /metrics.
func (d *daemonView) unannounced(t testing.TB) func(kind string) float64 {
	t.Helper()
	mfs := d.metricFamilies(t)
	return func(kind string) float64 { return labelled(mfs, "pleg_unannounced_changes_total", "kind", kind) }
}

// labelled sums a counter or gauge (a histogram: its count) of mfs over
// its series with label name=value ("" name: every series); 0 when the
// metric has none yet (a vector with no series is not exposed).
func labelled(mfs map[string]*dto.MetricFamily, metric, name, value string) float64 {
	var sum float64
	for _, m := range mfs[metric].GetMetric() {
		match := name == ""
		for _, l := range m.GetLabel() {
			match = match || l.GetName() == name && l.GetValue() == value
		}
		if match {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// metricFamilies is pleg run's /metrics, parsed; an error fails t.
func (d *daemonView) metricFamilies(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	code, b, err := d.get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s: /metrics: %d %v", d.name, code, err)
	}
	mfs, err := parseMetrics(b)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

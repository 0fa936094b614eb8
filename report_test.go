package pleg

import (
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
)

// Repeated per-pod errors are logged boundedly: 500 failed single-pod
// relists in 5 s (a 5 % error rate at 1,000 hints/s) make the first five
// lines and, once the minute is over, one summary naming the pods; every
// one is counted.
func TestRepeatedErrorsLogBounded(t *testing.T) {
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	m := metrics.New(nil)
	g := &Generator{log: log, m: m, logs: newLogLimiter(log, m)}
	now := time.Unix(1_700_000_000, 0)
	for i := range 500 {
		now = now.Add(10 * time.Millisecond)
		g.logs.now = now
		g.report(note{kind: notePodRelistFailed, uid: types.UID([]string{"a", "b", "c"}[i%3]), err: errList})
		g.logs.flush(now)
	}
	if len(lines) != 5 {
		t.Fatalf("%d lines logged in 5s, want 5", len(lines))
	}
	now = now.Add(time.Minute)
	g.logs.flush(now)
	if len(lines) != 6 || !strings.Contains(lines[5], "495 more single-pod relist failures") || !strings.Contains(lines[5], `"a,b,c"`) {
		t.Fatalf("summary %q", lines[len(lines)-1])
	}
	if got := testutil.ToFloat64(m.PodRelistFailures); got != 500 {
		t.Fatalf("failures counted %v, want 500", got)
	}
	if got := testutil.ToFloat64(m.LogLinesSuppressed.WithLabelValues(logPodRelist)); got != 495 {
		t.Fatalf("suppressed %v", got)
	}
	// A new window logs again.
	g.logs.now = now
	g.report(note{kind: notePodRelistFailed, uid: "a", err: errList})
	if len(lines) != 7 {
		t.Fatalf("the next window logged nothing")
	}
}

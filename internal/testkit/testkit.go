// Package testkit holds what the tests and benchmarks of the lifecycle
// stream (api/lifecycle/server and client, internal/app/httpapi) share: a fake
// clock that reports its timers, a logger that records its lines, a pod as
// the kubelet labels it and the process's CPU time.
package testkit

import (
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// TimerClock is a fake clock that reports every timer made on it on
// Timers, by NewTimer or AfterFunc (dropping the reports nobody reads once
// Timers is full).
type TimerClock struct {
	*clocktesting.FakeClock
	Timers chan time.Duration
}

// NewTimerClock returns a TimerClock at now whose Timers holds up to
// buffer reports.
func NewTimerClock(now time.Time, buffer int) *TimerClock {
	return &TimerClock{FakeClock: clocktesting.NewFakeClock(now), Timers: make(chan time.Duration, buffer)}
}

// NewTimer makes a fake timer and reports its duration.
func (c *TimerClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	select {
	case c.Timers <- d:
	default: // nobody is counting them
	}
	return t
}

// AfterFunc makes a fake timer that calls f, and reports its duration.
func (c *TimerClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.FakeClock.AfterFunc(d, f)
	select {
	case c.Timers <- d:
	default: // nobody is counting them
	}
	return t
}

// LogSink records log lines and tells when one appears.
type LogSink struct {
	mu      sync.Mutex
	lines   []string
	waiting map[string][]chan struct{}
}

// Logger returns a logger that records into s the lines up to verbosity.
func (s *LogSink) Logger(verbosity int) logr.Logger {
	return funcr.New(func(_, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, args)
		for sub, chs := range s.waiting {
			if strings.Contains(args, sub) {
				for _, ch := range chs {
					close(ch)
				}
				delete(s.waiting, sub)
			}
		}
	}, funcr.Options{Verbosity: verbosity})
}

// Logged returns a channel closed once a line containing sub is logged.
func (s *LogSink) Logged(sub string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if slices.ContainsFunc(s.lines, func(l string) bool { return strings.Contains(l, sub) }) {
		close(ch)
		return ch
	}
	if s.waiting == nil {
		s.waiting = map[string][]chan struct{}{}
	}
	s.waiting[sub] = append(s.waiting[sub], ch)
	return ch
}

// Find returns the first line logged that contains sub ("" if none).
func (s *LogSink) Find(sub string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// KubeletPod is pod i as a kubelet-managed runtime lists it: a sandbox and
// three containers with the kubelet's labels and annotations.
func KubeletPod(i int) *journal.Pod {
	uid := types.UID(fmt.Sprintf("9c1b7d2e-3f4a-4b5c-8d6e-%012d", i))
	labels := cruntime.LabelsOf("app", "web", "pod-template-hash", "7d4b9c8f6d",
		"io.kubernetes.pod.name", fmt.Sprintf("web-7d4b9c8f6d-%05d", i), "io.kubernetes.pod.namespace", "default",
		"io.kubernetes.pod.uid", string(uid))
	ann := cruntime.LabelsOf("kubernetes.io/config.seen", "2026-03-01T12:00:00.000000000Z", "kubernetes.io/config.source", "api")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := &journal.Pod{UID: uid, Name: labels.Get("io.kubernetes.pod.name"), Namespace: "default", IPs: []string{"10.88.0.7"},
		Labels: labels, Annotations: ann, ObservedAt: now,
		Sandboxes: []*journal.Sandbox{{ID: fmt.Sprintf("%064d", i), Name: labels.Get("io.kubernetes.pod.name"), State: cruntime.StateRunning,
			CreatedAt: now, IPs: []string{"10.88.0.7"}, Labels: labels, Annotations: ann}}}
	for _, n := range []string{"app", "sidecar", "proxy"} {
		c := journal.Container{ID: fmt.Sprintf("%060d%-4.4s", i, n), Name: n, State: cruntime.StateRunning,
			Image: "registry.example/" + n + ":1.2.3"}.WithStatus(&cruntime.ContainerStatus{
			ImageRef:  "registry.example/" + n + "@sha256:0123456789abcdef",
			CreatedAt: now, StartedAt: now, Labels: cruntime.LabelsOf("io.kubernetes.container.name", n), Annotations: ann})
		p.Containers = append(p.Containers, &c)
	}
	return p
}

// kubeletPods is KubeletPod(0) to KubeletPod(n-1).
func kubeletPods(n int) []*journal.Pod {
	pods := make([]*journal.Pod, n)
	for i := range pods {
		pods[i] = KubeletPod(i)
	}
	return pods
}

// appendDeaths appends n hint events to j, each a ContainerDied of the
// first container of the next pod of pods, round robin: the fan-out
// benchmarks' load.
func appendDeaths(j *journal.Journal, pods []*journal.Pod, n int) {
	for i := range n {
		p := pods[i%len(pods)]
		j.Append(journal.Entry{Kind: journal.KindPod, Pod: p, Source: journal.SourceHint,
			Transitions: []journal.Transition{{Type: "ContainerDied", ContainerID: p.Containers[0].ID, ContainerName: "app"}}})
	}
}

// MeasureFanOut is a fan-out benchmark's timed part: it appends b.N
// deaths of 64 kubelet pods to j, waits until each of the subscribers has
// said on received that it got them all, and reports the process's CPU per
// event per subscriber as unit.
func MeasureFanOut(b *testing.B, j *journal.Journal, subscribers int, received <-chan int, unit string) {
	pods := kubeletPods(64)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := CPUTime()
	appendDeaths(j, pods, b.N)
	for range subscribers {
		<-received
	}
	b.StopTimer()
	b.ReportMetric(float64(CPUTime()-cpu0)/float64(b.N)/float64(subscribers), unit)
}

// CPUTime returns the CPU (user and system) the process has used.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Imports returns the import paths of the package in dir, non-test files
// only, by file name: for tests that keep an arrow between packages from
// coming back.
func Imports(dir string) (map[string][]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		for _, imp := range file.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return nil, fmt.Errorf("%s: import %s: %w", f, imp.Path.Value, err)
			}
			out[filepath.Base(f)] = append(out[filepath.Base(f)], p)
		}
	}
	return out, nil
}

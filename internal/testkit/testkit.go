// Package testkit holds the test doubles that the tests of
// api/lifecycle/server and api/lifecycle/client share: a fake clock that
// reports its timers and a logger that records its lines.
package testkit

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// TimerClock is a fake clock that reports every timer made on it on
// Timers (dropping the reports nobody reads once Timers is full).
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

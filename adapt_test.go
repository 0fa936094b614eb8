package pleg

import (
	"context"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/journal"
)

// TestAdaptiveCacheNeverFresherThanTaken: while the period is stretched, a
// reader of the cache is served as of the loop's last take once everything
// taken is processed, and never as of a later time.
func TestAdaptiveCacheNeverFresherThanTaken(t *testing.T) {
	h := newHarness(t)
	h.c.cfg.maxPeriod, h.c.cfg.manual = 8*time.Second, false
	h.step(streamChanged{status: journal.RuntimeStatus{State: journal.RuntimeEventStreamConnected}})
	h.setListing(h.listing([]string{"a c1=running"}), true)
	for range 6 {
		h.relist(nil, nil, false)
	}
	if d := h.c.relist.due.Sub(h.now); d != 8*time.Second {
		t.Fatalf("period after six quiet relists = %v, want 8s", d)
	}
	h.now = h.now.Add(300 * time.Millisecond)
	takenAt := h.now
	h.step(taken{at: takenAt})
	h.now = h.now.Add(200 * time.Millisecond)
	h.tick(h.now)

	done, cancel := context.WithCancel(context.Background())
	cancel() // not fresh: GetNewerThan answers ctx.Err at once
	if _, err := h.cache.GetNewerThan(done, "a", takenAt.Add(-time.Millisecond)); err != nil {
		t.Errorf("a reader before the take waits: %v", err)
	}
	if _, err := h.cache.GetNewerThan(done, "a", takenAt); err == nil {
		t.Errorf("a reader as of the take is served, though nothing says the cache is fresher")
	}
	if got := h.cache.Timestamp(); !got.Equal(takenAt) {
		t.Errorf("cache timestamp = %v, want the take %v", got, takenAt)
	}
}

// TestAdaptiveOffKeepsPeriod: without MaxRelistPeriod (or in a generator
// driven by hand) the period never moves, stream or not.
func TestAdaptiveOffKeepsPeriod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    time.Duration
		manual bool
	}{{"off", 0, false}, {"max equals period", time.Second, false}, {"by hand", 8 * time.Second, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.c.cfg.maxPeriod, h.c.cfg.manual = tc.max, tc.manual
			h.step(streamChanged{status: journal.RuntimeStatus{State: journal.RuntimeEventStreamConnected}})
			h.setListing(h.listing([]string{"a c1=running"}), true)
			for range 8 {
				h.relist(nil, nil, false)
				if d := h.c.relist.due.Sub(h.now); d != time.Second {
					t.Fatalf("period = %v, want 1s", d)
				}
			}
			h.now = h.now.Add(500 * time.Millisecond)
			if s := h.step(taken{at: h.now}); len(s.lines) > 0 {
				t.Errorf("off, a take moved the cache: %v", s.lines)
			}
		})
	}
}

// TestMaxRelistPeriodRange: New refuses a maximum below the period, above a
// minute, or not below half the health threshold.
func TestMaxRelistPeriodRange(t *testing.T) {
	rt := newFakeRuntime()
	for _, tc := range []struct {
		max, threshold time.Duration
		ok             bool
	}{
		{0, 0, true}, {10 * time.Second, 0, true}, {time.Second, 0, true},
		{500 * time.Millisecond, 0, false}, {2 * time.Minute, 0, false}, {30 * time.Second, time.Minute, false},
	} {
		_, err := New(Options{Runtime: rt, MaxRelistPeriod: tc.max, RelistThreshold: tc.threshold})
		if (err == nil) != tc.ok {
			t.Errorf("MaxRelistPeriod %v, threshold %v: err = %v, want ok %v", tc.max, tc.threshold, err, tc.ok)
		}
	}
}

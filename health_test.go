package pleg

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	testclock "k8s.io/utils/clock/testing"
)

type fakeStatus struct {
	conds []cruntime.Condition
	err   error
}

func (f *fakeStatus) Status(context.Context) ([]cruntime.Condition, error) { return f.conds, f.err }

type fakeHealth struct{ err error }

func (f fakeHealth) Healthy() (bool, error) { return f.err == nil, f.err }

func TestReadinessCondition(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	ready := []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: true}, {Type: cruntime.NetworkReady, Status: true}}
	st := &fakeStatus{conds: ready}
	h := &fakeHealth{}
	r := NewReadiness(nil, ReadinessOptions{Runtime: st, Clock: clk})
	r.AddCheck("PLEG", h)

	c := r.Condition()
	if c.Status != "False" || c.Reason != "KubeletNotReady" || c.Message != "container runtime status check may not have completed yet" {
		t.Fatalf("before the first check: %+v", c)
	}
	r.CheckRuntime(context.Background())
	if c := r.Condition(); c.Status != "True" || c.Reason != "KubeletReady" || c.Message != "kubelet is posting ready status" {
		t.Fatalf("ready: %+v", c)
	}

	// The runtime stops answering: down after 30 s, and PLEG unhealthy too.
	st.err = errors.New("unavailable")
	h.err = errors.New("pleg was last seen active 3m0.5s ago; threshold is 3m0s")
	clk.Step(30 * time.Second)
	r.CheckRuntime(context.Background())
	want := "[container runtime is down, PLEG is not healthy: pleg was last seen active 3m0.5s ago; threshold is 3m0s]"
	if c := r.Condition(); c.Status != "False" || c.Message != want || len(c.Errors) != 2 {
		t.Fatalf("down: %+v\nwant %q", c, want)
	}

	// The runtime answers but is not ready.
	st.err, h.err = nil, nil
	st.conds = []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: false, Reason: "Starting", Message: "not yet"}, ready[1]}
	r.CheckRuntime(context.Background())
	want = "[container runtime is down, container runtime not ready: RuntimeReady=false reason:Starting message:not yet]"
	if c := r.Condition(); c.Message != want {
		t.Fatalf("not ready: %q\nwant %q", c.Message, want)
	}
}

// TestReadinessStoppedCheck: a check whose context ends (Run stopped
// mid-call) says nothing of the runtime: its last conditions stand, with
// no error (criserve answers Status from them).
func TestReadinessStoppedCheck(t *testing.T) {
	ready := []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: true}, {Type: cruntime.NetworkReady, Status: true}}
	st := &fakeStatus{conds: ready}
	r := NewReadiness(nil, ReadinessOptions{Runtime: st})
	r.CheckRuntime(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st.conds, st.err = nil, context.Canceled // what the call returns once its context ended
	r.CheckRuntime(ctx)
	if conds, _, err := r.RuntimeConditions(); err != nil || len(conds) != 2 {
		t.Errorf("after a stopped check: conditions %v, error %v; want the last answer's, no error", conds, err)
	}
	if c := r.Condition(); c.Status != "True" {
		t.Errorf("after a stopped check: %+v", c)
	}
}

func TestJoinErrors(t *testing.T) {
	if got := JoinErrors([]error{errors.New("a")}); got != "a" {
		t.Fatal(got)
	}
	if got := JoinErrors([]error{errors.New("a"), errors.New("b")}); got != "[a, b]" {
		t.Fatal(got)
	}
}

// countingStatus records when Status was called.
type countingStatus struct {
	mu    sync.Mutex
	calls []time.Time
}

func (c *countingStatus) Status(context.Context) ([]cruntime.Condition, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, time.Now())
	return []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: true}, {Type: cruntime.NetworkReady, Status: true}}, nil
}

// TestReadinessFollowsRelistPeriod: while the relist beside it is
// stretched, the runtime's status is checked as rarely, never less often
// than every MaxStatusInterval, and every Interval again once the relist
// falls back; the runtime is never called down meanwhile.
func TestReadinessFollowsRelistPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var period atomic.Int64
		period.Store(int64(time.Second))
		st := &countingStatus{}
		r := NewReadiness(nil, ReadinessOptions{Runtime: st, Period: func() time.Duration { return time.Duration(period.Load()) }})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx) }()

		start := time.Now()
		gaps := func(phase string, d time.Duration, want time.Duration) {
			t.Helper()
			st.mu.Lock()
			n := len(st.calls)
			st.mu.Unlock()
			time.Sleep(d)
			synctest.Wait()
			st.mu.Lock()
			calls := st.calls[n-1:]
			st.mu.Unlock()
			if len(calls) < 2 {
				t.Fatalf("%s: no Status call in %v", phase, d)
			}
			for i := 1; i < len(calls); i++ {
				if g := calls[i].Sub(calls[i-1]); g != want {
					t.Errorf("%s: Status calls %v apart at %v, want %v", phase, g, calls[i].Sub(start), want)
				}
			}
			if c := r.Condition(); !c.Ready() {
				t.Errorf("%s: %+v", phase, c)
			}
		}
		synctest.Wait()
		gaps("base period", 30*time.Second, 5*time.Second)
		period.Store(int64(10 * time.Second))
		gaps("stretched to 10s", time.Minute, 10*time.Second)
		period.Store(int64(time.Minute))
		gaps("stretched to 1m", 2*time.Minute, MaxStatusInterval)
		// The fall back, 1 s after a check: the next check within a tick
		// (5 s), not at the stretched interval's end.
		time.Sleep(MaxStatusInterval - time.Second)
		period.Store(int64(time.Second))
		fellBack := time.Now()
		time.Sleep(MaxStatusInterval)
		synctest.Wait()
		st.mu.Lock()
		var next time.Time
		for _, c := range st.calls {
			if c.After(fellBack) {
				next = c
				break
			}
		}
		st.mu.Unlock()
		if next.IsZero() || next.Sub(fellBack) > 5*time.Second {
			t.Errorf("after the fall back: the next Status call %v after it, want within 5s", next.Sub(fellBack))
		}
		gaps("back to the base period", 30*time.Second, 5*time.Second)
		cancel()
		<-done
	})
}

// blockingStatus answers Status only once released (or its context ends),
// and fails with err when set.
type blockingStatus struct {
	release chan struct{}
	err     error
}

func (b *blockingStatus) Status(ctx context.Context) ([]cruntime.Condition, error) {
	if b.release != nil {
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if b.err != nil {
		return nil, b.err
	}
	return []cruntime.Condition{{Type: cruntime.RuntimeReady, Status: true}, {Type: cruntime.NetworkReady, Status: true}}, nil
}

// doubtLog records when Stalled was called, from the timer's goroutine.
type doubtLog struct {
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
}

func (d *doubtLog) stalled() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, time.Since(d.start))
}

// take returns the calls so far, and starts afresh from now.
func (d *doubtLog) take() []time.Duration {
	synctest.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	at := d.at
	d.at, d.start = nil, time.Now()
	return at
}

// TestReadinessDoubtsAStalledRuntime: a Status call that has not answered
// within StallAfter calls Stalled once, at that moment (the generator then
// lists soon: a stopped runtime sends no event); one that fails calls it
// once; one that answers in time never does.
func TestReadinessDoubtsAStalledRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &doubtLog{start: time.Now()}
		st := &blockingStatus{release: make(chan struct{})}
		r := NewReadiness(nil, ReadinessOptions{Runtime: st, Stalled: d.stalled})
		go func() {
			time.Sleep(5 * time.Second)
			close(st.release)
		}()
		r.CheckRuntime(t.Context())
		if got, want := d.take(), []time.Duration{DefaultStallAfter}; !slices.Equal(got, want) {
			t.Errorf("a call answering after 5s: doubts at %v, want %v", got, want)
		}
		if c := r.Condition(); !c.Ready() {
			t.Errorf("answered late but ready: %+v", c)
		}

		r.CheckRuntime(t.Context()) // released: answers at once
		time.Sleep(time.Minute)
		if got := d.take(); len(got) != 0 {
			t.Errorf("a call answering at once: doubts at %v, want none", got)
		}

		st.err = errors.New("unavailable")
		r.CheckRuntime(t.Context())
		if got, want := d.take(), []time.Duration{0}; !slices.Equal(got, want) {
			t.Errorf("a call failing at once: doubts at %v, want %v", got, want)
		}

		// Hung until its own timeout: one doubt, at StallAfter, not a
		// second for the failure.
		st.release, st.err = make(chan struct{}), nil
		r2 := NewReadiness(nil, ReadinessOptions{Runtime: st, Timeout: 30 * time.Second, StallAfter: time.Second, Stalled: d.stalled})
		r2.CheckRuntime(t.Context())
		if got, want := d.take(), []time.Duration{time.Second}; !slices.Equal(got, want) {
			t.Errorf("a call timing out: doubts at %v, want %v", got, want)
		}
	})
}

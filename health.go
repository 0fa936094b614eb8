package pleg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/utils/clock"
)

// Node Ready condition values, the kubelet's.
const (
	ReasonReady       = "KubeletReady"
	ReasonNotReady    = "KubeletNotReady"
	MessageReady      = "kubelet is posting ready status"
	runtimeStaleAfter = 30 * time.Second
	// MaxStatusInterval bounds how far the runtime's status checks stretch
	// with the adaptive relist (ReadinessOptions.Period): well below the
	// 30 s after which a runtime whose last ready answer is older counts as
	// down, so that a slow answer does not make it so; and short enough
	// that a runtime which stopped answering is doubted (Stalled) and
	// listed, and the forecast says so, within 30 s of its stop (10 s to
	// the next check, StallAfter, then the forecast's 10 s on the listing).
	MaxStatusInterval = 10 * time.Second
	// DefaultStallAfter is ReadinessOptions.StallAfter's default: a Status
	// call answers in milliseconds.
	DefaultStallAfter = 2 * time.Second
)

// HealthChecker is anything with a health check, such as a Generator.
type HealthChecker interface {
	Healthy() (bool, error)
}

// Condition is the node Ready condition the kubelet would post.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"` // "True" or "False"
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Errors are the individual failing checks joined in Message.
	Errors []string `json:"errors,omitempty"`
	// LastRuntimeStatus is when the runtime last reported itself ready.
	LastRuntimeStatus time.Time `json:"lastRuntimeStatus,omitzero"`
}

// Ready reports whether the condition's status is True.
func (c Condition) Ready() bool { return c.Status == "True" }

// Readiness aggregates the generator's health and the runtime's own status
// into the node Ready condition, as the kubelet does: a periodic CRI Status
// call must have found the runtime ready within the last 30 s, and every
// health check must pass.
type Readiness struct {
	checks   map[string]HealthChecker
	order    []string
	rt       cruntime.StatusChecker
	clock    clock.WithTickerAndDelayedExecution
	interval time.Duration
	period   func() time.Duration
	timeout  time.Duration
	stalled  func()
	stallAt  time.Duration
	log      logr.Logger

	mu          sync.Mutex
	lastSync    time.Time // the runtime last answered ready
	runtimeErr  error     // the runtime answered, but not ready
	networkErr  error
	lastStatErr error // the last Status call failed
	lastConds   []cruntime.Condition
	lastCondsAt time.Time // when the runtime last answered Status
}

// ReadinessOptions configure a Readiness.
type ReadinessOptions struct {
	// Runtime is asked for its status every Interval (default 5s), with
	// Timeout (default 2m) per call.
	Runtime  cruntime.StatusChecker
	Interval time.Duration
	Timeout  time.Duration
	// Period, when set, is how far the adaptive relist beside the check
	// has stretched its period (Generator.StretchedRelistPeriod: 0 when
	// not stretched). While it is longer than Interval (the runtime's
	// event stream is connected and relists find nothing no event
	// announced), Run checks the runtime's status every Period instead,
	// at most every MaxStatusInterval: at idle, the Status calls are about
	// as rare as the listings, and back to every Interval within a tick of
	// the relist's fall back.
	Period func() time.Duration
	// Stalled, when set, is called once for each Status call that has not
	// answered within StallAfter (default DefaultStallAfter), and for
	// each that fails (Generator.DoubtRuntime: a runtime that stops
	// answering is listed soon, not a stretched period later). It must
	// not block; it runs on a timer's goroutine.
	Stalled    func()
	StallAfter time.Duration
	Clock      clock.WithTickerAndDelayedExecution
	Logger     logr.Logger
}

// adaptiveRelister is a generator whose global relist may stretch
// (Generator): the check follows its period and tells it of a runtime in
// doubt.
type adaptiveRelister interface {
	StretchedRelistPeriod() time.Duration
	DoubtRuntime()
}

// NewReadiness returns a Readiness with the health check "PLEG". When
// pleg is a Generator, Period and Stalled default to its
// StretchedRelistPeriod and DoubtRuntime.
func NewReadiness(pleg HealthChecker, opts ReadinessOptions) *Readiness {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	if opts.StallAfter <= 0 {
		opts.StallAfter = DefaultStallAfter
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if a, ok := pleg.(adaptiveRelister); ok {
		if opts.Period == nil {
			opts.Period = a.StretchedRelistPeriod
		}
		if opts.Stalled == nil {
			opts.Stalled = a.DoubtRuntime
		}
	}
	r := &Readiness{checks: map[string]HealthChecker{}, rt: opts.Runtime, clock: opts.Clock,
		interval: opts.Interval, period: opts.Period, timeout: opts.Timeout,
		stalled: opts.Stalled, stallAt: opts.StallAfter, log: opts.Logger}
	if pleg != nil {
		r.AddCheck("PLEG", pleg)
	}
	return r
}

// AddCheck adds a named health check; a failing one reads
// "<name> is not healthy: <err>".
func (r *Readiness) AddCheck(name string, c HealthChecker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.checks[name]; !ok {
		r.order = append(r.order, name)
	}
	r.checks[name] = c
}

// Run checks the runtime's status at once and then every interval (see
// ReadinessOptions.Period) until ctx ends.
func (r *Readiness) Run(ctx context.Context) {
	t := r.clock.NewTicker(r.interval)
	defer t.Stop()
	for {
		last := r.clock.Now()
		r.CheckRuntime(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
			// Due at the first tick at least the interval after the last
			// check's start, less half a tick: ticks keep their phase, the
			// check's start lags its tick.
			if r.clock.Since(last) >= r.every()-r.interval/2 {
				break
			}
		}
	}
}

// every is how often Run checks the runtime's status now.
func (r *Readiness) every() time.Duration {
	if r.period == nil {
		return r.interval
	}
	return max(r.interval, min(r.period(), MaxStatusInterval))
}

// CheckRuntime asks the runtime for its status once.
func (r *Readiness) CheckRuntime(ctx context.Context) {
	if r.rt == nil {
		return
	}
	var stall clock.Timer
	if r.stalled != nil {
		stall = r.clock.AfterFunc(r.stallAt, r.stalled)
	}
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	conds, err := r.rt.Status(cctx)
	cancel()
	// Stop reports whether the stall had not been called yet: a failure
	// then doubts the runtime itself, once.
	unstalled := stall != nil && stall.Stop()
	if err != nil && ctx.Err() != nil {
		// The check was stopped (Run's end), not failed by the runtime:
		// the last answer stands.
		return
	}
	if err != nil {
		// Logged before the lock: a blocked log writer must not block
		// Condition().
		r.log.Error(err, "Container runtime sanity check failed")
		if unstalled {
			r.stalled()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastStatErr = err
	if err != nil {
		return
	}
	r.lastConds, r.lastCondsAt = conds, r.clock.Now()
	r.runtimeErr, r.networkErr = runtimeConditions(conds)
	if r.runtimeErr == nil {
		r.lastSync = r.clock.Now()
	}
}

// RuntimeConditionErrors returns what the runtime's status conditions
// (CRI Status) say is wrong, as the kubelet words it for the node Ready
// condition: "container runtime not ready: ..." for RuntimeReady, then
// "container runtime network not ready: ..." for NetworkReady. None when
// both are true.
func RuntimeConditionErrors(conds []cruntime.Condition) []error {
	rtErr, netErr := runtimeConditions(conds)
	var errs []error
	for _, e := range []error{rtErr, netErr} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	return errs
}

// runtimeConditions is the rule of RuntimeConditionErrors, one error for
// each condition.
func runtimeConditions(conds []cruntime.Condition) (runtimeErr, networkErr error) {
	var rtReady, netReady *cruntime.Condition
	for i := range conds {
		switch conds[i].Type {
		case cruntime.RuntimeReady:
			rtReady = &conds[i]
		case cruntime.NetworkReady:
			netReady = &conds[i]
		}
	}
	if netReady == nil || !netReady.Status {
		networkErr = fmt.Errorf("container runtime network not ready: %s", formatCondition(cruntime.NetworkReady, netReady))
	}
	if rtReady == nil || !rtReady.Status {
		runtimeErr = fmt.Errorf("container runtime not ready: %s", formatCondition(cruntime.RuntimeReady, rtReady))
	}
	return runtimeErr, networkErr
}

func formatCondition(typ string, c *cruntime.Condition) string {
	if c == nil {
		return typ + " condition is missing"
	}
	return fmt.Sprintf("%s=%t reason:%s message:%s", c.Type, c.Status, c.Reason, c.Message)
}

// RuntimeConditions returns the runtime's conditions as its last answered
// Status call gave them, when that was (zero: never), and the error of the
// last call if it failed since.
func (r *Readiness) RuntimeConditions() (conds []cruntime.Condition, at time.Time, lastErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastConds, r.lastCondsAt, r.lastStatErr
}

// Errors returns the failing checks in the kubelet's order: the runtime's
// liveness, the health checks, then the runtime's own readiness.
func (r *Readiness) Errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	switch {
	case r.rt == nil:
	case r.lastSync.IsZero():
		errs = append(errs, errors.New("container runtime status check may not have completed yet"))
	case !r.lastSync.Add(runtimeStaleAfter).After(r.clock.Now()):
		errs = append(errs, errors.New("container runtime is down"))
	}
	for _, name := range r.order {
		if ok, err := r.checks[name].Healthy(); !ok {
			errs = append(errs, fmt.Errorf("%s is not healthy: %v", name, err))
		}
	}
	if r.runtimeErr != nil {
		errs = append(errs, r.runtimeErr)
	}
	if r.networkErr != nil {
		errs = append(errs, r.networkErr)
	}
	return errs
}

// Condition returns the node Ready condition.
func (r *Readiness) Condition() Condition {
	errs := r.Errors()
	r.mu.Lock()
	c := Condition{Type: "Ready", LastRuntimeStatus: r.lastSync}
	r.mu.Unlock()
	if len(errs) == 0 {
		c.Status, c.Reason, c.Message = "True", ReasonReady, MessageReady
		return c
	}
	c.Status, c.Reason, c.Message = "False", ReasonNotReady, JoinErrors(errs)
	for _, e := range errs {
		c.Errors = append(c.Errors, e.Error())
	}
	return c
}

// JoinErrors joins errors the way the kubelet does: one error reads as
// itself, several as "[a, b]".
func JoinErrors(errs []error) string {
	switch len(errs) {
	case 0:
		return ""
	case 1:
		return errs[0].Error()
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return "[" + strings.Join(msgs, ", ") + "]"
}

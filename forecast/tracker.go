package forecast

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Tracker keeps the forecast of a node from what a relisting PLEG (pleg
// run's generator) observes: its global listings and the pods whose
// inspection fails. One goroutine (the generator's loop) tells it what
// happened, with the time; any goroutine asks for the Verdict at a time of
// its own. It reads no clock and does no I/O.
//
// It assumes the observer relists as the kubelet does (same runtime, same
// period): the kubelet's listing succeeds and fails when the observer's
// does, and the pods whose inspection fails are the same, so the kubelet
// reinspects them in every relist. A listing outstanding or failing for
// Detect counts as the runtime not answering; a pod's call counts as
// hanging once the observer's own bound on it expired.
//
// What it holds is bounded by the pods failing now: a pod's entry goes
// when its inspection succeeds or it is gone.
type Tracker struct {
	settings Settings
	detect   time.Duration

	mu sync.Mutex
	// lastOK is the start of the last successful listing; listTook how
	// long it took.
	lastOK   time.Time
	listTook time.Duration
	// listing is the start of the listing outstanding (zero: none).
	listing time.Time
	// downSince is the start of the first listing that failed since the
	// last success (zero: the last one succeeded); listErr its error.
	downSince time.Time
	listErr   string
	// suspect is who a diagnosis blamed for the runtime not answering
	// since suspectFor (the downSince or listing start it was made for).
	suspect    *Suspect
	suspectFor time.Time
	failing    map[string]*failure
}

// Suspect is a pod a diagnosis blames for the runtime not answering its
// listing: on containerd, a call waiting on the pod's stuck shim holds a
// container's lock, and the node-wide ListContainers waits for it (pleg
// diagnose's shim probe finds the shim).
type Suspect struct {
	Pod, PodUID string
	// Call is the call that found it (e.g. a verbose PodSandboxStatus that
	// hangs), ID what it was about.
	Call, ID string
}

type failure struct {
	ref   string
	call  Call
	since time.Time
}

// NewTracker returns a tracker for a kubelet with settings s; a listing
// that has not answered for detect (or keeps failing for it) means the
// runtime does not answer.
func NewTracker(s Settings, detect time.Duration) *Tracker {
	return &Tracker{settings: s.WithDefaults(), detect: max(detect, 0), failing: make(map[string]*failure)}
}

// Settings returns the kubelet settings the tracker forecasts for.
func (t *Tracker) Settings() Settings { return t.settings }

// ListStarted: a global listing started at start.
func (t *Tracker) ListStarted(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.listing = start
}

// Listed: the listing that started at start answered at now.
func (t *Tracker) Listed(start, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastOK, t.listTook = start, now.Sub(start)
	t.listing, t.downSince, t.listErr = time.Time{}, time.Time{}, ""
	t.suspect, t.suspectFor = nil, time.Time{}
}

// Blame names the suspect of the runtime not answering since since (a
// Verdict's Since); it holds until a listing answers, and only for that
// episode.
func (t *Tracker) Blame(since time.Time, s Suspect) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.suspect, t.suspectFor = &s, since
}

// ListFailed: the listing outstanding failed at now with err.
func (t *Tracker) ListFailed(now time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.downSince.IsZero() {
		t.downSince = cmp.Or(t.listing, now)
	}
	t.listing = time.Time{}
	// A listing that ran out of time did not answer: say that, not the
	// deadline's error.
	t.listErr = ""
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.listErr = err.Error()
	}
}

// PodFailed: the inspection of pod uid (ref "namespace/name") failed at
// now at call c; c.Hung says it did not answer within the observer's
// bound, c.Took how long it was waited for.
func (t *Tracker) PodFailed(now time.Time, uid, ref string, c Call) {
	c.Failed = true
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.failing[uid]
	if f == nil {
		f = &failure{since: now.Add(-c.Took)}
		t.failing[uid] = f
	}
	if ref != "" {
		f.ref = ref
	}
	f.call = c
}

// PodOK: pod uid was inspected successfully, or is gone.
func (t *Tracker) PodOK(uid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.failing, uid)
}

// Verdict is the forecast at a time.
type Verdict struct {
	Settings Settings
	// AtRisk is true when the kubelet's PLEG will report not healthy (or
	// does now), unless what is wrong ends first.
	AtRisk bool
	// RuntimeDown is true when the listing does not answer or keeps
	// failing: no relist of the kubelet succeeds.
	RuntimeDown bool
	// Estimate is the kubelet's relist as forecast (meaningless when
	// RuntimeDown).
	Estimate Estimate
	// Since is when the trouble that puts the kubelet at risk began;
	// UnhealthyAt the earliest time the kubelet's PLEG reports not healthy
	// because of it (both zero when not at risk). UnhealthyAt is zero too
	// when the runtime has never answered a listing.
	Since, UnhealthyAt time.Time
	// HungPods and FailingPods name the pods whose inspection hangs and
	// fails (hung included), the costliest first.
	HungPods, FailingPods []string
	// ListError is the listing's error when it fails.
	ListError string
	// Suspect is who a diagnosis blamed for the runtime not answering
	// (only with RuntimeDown).
	Suspect *Suspect
	// Now is the time of the verdict.
	Now time.Time
}

// Verdict returns the forecast at now.
func (t *Tracker) Verdict(now time.Time) Verdict {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := Verdict{Settings: t.settings, Now: now, ListError: t.listErr}
	s := t.settings

	pods := make([]*failure, 0, len(t.failing))
	uids := make(map[*failure]string, len(t.failing))
	for uid, f := range t.failing {
		pods = append(pods, f)
		uids[f] = uid
	}
	// The costliest first, then the oldest, then by name: the order of
	// blame and of the message.
	slices.SortFunc(pods, func(a, b *failure) int {
		return cmp.Or(cmp.Compare(s.Cost(b.call), s.Cost(a.call)), a.since.Compare(b.since),
			cmp.Compare(a.ref, b.ref), cmp.Compare(uids[a], uids[b]))
	})
	r := Relist{}
	if !t.lastOK.IsZero() {
		r.List = []Call{{Method: "ListPodSandbox+ListContainers", Took: t.listTook}}
	}
	for _, f := range pods {
		r.Pods = append(r.Pods, Pod{Ref: f.ref, UID: uids[f], Calls: []Call{f.call}})
		v.FailingPods = append(v.FailingPods, f.ref)
		if f.call.Hung {
			v.HungPods = append(v.HungPods, f.ref)
		}
	}
	v.Estimate = s.Estimate(r)

	// The runtime does not answer: a listing outstanding or failing for
	// detect. The kubelet's last successful relist started about when
	// ours did.
	down := t.downSince
	if down.IsZero() && !t.listing.IsZero() {
		down = t.listing
	}
	if !down.IsZero() && now.Sub(down) >= t.detect {
		v.AtRisk, v.RuntimeDown, v.Since = true, true, down
		if t.suspect != nil && t.suspectFor.Equal(down) {
			s := *t.suspect
			v.Suspect = &s
		}
		if !t.lastOK.IsZero() {
			v.UnhealthyAt = t.lastOK.Add(s.Threshold)
		}
		return v
	}
	if !v.Estimate.Exceeds {
		return v
	}
	// Failing pods make the relist too long. The trouble began when the
	// pods failing since the earliest came to cost more than the
	// threshold allows: the kubelet's relist that meets them all starts
	// about then (it may have passed one of them already, and start a
	// relist later: UnhealthyAt is the earliest).
	byAge := slices.Clone(pods)
	slices.SortStableFunc(byAge, func(a, b *failure) int { return a.since.Compare(b.since) })
	total := v.Estimate.List + s.Period
	for _, f := range byAge {
		total += s.Cost(f.call)
		if total > s.Threshold {
			v.Since = f.since
			break
		}
	}
	v.AtRisk, v.UnhealthyAt = true, v.Since.Add(s.Threshold)
	return v
}

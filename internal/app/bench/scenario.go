// Package bench measures the pod lifecycle event generator against the
// simulated CRI runtime (cruntime/sim): relist duration, runtime calls,
// CPU time and allocations per relist, for a set of node-sized scenarios,
// each run with pleg and, as the baseline from the same run, with the
// kubelet v1.37.2's own relist (the kubelet-relist program of the
// test/kubelet module: the kubelet's GenericPLEG over its runtime manager
// and CRI client). It is the engine of `pleg bench`.
//
// Relists are driven by hand (pleg.Generator.Relist on an unstarted
// generator, GenericPLEG.Relist in the kubelet's program), one after
// another, so each one is timed exactly. Between two relists the bench
// changes exactly Scenario.Changed pods in the simulated runtime (see
// workload.changePod), outside the measured window.
//
// Live scenarios (Scenario.Live, live.go) instead start the generator and
// measure it over a wall-time window while the simulated runtime streams
// events (for a hung pod, or a storm over every pod) or pods change: what
// single-pod relists, which only a started generator makes, cost the
// runtime and do to the global relists, to health and to delivery; each
// run with the runtime's events on and, as the baseline, off. Idle live
// scenarios (idle.go) measure instead what relisting a node where nothing
// changes costs, each relister on its own clock: the kubelet's PLEG
// started, pleg with its period fixed and with the adaptive global relist.
//
// The simulated runtime and each generator run in processes of their own
// (`pleg bench child runtime|pleg`, see ServeChild; the kubelet's is its
// own program), driven over one line protocol (internal/lineproto), so the CPU time,
// allocations and peak RSS reported are each one's own.
package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/podlifecycle/pleg/internal/textfmt"
)

// Scenario is one node shape and workload to measure.
type Scenario struct {
	// Name identifies the scenario on the command line.
	Name string `json:"name"`
	// Pods and Containers are the node's shape: Pods pods of Containers
	// containers each, plus one sandbox per pod.
	Pods       int `json:"pods"`
	Containers int `json:"containersPerPod"`
	// Changed is the number of distinct pods changed between two relists.
	Changed int `json:"changedPerRelist"`
	// Latency is added to every runtime call (list and status calls).
	Latency time.Duration `json:"latencyPerCall"`
	// HungPods is the number of pods whose status calls never answer
	// (0 or 1). The hung pod is also changed once, so the generator keeps
	// trying to inspect it.
	HungPods int `json:"hungPods"`

	// Relists is the number of measured relists per run (pleg);
	// KubeletRelists the number for the kubelet baseline (0: Relists).
	// Quick and QuickKubelet are the counts in quick mode.
	Relists        int `json:"relists"`
	KubeletRelists int `json:"kubeletRelists"`
	Quick          int `json:"-"`
	QuickKubelet   int `json:"-"`

	// Pause is the time between the end of a relist and the start of the
	// next, as the generator's relist period (0: back to back).
	Pause time.Duration `json:"pauseBetweenRelists"`
	// RequestTimeout is the runtime request timeout of every CRI call.
	RequestTimeout time.Duration `json:"runtimeRequestTimeout"`
	// InspectionTimeout is pleg's pod inspection timeout (0: the library
	// default). The kubelet has none.
	InspectionTimeout time.Duration `json:"podInspectionTimeout,omitempty"`
	// RelistThreshold, when positive, is the health threshold, and health
	// is checked during the measured relists.
	RelistThreshold time.Duration `json:"relistThreshold,omitempty"`

	// Live, when set, makes this a live scenario (live.go): a started
	// generator runs against the simulated runtime for a fixed wall time,
	// instead of relists driven by hand. Changed, Relists and Pause do not
	// apply to it; its kubelet baseline, if any, is a run of its own
	// (LiveRun.Kubelet).
	Live *LiveSpec `json:"live,omitempty"`

	// OnDemand leaves the scenario out of "all" (the default set): it
	// runs only when named, a full run of it taking minutes.
	OnDemand bool `json:"-"`
}

// LiveSpec is what a live scenario adds to a Scenario.
type LiveSpec struct {
	// Window is the measured wall time (Quick in quick mode), after the
	// generator's warm-up (see plegChild.start). Scenarios that make
	// Changes have no fixed window: it lasts as long as they do.
	Window time.Duration `json:"window,omitempty"`
	Quick  time.Duration `json:"-"`
	// RelistPeriod is the generator's relist period.
	RelistPeriod time.Duration `json:"relistPeriod"`
	// HangLists makes the list calls filtered to the hung pods hang too
	// (their status calls hang: Scenario.HungPods).
	HangLists bool `json:"hangLists,omitempty"`
	// HungPodEvents, when positive, makes the runtime stream an event for
	// each hung pod at this interval.
	HungPodEvents time.Duration `json:"hungPodEvents,omitempty"`
	// EventStorm, when positive, makes the runtime stream this many
	// events per second, spread over every pod in turn, from the
	// window's start; LiveRun.Storm says what they say.
	EventStorm int `json:"eventStormPerSecond,omitempty"`
	// Churn, when positive, changes this many pods every ChurnEvery from
	// the window's start (each change streams its events).
	Churn      int           `json:"churn,omitempty"`
	ChurnEvery time.Duration `json:"churnEvery,omitempty"`
	// Changes, when positive, changes one pod at a time this many times
	// (QuickChanges in quick mode; a fifth with events off, whose
	// deliveries wait for the relist period), each ChangeGap after the
	// last was delivered, and measures each change's delivery: from the
	// change in the runtime to the generator's event about the pod.
	Changes      int           `json:"changes,omitempty"`
	QuickChanges int           `json:"-"`
	ChangeGap    time.Duration `json:"changeGap,omitempty"`
	// API makes pleg's child serve the lifecycle API (as the daemon does)
	// in every run, for the runs' Watchers.
	API bool `json:"api,omitempty"`
	// Readiness makes pleg's child run the daemon's readiness check
	// (pleg.Readiness: a CRI Status call at once and every 5 s) beside
	// the generator in every run: its calls are pleg's too.
	Readiness bool `json:"readiness,omitempty"`
	// Idle measures a relister at rest without waking it (idle.go): no
	// health poller runs in pleg's process (Healthy is checked once, at
	// the window's end), and the window begins and ends right after a
	// global relist ends, so that it holds whole relist periods.
	Idle bool `json:"idle,omitempty"`
	// Runs are the runs of the scenario, each against a fresh runtime and
	// generator; the first is the baseline of the others. Nil: one run
	// with events on.
	Runs []LiveRun `json:"runs,omitempty"`
}

// LiveRun is one run of a live scenario.
type LiveRun struct {
	Name string `json:"name"`
	// Events turns the runtime's event stream on as hints.
	Events bool `json:"events"`
	// Storm is what the event storm says about each running container:
	// "" STOPPED and STARTED in turn, "started" or "stopped" only.
	Storm string `json:"storm,omitempty"`
	// Quiet leaves the scenario's churn off in this run: nothing changes.
	Quiet bool `json:"quiet,omitempty"`
	// Watchers is the number of lifecycle API watchers open through the
	// window (LiveSpec.API; see watchers): each reads every message, and
	// in a quiet run is idle after its snapshot.
	Watchers int `json:"watchers,omitempty"`
	// MaxRelistPeriod, when above the scenario's relist period, turns
	// pleg's adaptive global relist on (pleg.Options.MaxRelistPeriod);
	// QuickMaxRelistPeriod replaces it in quick mode (0: the same). The
	// warm-up then lasts until the period has grown to it.
	MaxRelistPeriod      time.Duration `json:"maxRelistPeriod,omitempty"`
	QuickMaxRelistPeriod time.Duration `json:"-"`
	// Kubelet makes this run the kubelet's own PLEG instead of pleg's
	// (Options.Kubelet: the kubelet-relist program, GenericPLEG.Start,
	// relisting on its own clock every RelistPeriod); it is left out
	// without Options.Kubelet.
	Kubelet bool `json:"kubelet,omitempty"`
}

// maxPeriod returns the run's MaxRelistPeriod.
func (r LiveRun) maxPeriod(quick bool) time.Duration {
	if quick && r.QuickMaxRelistPeriod > 0 {
		return r.QuickMaxRelistPeriod
	}
	return r.MaxRelistPeriod
}

// runs returns the runs of a live scenario; those of the kubelet only
// with kubelet (Options.Kubelet set).
func (l *LiveSpec) runs(kubelet bool) []LiveRun {
	if len(l.Runs) == 0 {
		return []LiveRun{{Name: "pleg", Events: true}}
	}
	var out []LiveRun
	for _, r := range l.Runs {
		if !r.Kubelet || kubelet {
			out = append(out, r)
		}
	}
	return out
}

// changes returns the number of changes of a run.
func (l *LiveSpec) changes(quick, events bool) int {
	n := l.Changes
	if quick && l.QuickChanges > 0 {
		n = l.QuickChanges
	}
	if !events {
		n = max(n/5, 3)
	}
	return n
}

// window returns the measured wall time of a live run.
func (l *LiveSpec) window(quick bool) time.Duration {
	if quick && l.Quick > 0 {
		return l.Quick
	}
	return l.Window
}

// Description is a one-line human description of the scenario.
func (s Scenario) Description() string {
	if s.Live != nil {
		return s.liveDescription()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods x %d containers", s.Pods, s.Containers)
	if s.HungPods == 1 {
		b.WriteString(", 1 pod whose status calls hang (changed once, so every relist tries to inspect it)")
	} else if s.HungPods > 1 {
		fmt.Fprintf(&b, ", %d pods whose status calls hang (each changed once)", s.HungPods)
	}
	switch {
	case s.Changed == 0 && s.HungPods > 0:
		b.WriteString(", no other pod changed")
	case s.Changed == 0:
		b.WriteString(", nothing changed")
	case s.Changed == 1:
		b.WriteString(", 1 pod changed per relist")
	default:
		fmt.Fprintf(&b, ", %d pods changed per relist", s.Changed)
	}
	if s.Latency > 0 {
		fmt.Fprintf(&b, ", %v per runtime call", s.Latency)
	} else {
		b.WriteString(", no call latency")
	}
	return b.String()
}

// relists returns the number of measured relists for a run.
func (s Scenario) relists(kubelet, quick bool, override int) int {
	n := s.Relists
	switch {
	case quick && kubelet:
		n = s.QuickKubelet
	case quick:
		n = s.Quick
	case kubelet && s.KubeletRelists > 0:
		n = s.KubeletRelists
	}
	if override > 0 {
		n = override
		// A kubelet relist with a hung pod lasts the full request
		// timeout: keep that run short whatever was asked.
		if kubelet && s.HungPods > 0 && n > maxHungKubeletRelists {
			n = maxHungKubeletRelists
		}
	}
	return max(n, 1)
}

const maxHungKubeletRelists = 5

// Scenarios returns the standard scenarios, in the order they run.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name: "66x7", Pods: 66, Containers: 7, Changed: 10, Latency: time.Millisecond,
			Relists: 40, KubeletRelists: 20, Quick: 4, QuickKubelet: 3,
			RequestTimeout: 2 * time.Second,
		},
		{
			Name: "500x10", Pods: 500, Containers: 10, Changed: 50, Latency: time.Millisecond,
			Relists: 25, KubeletRelists: 10, Quick: 3, QuickKubelet: 2,
			RequestTimeout: 2 * time.Second,
		},
		{
			Name: "1000x10-idle", Pods: 1000, Containers: 10, Changed: 0,
			Relists: 30, KubeletRelists: 30, Quick: 3, QuickKubelet: 3,
			RequestTimeout: 2 * time.Second,
		},
		{
			// A typical node, idle: the relist cost a node pays all day.
			Name: "110x5-idle", Pods: 110, Containers: 5, Changed: 0,
			Relists: 50, KubeletRelists: 50, Quick: 3, QuickKubelet: 3,
			RequestTimeout: 2 * time.Second,
		},
		{
			Name: "110x5-hung", Pods: 110, Containers: 5, Changed: 0, HungPods: 1,
			Relists: 40, KubeletRelists: 4, Quick: 8, QuickKubelet: 2,
			Pause:             100 * time.Millisecond,
			RequestTimeout:    2 * time.Second,
			InspectionTimeout: 250 * time.Millisecond,
			RelistThreshold:   time.Second,
		},
		// Live scenarios (live.go).
		{
			// The case: with single-pod relists on the relist
			// goroutine, the hung pod's filtered list held it for the
			// runtime request timeout.
			Name: "hung-pod-events", Pods: 110, Containers: 5, HungPods: 1, Latency: time.Millisecond,
			RequestTimeout:    2 * time.Minute,
			InspectionTimeout: time.Second,
			RelistThreshold:   2 * time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod:  20 * time.Millisecond,
				HangLists:     true,
				HungPodEvents: 20 * time.Millisecond,
			},
		},
		{
			Name: "hint-storm", Pods: 500, Containers: 5, Latency: time.Millisecond,
			RequestTimeout:    2 * time.Minute,
			InspectionTimeout: time.Second,
			RelistThreshold:   time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod: 100 * time.Millisecond,
				EventStorm:   3000,
			},
		},
		// The hint budget's goals (issue 18), events on against off.
		{
			// Runtime events that change nothing: STARTED for running
			// containers (events that name the state the records show are
			// skipped), and STOPPED for containers still running (no rule
			// can skip them: each is a single-pod relist, within the
			// budget).
			Name: "events-unchanged", Pods: 200, Containers: 5,
			RequestTimeout: 10 * time.Second, RelistThreshold: 10 * time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod: time.Second,
				EventStorm:   1000,
				Runs: []LiveRun{{Name: "events off"}, {Name: "on: STARTED", Events: true, Storm: "started"},
					{Name: "on: STOPPED", Events: true, Storm: "stopped"}},
			},
		},
		{
			// Churn with every change also streamed as events: the hints
			// race the global relist for the same pods.
			Name: "events-churn", Pods: 200, Containers: 5, Latency: 20 * time.Millisecond,
			RequestTimeout: 10 * time.Second, RelistThreshold: 10 * time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod: 100 * time.Millisecond,
				Churn:        50, ChurnEvery: 100 * time.Millisecond,
				Runs: []LiveRun{{Name: "events off"}, {Name: "events on", Events: true}},
			},
		},
		{
			// What lifecycle API watchers cost pleg (issue 26): RSS with
			// 200 watchers beside none, on a quiet node (idle watchers)
			// and with about 20 events a second (reading watchers: each
			// pod change is a container's death, removal and restart).
			Name: "watchers", Pods: 110, Containers: 5,
			RequestTimeout: 10 * time.Second, RelistThreshold: 10 * time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod: time.Second,
				Churn:        1, ChurnEvery: 150 * time.Millisecond,
				API: true,
				Runs: []LiveRun{
					{Name: "quiet, no watcher", Events: true, Quiet: true},
					{Name: "quiet, 200 idle watchers", Events: true, Quiet: true, Watchers: 200},
					{Name: "churn, no watcher", Events: true},
					{Name: "churn, 200 reading watchers", Events: true, Watchers: 200},
				},
			},
		},
		{
			// One pod changes at a time: the budget must not delay a
			// change that comes alone.
			Name: "events-isolated", Pods: 200, Containers: 5, Latency: time.Millisecond,
			RequestTimeout: 10 * time.Second, RelistThreshold: 10 * time.Second,
			Live: &LiveSpec{
				RelistPeriod: time.Second,
				Changes:      40, QuickChanges: 8, ChangeGap: 500 * time.Millisecond,
				Runs: []LiveRun{{Name: "events off"}, {Name: "events on", Events: true}},
			},
		},
		// The adaptive global relist (issue 37), with churn: events-churn
		// with the period fixed and adaptive, events on in both.
		{
			Name: "events-churn-adaptive", Pods: 200, Containers: 5, Latency: 20 * time.Millisecond,
			RequestTimeout: 10 * time.Second, RelistThreshold: 10 * time.Second,
			Live: &LiveSpec{
				Window: 12 * time.Second, Quick: 4 * time.Second,
				RelistPeriod: 100 * time.Millisecond,
				Churn:        50, ChurnEvery: 100 * time.Millisecond,
				Runs: []LiveRun{{Name: "period 100ms", Events: true},
					{Name: "adaptive to 1s", Events: true, MaxRelistPeriod: time.Second}},
			},
		},
		{
			// events-isolated, events on, with the period fixed and adaptive:
			// a change the runtime announces waits for no global relist.
			Name: "events-isolated-adaptive", Pods: 200, Containers: 5, Latency: time.Millisecond,
			RequestTimeout: 10 * time.Second, RelistThreshold: 30 * time.Second,
			Live: &LiveSpec{
				RelistPeriod: time.Second,
				Changes:      40, QuickChanges: 8, ChangeGap: 500 * time.Millisecond,
				Runs: []LiveRun{{Name: "period 1s", Events: true},
					{Name: "adaptive to 10s", Events: true, MaxRelistPeriod: 10 * time.Second, QuickMaxRelistPeriod: 2 * time.Second}},
			},
		},
		// At rest beside the kubelet's PLEG (idle.go): on demand, each
		// lasts about four minutes with --kubelet.
		{
			Name: "1000x10-idle-adaptive", Pods: 1000, Containers: 10,
			RequestTimeout: 2 * time.Second, OnDemand: true, Live: idleAdaptive(),
		},
		{
			Name: "110x5-idle-adaptive", Pods: 110, Containers: 5,
			RequestTimeout: 2 * time.Second, OnDemand: true, Live: idleAdaptive(),
		},
	}
}

// idleAdaptive is the live spec of the idle scenarios of issue 37: the
// kubelet's PLEG relisting every second on its own clock, pleg relisting
// every second, and pleg with the adaptive global relist up to 10 s (2 s
// in quick mode), each for a minute (3 s in quick mode).
func idleAdaptive() *LiveSpec {
	return &LiveSpec{
		Window: time.Minute, Quick: 3 * time.Second,
		RelistPeriod: time.Second, Readiness: true, Idle: true,
		Runs: []LiveRun{
			{Name: "kubelet, 1s", Kubelet: true},
			{Name: "pleg, 1s", Events: true},
			{Name: "pleg, adaptive to 30s", Events: true, MaxRelistPeriod: 30 * time.Second, QuickMaxRelistPeriod: 2 * time.Second},
		},
	}
}

// Lookup returns the scenarios named by spec: "all" (every scenario but
// those on demand), or names separated by commas.
func Lookup(spec string) ([]Scenario, error) {
	all := Scenarios()
	if spec == "" || spec == "all" {
		return slices.DeleteFunc(all, func(s Scenario) bool { return s.OnDemand }), nil
	}
	var out []Scenario
	for _, name := range strings.Split(spec, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown scenario %q (want all or one of %s)", name, strings.Join(Names(), ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// Names returns the names of the standard scenarios.
func Names() []string {
	var out []string
	for _, s := range Scenarios() {
		out = append(out, s.Name)
	}
	return out
}

// liveDescription is the Description of a live scenario.
func (s Scenario) liveDescription() string {
	l := s.Live
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods x %d containers", s.Pods, s.Containers)
	if s.HungPods > 0 {
		what := "status calls"
		if l.HangLists {
			what = "status calls and filtered list calls"
		}
		fmt.Fprintf(&b, ", %d %s whose %s hang from the window's start", s.HungPods, textfmt.Plural(s.HungPods, "pod", "pods"), what)
		if l.HungPodEvents > 0 {
			fmt.Fprintf(&b, ", a runtime event for it every %v", l.HungPodEvents)
		}
	}
	if l.EventStorm > 0 {
		fmt.Fprintf(&b, ", %s runtime events per second spread over every pod", groupThousands(int64(l.EventStorm)))
		if slices.ContainsFunc(l.Runs, func(r LiveRun) bool { return r.Storm != "" }) {
			b.WriteString(", each about a running container that keeps running")
		}
	}
	if l.Churn > 0 {
		fmt.Fprintf(&b, ", %d %s changed every %v (each change streamed as runtime events)", l.Churn, textfmt.Plural(l.Churn, "pod", "pods"), l.ChurnEvery)
		if slices.ContainsFunc(l.Runs, func(r LiveRun) bool { return r.Quiet }) {
			b.WriteString(" in the runs not quiet")
		}
	}
	if l.API {
		b.WriteString(", the lifecycle API served")
		if slices.ContainsFunc(l.Runs, func(r LiveRun) bool { return r.Watchers > 0 }) {
			b.WriteString(" to watchers on connections of their own")
		}
	}
	if l.Changes > 0 {
		fmt.Fprintf(&b, ", one pod changed at a time, %v after the last change was delivered (%d changes; a fifth with events off)", l.ChangeGap, l.Changes)
	}
	if l.Idle {
		b.WriteString(", nothing changed")
	}
	if s.Latency > 0 {
		fmt.Fprintf(&b, ", %v per runtime call", s.Latency)
	}
	if hasKubeletRun(l) {
		fmt.Fprintf(&b, "; the kubelet's PLEG started (a relist every %v after the end of the last) and", l.RelistPeriod)
	} else {
		b.WriteString(";")
	}
	fmt.Fprintf(&b, " a started generator, relist period %v", l.RelistPeriod)
	for _, r := range l.Runs {
		if r.MaxRelistPeriod > l.RelistPeriod {
			fmt.Fprintf(&b, ", adaptive up to %v in run %q", r.MaxRelistPeriod, r.Name)
		}
	}
	if l.Readiness {
		b.WriteString(", with the daemon's readiness check (a CRI Status call every 5s, as rarely as a stretched relist up to 10s)")
	}
	return b.String()
}

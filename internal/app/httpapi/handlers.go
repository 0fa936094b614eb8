package httpapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/podcache"
)

// healthz answers 200 "ok" while the generator is healthy, else 500 with
// the body "PLEG is not healthy: <err>", the kubelet's wording for a failed
// PLEG check (for example "PLEG is not healthy: pleg was last seen active
// 3m0.1s ago; threshold is 3m0s").
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	if ok, err := s.cfg.Generator.Healthy(); !ok {
		msg := "PLEG is not healthy"
		if err != nil {
			msg += ": " + err.Error()
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(msg))
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// ReadyzBody is the JSON body of /readyz: the node Ready condition, and
// details about the generator.
type ReadyzBody struct {
	pleg.Condition
	// LastRuntimeStatus shadows the condition's field so that it is absent,
	// rather than year 1, before the runtime first reported ready.
	LastRuntimeStatus string       `json:"lastRuntimeStatus,omitempty"`
	Details           ReadyDetails `json:"details"`
	// Forecast is the forecast of the kubelet's PLEG: a verdict beside
	// pleg's own health (docs/forecast.md).
	Forecast Forecast `json:"forecast"`
}

// Forecast is forecast.Verdict for people and programs: whether the
// kubelet's PLEG will report "PLEG is not healthy", when, and because of
// which pod and call.
type Forecast struct {
	AtRisk bool `json:"atRisk"`
	// Message is one sentence (what `pleg check --forecast` prints).
	Message string `json:"message"`
	// RuntimeDown is true when the runtime does not answer its listing.
	RuntimeDown bool `json:"runtimeDown"`
	// RelistSeconds is the kubelet's relist as forecast (absent when the
	// runtime does not answer its listing).
	RelistSeconds    *float64 `json:"relistSeconds,omitempty"`
	ThresholdSeconds float64  `json:"thresholdSeconds"`
	// RequestTimeoutSeconds is the kubelet's --runtime-request-timeout the
	// forecast assumes.
	RequestTimeoutSeconds float64 `json:"requestTimeoutSeconds"`
	// Since is when the trouble began; UnhealthyAt the earliest time the
	// kubelet reports not healthy (both absent when not at risk).
	Since       string `json:"since,omitempty"`
	UnhealthyAt string `json:"unhealthyAt,omitempty"`
	// Pod, PodUID, Call and ID name the call to blame (absent when none).
	Pod    string `json:"pod,omitempty"`
	PodUID string `json:"podUID,omitempty"`
	Call   string `json:"call,omitempty"`
	ID     string `json:"id,omitempty"`
	// HungPods and FailingPods are the pods whose inspection hangs and
	// fails (hung included), the costliest first.
	HungPods    []string `json:"hungPods,omitempty"`
	FailingPods []string `json:"failingPods,omitempty"`
}

// forecastOf turns a verdict into its JSON form.
func forecastOf(v forecast.Verdict) Forecast {
	f := Forecast{AtRisk: v.AtRisk, Message: v.Message(), RuntimeDown: v.RuntimeDown,
		ThresholdSeconds: v.Settings.Threshold.Seconds(), RequestTimeoutSeconds: v.Settings.RequestTimeout.Seconds(),
		HungPods: v.HungPods, FailingPods: v.FailingPods}
	if !v.RuntimeDown {
		s := v.Estimate.Relist.Seconds()
		f.RelistSeconds = &s
	}
	if v.AtRisk {
		f.Since, f.UnhealthyAt = formatTime(v.Since), formatTime(v.UnhealthyAt)
	}
	if c := v.Estimate.Cause; c != nil && !v.RuntimeDown && c.Call.Failed {
		f.Pod, f.PodUID, f.Call, f.ID = c.Pod, c.PodUID, c.Call.Method, c.Call.ID
	}
	if s := v.Suspect; s != nil {
		f.Pod, f.PodUID, f.Call, f.ID = s.Pod, s.PodUID, s.Call, s.ID
	}
	return f
}

// ReadyDetails tells when the generator last relisted successfully and
// whether a relist is running now.
type ReadyDetails struct {
	// LastRelist is the start of the last successful relist (absent before
	// the first), RFC 3339 with nanoseconds.
	LastRelist string `json:"lastRelist,omitempty"`
	// RelistRunningSeconds is how long the relist now running has been
	// running (0: none runs).
	RelistRunningSeconds float64 `json:"relistRunningSeconds"`
	// EventStream is the state of the runtime's container event stream.
	EventStream EventStream `json:"eventStream"`
}

// EventStream is pleg.EventStreamStatus with absent, rather than zero,
// times.
type EventStream struct {
	Mode        pleg.EventsMode `json:"mode"`
	State       string          `json:"state"`
	Connects    int64           `json:"connects"`
	Events      int64           `json:"events"`
	LastEvent   string          `json:"lastEvent,omitempty"`
	LastError   string          `json:"lastError,omitempty"`
	RetryAt     string          `json:"retryAt,omitempty"`
	ConnectedAt string          `json:"connectedAt,omitempty"`
}

func eventStream(s pleg.EventStreamStatus) EventStream {
	return EventStream{Mode: s.Mode, State: s.State, Connects: s.Connects, Events: s.Events,
		LastEvent: formatTime(s.LastEvent), LastError: s.LastError, RetryAt: formatTime(s.RetryAt),
		ConnectedAt: formatTime(s.ConnectedAt)}
}

// readyz answers the Ready condition as JSON: 200 when True, 503 when False.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	c := s.cfg.Readiness.Condition()
	body := ReadyzBody{Condition: c, LastRuntimeStatus: formatTime(c.LastRuntimeStatus), Details: ReadyDetails{
		RelistRunningSeconds: s.cfg.Generator.RelistRunningFor().Seconds(),
		EventStream:          eventStream(s.cfg.Generator.EventStream()),
	}, Forecast: forecastOf(s.cfg.Generator.Forecast())}
	if t := s.cfg.Generator.LastRelist(); !t.IsZero() {
		body.Details.LastRelist = formatTime(t)
	}
	code := http.StatusOK
	if !c.Ready() {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	s.writeJSON(w, code, body)
}

// PodsBody is the JSON body of /api/v1/pods.
type PodsBody struct {
	// Timestamp is the cache's global timestamp: every entry is at least
	// this fresh (absent before the first relist).
	Timestamp string `json:"timestamp,omitempty"`
	Pods      []Pod  `json:"pods"`
}

// Pod is one entry of the pod status cache.
type Pod struct {
	UID        string      `json:"podUID"`
	Name       string      `json:"podName"`
	Namespace  string      `json:"podNamespace"`
	IPs        []string    `json:"ips"`
	Sandboxes  []Sandbox   `json:"sandboxes"`
	Containers []Container `json:"containers"`
	// Error is the error of the inspection that produced this entry.
	Error string `json:"error,omitempty"`
	// SlowInspection is set when that error is a pod inspection timeout.
	SlowInspection *SlowInspection `json:"slowInspection,omitempty"`
	ObservedAt     string          `json:"observedAt,omitempty"`
}

// SlowInspection describes a pod whose inspection exceeded the pod
// inspection timeout: the runtime call it was stuck in and for how long.
type SlowInspection struct {
	Call          string  `json:"call"` // e.g. ContainerStatus
	ID            string  `json:"id,omitempty"`
	WaitedSeconds float64 `json:"waitedSeconds"`
	// StillRunning: an earlier inspection has not returned yet, so no new
	// call was made.
	StillRunning bool `json:"stillRunning,omitempty"`
}

// Sandbox is one pod sandbox of a Pod.
type Sandbox struct {
	ID        string   `json:"id"`
	State     string   `json:"state"`
	CreatedAt string   `json:"createdAt,omitempty"`
	Attempt   uint32   `json:"attempt"`
	IPs       []string `json:"ips"`
}

// Container is one container of a Pod. ExitCode is present for exited
// containers only.
type Container struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	State      string `json:"state"`
	Attempt    uint32 `json:"attempt"`
	Image      string `json:"image"`
	ExitCode   *int32 `json:"exitCode,omitempty"`
	Reason     string `json:"reason,omitempty"`
	StartedAt  string `json:"startedAt,omitempty"`
	FinishedAt string `json:"finishedAt,omitempty"`
}

// pods answers the pod status cache as JSON, pods sorted by namespace,
// name and UID, sandboxes by creation time and ID, containers by name,
// attempt and ID.
func (s *Server) pods(w http.ResponseWriter, _ *http.Request) {
	c := s.cfg.Generator.Cache()
	body := PodsBody{Pods: PodsFromCache(c.List())}
	if t := c.Timestamp(); !t.IsZero() {
		body.Timestamp = formatTime(t)
	}
	w.Header().Set("Cache-Control", "no-store")
	s.writeJSON(w, http.StatusOK, body)
}

// PodsFromCache converts cache entries to their JSON form, keeping their
// order.
func PodsFromCache(entries []podcache.Entry) []Pod {
	out := make([]Pod, 0, len(entries))
	for _, e := range entries {
		st := e.Status
		if st == nil {
			st = &cruntime.PodStatus{}
		}
		p := Pod{UID: string(st.UID), Name: st.Name, Namespace: st.Namespace,
			IPs: nonNil(st.IPs), Sandboxes: []Sandbox{}, Containers: []Container{}}
		if e.Err != nil {
			p.Error = e.Err.Error()
			var te *pleg.InspectionTimeoutError
			if errors.As(e.Err, &te) {
				p.SlowInspection = &SlowInspection{Call: te.Call(), ID: te.ID,
					WaitedSeconds: te.Waited.Seconds(), StillRunning: te.StillRunning}
			}
		}
		if !e.Modified.IsZero() {
			p.ObservedAt = formatTime(e.Modified)
		}
		sandboxes := slices.DeleteFunc(slices.Clone(st.SandboxStatuses), func(sb *cruntime.SandboxStatus) bool { return sb == nil })
		slices.SortStableFunc(sandboxes, func(a, b *cruntime.SandboxStatus) int {
			return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
		})
		for _, sb := range sandboxes {
			p.Sandboxes = append(p.Sandboxes, Sandbox{ID: sb.ID, State: sb.State.String(),
				CreatedAt: formatTime(sb.CreatedAt), Attempt: sb.Attempt, IPs: nonNil(sb.IPs)})
		}
		containers := slices.DeleteFunc(slices.Clone(st.ContainerStatuses), func(cs *cruntime.ContainerStatus) bool { return cs == nil })
		slices.SortStableFunc(containers, func(a, b *cruntime.ContainerStatus) int {
			return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Attempt, b.Attempt), cmp.Compare(a.ID, b.ID))
		})
		for _, cs := range containers {
			ct := Container{ID: cs.ID, Name: cs.Name, State: cs.State.String(), Attempt: cs.Attempt,
				Image: cs.Image, Reason: cs.Reason, StartedAt: formatTime(cs.StartedAt),
				FinishedAt: formatTime(cs.FinishedAt)}
			if cs.State == cruntime.StateExited {
				code := cs.ExitCode
				ct.ExitCode = &code
			}
			p.Containers = append(p.Containers, ct)
		}
		out = append(out, p)
	}
	return out
}

// streamOutbox is the queue of one event stream.
type streamOutbox = outbox.Outbox[[]byte]

func (s *Server) addOutbox(o *streamOutbox) {
	s.outboxMu.Lock()
	s.outboxes[o] = struct{}{}
	s.outboxMu.Unlock()
}

func (s *Server) removeOutbox(o *streamOutbox) {
	s.outboxMu.Lock()
	delete(s.outboxes, o)
	s.outboxMu.Unlock()
}

// streamStats returns the number of open event streams and the bytes
// queued for them.
func (s *Server) streamStats() (streams, queued int) {
	s.outboxMu.Lock()
	defer s.outboxMu.Unlock()
	for o := range s.outboxes {
		queued += o.Queued()
	}
	return len(s.outboxes), queued
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		s.cfg.Logger.Error(err, "Encoding a response failed")
		http.Error(w, "internal error: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// formatTime formats t as RFC 3339 with nanoseconds in UTC; "" for the
// zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// relistJSON is one relist in /api/v1/relists.
type relistJSON struct {
	Start           string  `json:"start"`
	DurationSeconds float64 `json:"durationSeconds"`
	Pods            int     `json:"pods"`
	Containers      int     `json:"containers"`
	Inspected       int     `json:"inspected"`
	Failed          int     `json:"failed"`
	TimedOut        int     `json:"timedOut"`
	Events          int     `json:"events"`
	Error           string  `json:"error,omitempty"`
	// NextPeriodSeconds is the period the relist's end set to the next
	// (with --max-relist-period, how far it has stretched).
	NextPeriodSeconds float64 `json:"nextPeriodSeconds"`
}

// relists serves the recent global relists (oldest first), the relist
// running now and the health threshold, for the dashboard's chart.
func (s *Server) relists(w http.ResponseWriter, _ *http.Request) {
	g := s.cfg.Generator
	stats := g.RecentRelists()
	out := struct {
		ThresholdSeconds       float64      `json:"thresholdSeconds"`
		RelistRunningSeconds   float64      `json:"relistRunningSeconds"`
		LastRelist             string       `json:"lastRelist,omitempty"`
		SecondsSinceLastRelist float64      `json:"secondsSinceLastRelist,omitempty"`
		Relists                []relistJSON `json:"relists"`
	}{
		ThresholdSeconds:     g.RelistThreshold().Seconds(),
		RelistRunningSeconds: g.RelistRunningFor().Seconds(),
		LastRelist:           formatTime(g.LastRelist()),
		Relists:              make([]relistJSON, 0, len(stats)),
	}
	if last := g.LastRelist(); !last.IsZero() {
		out.SecondsSinceLastRelist = time.Since(last).Seconds()
	}
	for _, st := range stats {
		out.Relists = append(out.Relists, relistJSON{
			Start: formatTime(st.Start), DurationSeconds: st.Duration.Seconds(), Pods: st.Pods,
			Containers: st.Containers, Inspected: st.Inspected, Failed: st.Failed, TimedOut: st.TimedOut,
			Events: st.Events, Error: st.Err, NextPeriodSeconds: st.NextPeriod.Seconds(),
		})
	}
	s.writeJSON(w, http.StatusOK, out)
}

package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/podlifecycle/pleg"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/podcache"
)

func get(t *testing.T, h http.Handler, path string) (int, string, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	// The address a local client (curl, pleg pods) names: the Host check
	// passes it.
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1:10265"+path, nil))
	return rec.Code, rec.Body.String(), rec.Header()
}

func TestHealthz(t *testing.T) {
	g, err := pleg.New(pleg.Options{Runtime: newFakeRuntime()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	tests := []struct {
		name     string
		gen      Generator
		wantCode int
		wantBody string
	}{
		{"before the first relist", g, 500, "PLEG is not healthy: pleg has yet to be successful"},
		{"stale", healthOverride{g, &pleg.NotHealthyError{Elapsed: 3*time.Minute + 100*time.Millisecond, Threshold: 3 * time.Minute}},
			500, "PLEG is not healthy: pleg was last seen active 3m0.1s ago; threshold is 3m0s"},
		{"healthy", healthOverride{g, nil}, 200, "ok"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Config{Generator: tc.gen})
			code, body, h := get(t, s.Handler(), "/healthz")
			if code != tc.wantCode || body != tc.wantBody {
				t.Errorf("GET /healthz = %d %q, want %d %q", code, body, tc.wantCode, tc.wantBody)
			}
			if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
	t.Run("real generator", func(t *testing.T) {
		s := New(Config{Generator: startGenerator(t, newFakeRuntime())})
		if code, body, _ := get(t, s.Handler(), "/healthz"); code != 200 || body != "ok" {
			t.Errorf("GET /healthz = %d %q, want 200 ok", code, body)
		}
	})
	t.Run("POST", func(t *testing.T) {
		s := New(Config{Generator: g})
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "http://localhost/healthz", nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST /healthz = %d, want 405", rec.Code)
		}
	})
}

func TestReadyz(t *testing.T) {
	g := startGenerator(t, newFakeRuntime())
	lrs := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	notReady := pleg.Condition{Type: "Ready", Status: "False", Reason: pleg.ReasonNotReady,
		Message: "[container runtime is down, PLEG is not healthy: pleg has yet to be successful]",
		Errors:  []string{"container runtime is down", "PLEG is not healthy: pleg has yet to be successful"}}
	tests := []struct {
		name     string
		cfg      Config
		wantCode int
		want     map[string]any
	}{
		{"ready", Config{Generator: g, Readiness: fixedCondition{Type: "Ready", Status: "True", Reason: pleg.ReasonReady,
			Message: pleg.MessageReady, LastRuntimeStatus: lrs}}, 200,
			map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady",
				"message": "kubelet is posting ready status", "lastRuntimeStatus": "2026-01-02T03:04:05.000000006Z"}},
		{"not ready", Config{Generator: g, Readiness: fixedCondition(notReady)}, 503,
			map[string]any{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": notReady.Message,
				"errors": []any{"container runtime is down", "PLEG is not healthy: pleg has yet to be successful"}}},
		{"health only, healthy", Config{Generator: g}, 200,
			map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}},
		{"health only, unhealthy", Config{Generator: healthOverride{g, &pleg.NotHealthyError{Elapsed: 5 * time.Second, Threshold: 2 * time.Second}}}, 503,
			map[string]any{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
				"message": "PLEG is not healthy: pleg was last seen active 5s ago; threshold is 2s",
				"errors":  []any{"PLEG is not healthy: pleg was last seen active 5s ago; threshold is 2s"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, h := get(t, New(tc.cfg).Handler(), "/readyz")
			if code != tc.wantCode {
				t.Errorf("code = %d, want %d", code, tc.wantCode)
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			details, ok := got["details"].(map[string]any)
			if !ok {
				t.Fatalf("no details object: %s", body)
			}
			delete(got, "details")
			// The forecast, a verdict beside the condition, whatever it is.
			fc, _ := got["forecast"].(map[string]any)
			if msg, _ := fc["message"].(string); fc["atRisk"] != false || fc["runtimeDown"] != false ||
				fc["thresholdSeconds"] != 180.0 || fc["requestTimeoutSeconds"] != 120.0 ||
				!strings.HasPrefix(msg, "the kubelet's PLEG is not at risk: its relist would take ~") {
				t.Errorf("forecast = %v", got["forecast"])
			}
			delete(got, "forecast")
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("body = %v\nwant  %v", got, tc.want)
			}
			if _, err := time.Parse(time.RFC3339Nano, details["lastRelist"].(string)); err != nil {
				t.Errorf("details.lastRelist: %v", err)
			}
			es, _ := details["eventStream"].(map[string]any)
			if es["mode"] != "off" || es["state"] != "off" {
				t.Errorf("details.eventStream = %v, want mode and state off", es)
			}
			if _, ok := es["lastEvent"]; ok {
				t.Errorf("details.eventStream has a lastEvent before any event: %v", es)
			}
		})
	}
}

// samplePods is a node with two pods listed in an order the API must not
// keep: pod b (two sandboxes, an exited container and a running one) and
// pod a (its status call fails).
func samplePods() *fakeRuntime {
	rt := newFakeRuntime()
	rt.pods = []*cruntime.Pod{
		{UID: "uid-b", Name: "web", Namespace: "prod",
			Sandboxes: []*cruntime.Container{
				{ID: "sb-new", Name: "web", Attempt: 1, State: cruntime.StateRunning, CreatedAt: 2e18},
				{ID: "sb-old", Name: "web", Attempt: 0, State: cruntime.StateExited, CreatedAt: 1e18},
			},
			Containers: []*cruntime.Container{
				{ID: "c-sidecar", Name: "sidecar", State: cruntime.StateRunning, Image: "busybox:1.36"},
				{ID: "c-app-1", Name: "app", Attempt: 1, State: cruntime.StateRunning, Image: "nginx:1.27"},
				{ID: "c-app-0", Name: "app", Attempt: 0, State: cruntime.StateExited, Image: "nginx:1.27"},
			}},
		{UID: "uid-a", Name: "db", Namespace: "default",
			Sandboxes: []*cruntime.Container{{ID: "sb-a", Name: "db", State: cruntime.StateRunning, CreatedAt: 1e18}}},
	}
	rt.exitCodes["c-app-0"] = 3
	rt.ips["uid-b"] = []string{"10.88.0.7"}
	rt.fail["uid-a"] = errInspect
	return rt
}

func TestPods(t *testing.T) {
	g := startGenerator(t, samplePods())
	waitFor(t, "both pods in the cache", func() bool { return g.Cache().Len() == 2 })
	code, body, _ := get(t, New(Config{Generator: g}).Handler(), "/api/v1/pods")
	if code != 200 {
		t.Fatalf("code = %d: %s", code, body)
	}
	var got PodsBody
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if _, err := time.Parse(time.RFC3339Nano, got.Timestamp); err != nil {
		t.Errorf("timestamp %q: %v", got.Timestamp, err)
	}
	for i := range got.Pods {
		if _, err := time.Parse(time.RFC3339Nano, got.Pods[i].ObservedAt); err != nil {
			t.Errorf("pod %d observedAt %q: %v", i, got.Pods[i].ObservedAt, err)
		}
		got.Pods[i].ObservedAt = ""
	}
	three := int32(3)
	started, finished := "2026-01-02T03:04:05Z", "2026-01-02T03:05:05Z"
	want := []Pod{
		// A failed inspection caches the pod's identity and the error.
		{UID: "uid-a", Name: "db", Namespace: "default", IPs: []string{}, Error: errInspect.Error(),
			Sandboxes: []Sandbox{}, Containers: []Container{}},
		{UID: "uid-b", Name: "web", Namespace: "prod", IPs: []string{"10.88.0.7"},
			Sandboxes: []Sandbox{
				{ID: "sb-old", State: "exited", CreatedAt: "2001-09-09T01:46:40Z", IPs: []string{"10.88.0.7"}},
				{ID: "sb-new", State: "running", CreatedAt: "2033-05-18T03:33:20Z", Attempt: 1, IPs: []string{"10.88.0.7"}},
			},
			Containers: []Container{
				{ID: "c-app-0", Name: "app", State: "exited", Image: "nginx:1.27", ExitCode: &three, Reason: "Error", StartedAt: started, FinishedAt: finished},
				{ID: "c-app-1", Name: "app", State: "running", Attempt: 1, Image: "nginx:1.27", StartedAt: started},
				{ID: "c-sidecar", Name: "sidecar", State: "running", Image: "busybox:1.36", StartedAt: started},
			}},
	}
	if !reflect.DeepEqual(got.Pods, want) {
		gb, _ := json.MarshalIndent(got.Pods, "", " ")
		wb, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("pods =\n%s\nwant\n%s", gb, wb)
	}

	// The exact keys of the wire form.
	var raw struct {
		Pods []map[string]json.RawMessage `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	wantKeys := map[string][]string{
		"uid-a": {"containers", "error", "ips", "observedAt", "podName", "podNamespace", "podUID", "sandboxes"},
		"uid-b": {"containers", "ips", "observedAt", "podName", "podNamespace", "podUID", "sandboxes"},
	}
	for _, p := range raw.Pods {
		var uid string
		_ = json.Unmarshal(p["podUID"], &uid)
		if keys := slices.Sorted(maps.Keys(p)); !reflect.DeepEqual(keys, wantKeys[uid]) {
			t.Errorf("pod %s keys = %v, want %v", uid, keys, wantKeys[uid])
		}
	}
	var ctr []map[string]json.RawMessage
	_ = json.Unmarshal(raw.Pods[1]["containers"], &ctr)
	if keys, want := slices.Sorted(maps.Keys(ctr[0])), []string{"attempt", "exitCode", "finishedAt", "id", "image", "name", "reason", "startedAt", "state"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("exited container keys = %v, want %v", keys, want)
	}
	if keys, want := slices.Sorted(maps.Keys(ctr[1])), []string{"attempt", "id", "image", "name", "startedAt", "state"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("running container keys = %v, want %v", keys, want)
	}
}

func TestPodsEmpty(t *testing.T) {
	g, err := pleg.New(pleg.Options{Runtime: newFakeRuntime()})
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := get(t, New(Config{Generator: g}).Handler(), "/api/v1/pods")
	if strings.TrimSpace(body) != "{\n  \"pods\": []\n}" {
		t.Errorf("body = %q, want an empty pods list and no timestamp", body)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.NodeName.WithLabelValues("node-1").Set(1)
	g := startGenerator(t, samplePods())
	s := New(Config{Generator: g, Gatherer: reg})
	code, body, _ := get(t, s.Handler(), "/metrics")
	if code != 200 || !strings.Contains(body, `kubelet_node_name{node="node-1"} 1`) {
		t.Errorf("GET /metrics = %d:\n%s", code, body)
	}
	if code, _, _ := get(t, New(Config{Generator: g}).Handler(), "/metrics"); code != 404 {
		t.Errorf("GET /metrics without a gatherer = %d, want 404", code)
	}
}

func TestHandleMountsExtraHandlers(t *testing.T) {
	g := startGenerator(t, newFakeRuntime())
	s := New(Config{Generator: g})
	s.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "dashboard") }))
	if code, body, _ := get(t, s.Handler(), "/"); code != 200 || body != "dashboard" {
		t.Errorf("GET / = %d %q", code, body)
	}
	if code, body, _ := get(t, s.Handler(), "/healthz"); code != 200 || body != "ok" {
		t.Errorf("GET /healthz = %d %q", code, body)
	}
	if code, _, _ := get(t, s.Handler(), "/nope"); code != 404 {
		t.Errorf("GET /nope = %d, want 404", code)
	}
}

// sseReader reads Server-Sent Events from a response body.
type sseReader struct {
	t  *testing.T
	br *bufio.Reader
}

type sseMessage struct {
	event, data string
	id          string
	hasID       bool
	comment     bool
}

func (r sseReader) next() sseMessage {
	r.t.Helper()
	var m sseMessage
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			r.t.Fatalf("reading the event stream: %v (partial %+v)", err, m)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if m.event != "" || m.data != "" || m.comment {
				return m
			}
		case strings.HasPrefix(line, ":"):
			m.comment = true
		case strings.HasPrefix(line, "event: "):
			m.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			m.data = strings.TrimPrefix(line, "data: ")
		case line == "id":
			m.hasID = true
		case strings.HasPrefix(line, "id: "):
			m.id, m.hasID = strings.TrimPrefix(line, "id: "), true
		case strings.HasPrefix(line, "retry: "):
		default:
			r.t.Fatalf("unexpected line %q", line)
		}
	}
}

// snapshot reads the snapshot through its end and returns the pods' names
// and the end's message.
func (r sseReader) snapshot() ([]string, sseMessage) {
	r.t.Helper()
	var names []string
	for {
		m := r.nextEvent()
		switch m.event {
		case "snapshot":
			var resp lifecyclev1.WatchResponse
			if err := protojson.Unmarshal([]byte(m.data), &resp); err != nil {
				r.t.Fatalf("snapshot %q: %v", m.data, err)
			}
			if m.hasID {
				r.t.Fatalf("a snapshot message has an id (%q): a reconnection would skip the rest", m.id)
			}
			names = append(names, resp.GetSnapshot().GetName())
		case "snapshot-end":
			return names, m
		default:
			r.t.Fatalf("message %+v during the snapshot", m)
		}
	}
}

// nextEvent skips heartbeats.
func (r sseReader) nextEvent() sseMessage {
	r.t.Helper()
	for {
		if m := r.next(); !m.comment {
			return m
		}
	}
}

func openStream(t *testing.T, ctx context.Context, url string) (*http.Response, sseReader) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /api/v1/events = %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp, sseReader{t, bufio.NewReader(resp.Body)}
}

func TestEventsStream(t *testing.T) {
	rt := samplePods()
	rt.fail = nil
	g := startGenerator(t, rt)
	// The snapshot below must hold both pods, and no event of theirs may
	// follow it.
	waitRelisted(t, g, 2)

	s := New(Config{Generator: g, Heartbeat: 20 * time.Millisecond})
	handlerDone := make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handler().ServeHTTP(w, r)
		if r.URL.Path == "/api/v1/events" {
			handlerDone <- struct{}{}
		}
	}))
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, sse := openStream(t, ctx, ts.URL)

	names, end := sse.snapshot()
	if !reflect.DeepEqual(names, []string{"db", "web"}) || !end.hasID || end.id != g.Journal().Head().String() {
		t.Fatalf("snapshot %v ended at %q, want db and web at %s", names, end.id, g.Journal().Head())
	}

	// A heartbeat while idle.
	if m := sse.next(); !m.comment {
		t.Fatalf("idle stream sent %+v, want a heartbeat comment", m)
	}

	// The running app container exits with code 3.
	rt.set(func(f *fakeRuntime) {
		f.pods[0].Containers[1].State = cruntime.StateExited
		f.exitCodes["c-app-1"] = 3
	})
	m := sse.nextEvent()
	if m.event != "event" || !m.hasID {
		t.Fatalf("message = %+v, want an event with an id", m)
	}
	var resp lifecyclev1.WatchResponse
	if err := protojson.Unmarshal([]byte(m.data), &resp); err != nil {
		t.Fatal(err)
	}
	ev := resp.GetEvent()
	if resp.GetCursor() != m.id || ev.GetPod().GetName() != "web" || len(ev.GetTransitions()) != 1 {
		t.Fatalf("event %v at %q", &resp, m.id)
	}
	if tr := ev.GetTransitions()[0]; tr.GetType() != lifecyclev1.EventType_CONTAINER_DIED || tr.GetContainerId() != "c-app-1" || tr.GetExitCode() != 3 {
		t.Errorf("transition %v, want web's c-app-1 died with exit code 3", tr)
	}
	// The JSON is the proto's standard mapping: lowerCamelCase names,
	// enums by name.
	for _, want := range []string{`"transitions":[`, `"containerId":"c-app-1"`, `"type":"CONTAINER_DIED"`, `"exitCode":3`} {
		if !strings.Contains(strings.ReplaceAll(m.data, " ", ""), want) {
			t.Errorf("event data lacks %s: %s", want, m.data)
		}
	}

	// The client goes away: the handler returns (and closes its watcher).
	cancel()
	select {
	case <-handlerDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the events handler did not return after the client went away")
	}
}

func TestServeShutsDownWithOpenStreams(t *testing.T) {
	g := startGenerator(t, newFakeRuntime())
	// A shutdown that waited for the open stream would wait an hour: the
	// bound below tells it from a prompt one on any machine.
	s := New(Config{Generator: g, ShutdownTimeout: time.Hour})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()

	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("GET /healthz = %q", b)
	}
	sresp, sse := openStream(t, context.Background(), url)
	sse.snapshot()

	// And a connection that has sent nothing yet: net/http's shutdown
	// would wait 5 s for its request.
	conns := s.metrics.connections.WithLabelValues(ListenerAPI)
	before := testutil.ToFloat64(conns)
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	waitFor(t, "the silent connection accepted", func() bool { return testutil.ToFloat64(conns) == before+1 })

	start := time.Now()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return promptly with an event stream open")
	}
	took := time.Since(start)
	t.Logf("shutdown took %v", took)
	if took >= 4*time.Second {
		t.Errorf("shutdown took %v: it waited for the silent connection", took)
	}
	if _, err := io.ReadAll(sresp.Body); err != nil {
		t.Errorf("stream after shutdown: %v", err)
	}
	// The server no longer answers: its listener is closed. (Asked of the
	// listener rather than by a request to its port, which another process
	// may have taken since.)
	tl := ln.(*net.TCPListener)
	_ = tl.SetDeadline(time.Now())
	if c, err := tl.Accept(); !errors.Is(err, net.ErrClosed) {
		if c != nil {
			c.Close()
		}
		t.Errorf("the listener is still open after shutdown: Accept = %v", err)
	}
}

func TestRelists(t *testing.T) {
	g := startGenerator(t, samplePods())
	waitFor(t, "a relist", func() bool { return len(g.RecentRelists()) > 0 })
	code, body, _ := get(t, New(Config{Generator: g}).Handler(), "/api/v1/relists")
	if code != 200 {
		t.Fatalf("code = %d: %s", code, body)
	}
	var got struct {
		ThresholdSeconds float64 `json:"thresholdSeconds"`
		LastRelist       string  `json:"lastRelist"`
		Relists          []struct {
			Start           string  `json:"start"`
			DurationSeconds float64 `json:"durationSeconds"`
			Pods            int     `json:"pods"`
			Inspected       int     `json:"inspected"`
		} `json:"relists"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.ThresholdSeconds != 180 || got.LastRelist == "" || len(got.Relists) == 0 {
		t.Fatalf("%s", body)
	}
	first := got.Relists[0]
	if first.Pods != 2 || first.Inspected != 2 || first.DurationSeconds < 0 {
		t.Fatalf("first relist %+v", first)
	}
	if _, err := time.Parse(time.RFC3339Nano, first.Start); err != nil {
		t.Fatal(err)
	}
}

func TestPodsSlowInspection(t *testing.T) {
	te := &pleg.InspectionTimeoutError{Pod: "ns/db", UID: "u", Operation: "container_status", ID: "c1", Waited: 10 * time.Second}
	pods := PodsFromCache([]podcache.Entry{{Status: &cruntime.PodStatus{UID: "u", Name: "db", Namespace: "ns"}, Err: te}})
	want := &SlowInspection{Call: "ContainerStatus", ID: "c1", WaitedSeconds: 10}
	if len(pods) != 1 || !reflect.DeepEqual(pods[0].SlowInspection, want) || pods[0].Error != te.Error() {
		t.Fatalf("%+v", pods)
	}
}

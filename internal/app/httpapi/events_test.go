package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// journalGen is a generator (not started) whose journal the test feeds by
// hand.
type journalGen struct {
	*pleg.Generator
	j *journal.Journal
}

func (g journalGen) Journal() *journal.Journal { return g.j }

func newJournalServer(t *testing.T, jo journal.Options, cfg Config) (*journal.Journal, string) {
	t.Helper()
	gen, err := pleg.New(pleg.Options{Runtime: newFakeRuntime()})
	if err != nil {
		t.Fatal(err)
	}
	if jo.Epoch == "" {
		jo.Epoch = "e1"
	}
	j := journal.New(jo)
	cfg.Generator = journalGen{Generator: gen, j: j}
	ts := httptest.NewServer(New(cfg).Handler())
	t.Cleanup(ts.Close)
	return j, ts.URL
}

func hostPod(uid, ns string, labels map[string]string) *journal.Pod {
	return &journal.Pod{UID: types.UID(uid), Name: "pod-" + uid, Namespace: ns, Labels: cruntime.NewLabels(labels),
		Containers: []*journal.Container{{ID: uid + "-c", Name: "c", State: cruntime.StateRunning}}}
}

func appendChange(j *journal.Journal, p *journal.Pod, typ string) uint64 {
	return j.Append(journal.Entry{Kind: journal.KindPod, Pod: p, Source: journal.SourceRelist,
		Transitions: []journal.Transition{{Type: typ, ContainerID: string(p.UID) + "-c", ContainerName: "c"}}})
}

// get opens /api/v1/events with query and headers, and returns the
// response and a reader of it.
func openEvents(t *testing.T, base, query string, header http.Header) (*http.Response, sseReader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, sseReader{t, bufio.NewReader(resp.Body)}
}

func decode(t *testing.T, m sseMessage) *lifecyclev1.WatchResponse {
	t.Helper()
	var r lifecyclev1.WatchResponse
	if err := protojson.Unmarshal([]byte(m.data), &r); err != nil {
		t.Fatalf("%s data %q: %v", m.event, m.data, err)
	}
	return &r
}

// Every message but a snapshot's carries its cursor as the SSE id; a
// client resumes from Last-Event-ID (or ?cursor=, the header winning)
// with exactly the events after it; runtime status has its event type.
func TestEventsResumeFromLastEventID(t *testing.T) {
	j, base := newJournalServer(t, journal.Options{}, Config{})
	appendChange(j, hostPod("a", "prod", nil), "ContainerStarted")
	_, sse := openEvents(t, base, "", nil)
	names, end := sse.snapshot()
	if !slices.Equal(names, []string{"pod-a"}) || end.id != "e1-1" {
		t.Fatalf("snapshot %v, end at %q", names, end.id)
	}
	appendChange(j, hostPod("b", "prod", nil), "ContainerStarted")
	j.Append(journal.Entry{Kind: journal.KindRuntime, Runtime: &journal.RuntimeStatus{State: journal.RuntimeEventStreamLost, Message: "EOF"}})
	appendChange(j, hostPod("a", "prod", nil), "ContainerDied")
	var ids []string
	for _, want := range []string{"event", "runtime-status", "event"} {
		m := sse.nextEvent()
		if m.event != want || !m.hasID || decode(t, m).GetCursor() != m.id {
			t.Fatalf("message %+v, want %s with its cursor as id", m, want)
		}
		ids = append(ids, m.id)
	}
	if !slices.Equal(ids, []string{"e1-2", "e1-3", "e1-4"}) {
		t.Fatalf("ids %v", ids)
	}

	for _, c := range []struct {
		name, query string
		header      http.Header
	}{
		{"header", "", http.Header{"Last-Event-ID": {"e1-2"}}},
		{"query", "?cursor=e1-2", nil},
		{"query lastEventId", "?lastEventId=e1-2", nil},
		{"header over query", "?cursor=e1-0", http.Header{"Last-Event-ID": {"e1-2"}}},
	} {
		_, r := openEvents(t, base, c.query, c.header)
		m := r.nextEvent()
		if m.event != "runtime-status" || m.id != "e1-3" || decode(t, m).GetRuntimeStatus().GetState() != lifecyclev1.RuntimeState_RUNTIME_EVENT_STREAM_LOST {
			t.Fatalf("%s: first message %+v, want the runtime status e1-3", c.name, m)
		}
		if m := r.nextEvent(); m.event != "event" || m.id != "e1-4" {
			t.Fatalf("%s: second message %+v, want the event e1-4", c.name, m)
		}
	}
}

// A cursor that cannot be resumed from: one resync-required, with an
// empty id (EventSource then reconnects without a cursor), and the
// stream ends.
func TestEventsResyncRequired(t *testing.T) {
	_, base := newJournalServer(t, journal.Options{}, Config{})
	resp, sse := openEvents(t, base, "", http.Header{"Last-Event-ID": {"other-5"}})
	m := sse.nextEvent()
	if m.event != "resync-required" || !m.hasID || m.id != "" || decode(t, m).GetResyncRequired().GetReason() != journal.ReasonOtherEpoch {
		t.Fatalf("message %+v, want resync-required with an empty id", m)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after resync-required: %q %v, want the end of the stream", rest, err)
	}
}

// Query parameters filter the snapshot and the events as the gRPC Filter
// does; bad ones are 400 naming the parameter.
func TestEventsFilters(t *testing.T) {
	j, base := newJournalServer(t, journal.Options{}, Config{})
	web := map[string]string{"app": "web"}
	appendChange(j, hostPod("a", "prod", web), "ContainerStarted")
	appendChange(j, hostPod("b", "prod", nil), "ContainerStarted")
	appendChange(j, hostPod("c", "dev", web), "ContainerStarted")
	appendChange(j, hostPod("d", "staging", web), "ContainerStarted")

	_, sse := openEvents(t, base, "?namespace=prod,staging&labelSelector=app%3Dweb&type=ContainerDied&type=POD_SYNC", nil)
	if names, _ := sse.snapshot(); !slices.Equal(names, []string{"pod-a", "pod-d"}) {
		t.Fatalf("filtered snapshot %v", names)
	}
	appendChange(j, hostPod("a", "prod", web), "ContainerStarted") // type
	appendChange(j, hostPod("c", "dev", web), "ContainerDied")     // namespace
	appendChange(j, hostPod("b", "prod", nil), "ContainerDied")    // labels
	appendChange(j, hostPod("d", "staging", web), "PodSync")
	if m := sse.nextEvent(); m.event != "event" || decode(t, m).GetEvent().GetPod().GetUid() != "d" {
		t.Fatalf("filtered event %+v", m)
	}
	_, byUID := openEvents(t, base, "?podUID=c", nil)
	if names, _ := byUID.snapshot(); !slices.Equal(names, []string{"pod-c"}) {
		t.Fatalf("podUID=c: %v", names)
	}

	for query, param := range map[string]string{
		"?labelSelector=app+in+(web":  "labelSelector",
		"?namespace=Bad_Namespace":    "namespace",
		"?type=ContainerExploded":     "type",
		"?fields=identity,pid":        "fields",
		"?cursor=nonsense":            "cursor",
		"?podUID=a&labelSelector=%3D": "labelSelector",
	} {
		resp, err := http.Get(base + "/api/v1/events" + query)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), param) {
			t.Errorf("%s: %d %q, want 400 naming %s", query, resp.StatusCode, b, param)
		}
	}
}

// A snapshot far larger than the stream's queue bound goes out whole to a
// client that reads: the reader waits for the queue to drain instead of
// cutting it.
func TestEventsLargeSnapshotToReadingClient(t *testing.T) {
	j, base := newJournalServer(t, journal.Options{}, Config{StreamMaxQueuedBytes: 16 << 10})
	const n = 500
	for i := range n {
		p := hostPod(fmt.Sprintf("p%03d", i), "default", nil)
		p.Annotations = cruntime.LabelsOf("blob", strings.Repeat("x", 512))
		appendChange(j, p, "ContainerStarted")
	}
	_, sse := openEvents(t, base, "", nil)
	names, end := sse.snapshot()
	if len(names) != n || end.id != fmt.Sprintf("e1-%d", n) {
		t.Fatalf("%d pods in the snapshot, end at %q; want %d", len(names), end.id, n)
	}
}

// A bad request's answer echoes the client's value bounded: a 30,000-byte
// cursor (query or Last-Event-ID), label selector, namespace or field
// gets a short 400 that says the value's length.
func TestEventsErrorsEchoValuesBounded(t *testing.T) {
	_, base := newJournalServer(t, journal.Options{}, Config{})
	long := strings.Repeat("x", 30000)
	const maxBody = 1024
	for what, req := range map[string]struct {
		query string
		hdr   http.Header
	}{
		"cursor":         {query: "?cursor=" + long},
		"Last-Event-ID":  {hdr: http.Header{"Last-Event-ID": {long}}},
		"label selector": {query: "?labelSelector=app+in+(" + long},
		"namespace":      {query: "?namespace=" + long},
		"fields":         {query: "?fields=" + long},
	} {
		r, err := http.NewRequest(http.MethodGet, base+"/api/v1/events"+req.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(r.Header, req.hdr)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || len(b) > maxBody || !strings.Contains(string(b), "... (30") {
			t.Errorf("%s: %d, %d bytes %.200q; want a 400 of at most %d bytes saying the value's length", what, resp.StatusCode, len(b), b, maxBody)
		}
	}
}

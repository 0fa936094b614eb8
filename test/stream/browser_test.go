package stream

// A real browser's EventSource on pleg's /api/v1/events: headless Chromium
// (Debian's package, installed through test/apt-install.sh when missing,
// as internal/app/dashboard's browser test does; PLEG_BROWSER_SKIP=1 skips,
// PLEG_CHROMIUM names another binary) opens a page that collects every
// message of the stream. The page and the stream come through a front
// server (a reverse proxy to `pleg run`, as an ingress would be) that drops
// the browser's connections several times while the node changes; the
// browser reconnects by itself with Last-Event-ID, and what it collected
// is compared with the journal's entries as a gRPC watcher received them.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// chromium returns the browser, installing Debian's chromium when it is
// missing.
func chromium(t *testing.T) string {
	t.Helper()
	find := func() string {
		if p := os.Getenv("PLEG_CHROMIUM"); p != "" {
			return p
		}
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	skip := os.Getenv("PLEG_BROWSER_SKIP") == "1"
	if skip {
		fmt.Fprintln(os.Stderr, "SKIP: the EventSource test needs Chromium and PLEG_BROWSER_SKIP=1")
		t.Skip("Chromium is missing and PLEG_BROWSER_SKIP=1")
	}
	browserSetup.Do(func() {
		fmt.Fprintln(os.Stderr, "stream test: Chromium is missing; installing Debian's package chromium")
		browserSetup.err = aptInstall(repoRoot(), "chromium")
	})
	if browserSetup.err != nil {
		t.Fatalf("Chromium is missing and could not be installed (set PLEG_BROWSER_SKIP=1 to skip): %v", browserSetup.err)
	}
	p := find()
	if p == "" {
		t.Fatal("Chromium is still missing after installing Debian's chromium")
	}
	return p
}

var browserSetup struct {
	sync.Once
	err error
}

// eventSourcePage collects every message of /api/v1/events in window.got.
const eventSourcePage = `<!doctype html>
<title>EventSource proof</title>
<script>
window.got = [];
window.opens = 0;
const es = new EventSource('/api/v1/events');
for (const type of ['snapshot', 'snapshot-end', 'event', 'runtime-status', 'bookmark', 'resync-required']) {
  es.addEventListener(type, (e) => window.got.push({type: type, id: e.lastEventId, data: e.data}));
}
es.onopen = () => { window.opens++; };
</script>`

// front is the server the browser talks to: the page, and /api/v1/events
// proxied to pleg. It records each stream request's Last-Event-ID.
type front struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []string // Last-Event-ID of each /api/v1/events request
}

func startFront(t *testing.T, pleg string) *front {
	t.Helper()
	target, err := url.Parse(pleg)
	must(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // stream as it comes
	f := &front{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, eventSourcePage)
	})
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Header.Get("Last-Event-ID"))
		f.mu.Unlock()
		proxy.ServeHTTP(w, r)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	return f
}

func (f *front) lastEventIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// pageMsg is one message the page collected.
type pageMsg struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Data string `json:"data"`
}

// TestEventSourceReconnects: the browser's EventSource gets the snapshot
// and the events; its connection is dropped three times, each right after
// a change; it reconnects with Last-Event-ID (the id of the last message
// it got) and in the end has every journal entry after its snapshot once,
// in order, identical to a gRPC watcher's, and pods equal to
// /api/v1/pods.
func TestEventSourceReconnects(t *testing.T) {
	browser := chromium(t)
	r := startSim(t, sim.Config{Seed: 61, Pods: 6, ContainersPerPod: 2, ChurnPerStep: 2})
	p := startPleg(t, r.Endpoint(), "")
	settle(t, r, p)
	gw := startGoWatch(t, p.socket, "")
	f := startFront(t, p.base)

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()))
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void]("1")); err != nil {
		t.Fatalf("starting Chromium (%s): %v", browser, err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(f.srv.URL+"/")); err != nil {
		t.Fatalf("Chromium (%s) opening the page: %v", browser, err)
	}
	collected := func() []pageMsg {
		t.Helper()
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got, err := chromedp.Run(ectx, chromedp.Evaluate[[]pageMsg](`window.got`))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		return got
	}
	opens := func() int {
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := chromedp.Run(ectx, chromedp.Evaluate[int](`window.opens`))
		must(t, err)
		return n
	}
	hasID := func(id string) bool {
		for _, m := range collected() {
			if m.ID == id {
				return true
			}
		}
		return false
	}
	poll(t, "the page gets the snapshot's end", func() bool {
		for _, m := range collected() {
			if m.Type == "snapshot-end" {
				return true
			}
		}
		return false
	})

	const cuts = 3
	for i := 1; i <= cuts; i++ {
		churn(t, r, p, i)
		// A change pleg is about to show, and the connection dropped
		// while its event may be on the way.
		r.Step()
		f.srv.CloseClientConnections()
		settle(t, r, p)
		poll(t, fmt.Sprintf("EventSource reconnection %d", i), func() bool { return opens() == i+1 })
	}
	head := headCursor(t, p.socket)
	poll(t, "the page reaches the journal's head "+head, func() bool { return hasID(head) })

	got := collected()
	var snapshotEnd string
	var events []*lifecyclev1.WatchResponse
	view := map[string]podView{}
	for _, m := range got {
		var wr lifecyclev1.WatchResponse
		if err := protojson.Unmarshal([]byte(m.Data), &wr); err != nil {
			t.Fatalf("the page's %s message is not a WatchResponse: %v: %s", m.Type, err, m.Data)
		}
		switch m.Type {
		case "snapshot":
			if snapshotEnd != "" {
				t.Fatalf("a snapshot after the first one's end: the browser did not resume (Last-Event-IDs %q)", f.lastEventIDs())
			}
			view[wr.GetSnapshot().GetUid()] = viewOfPod(wr.GetSnapshot())
		case "snapshot-end":
			snapshotEnd = m.ID
		case "event", "runtime-status":
			if m.ID != wr.GetCursor() {
				t.Fatalf("SSE id %q, cursor %q", m.ID, wr.GetCursor())
			}
			events = append(events, &wr)
			if ev := wr.GetEvent(); ev != nil {
				if ev.GetPod().GetGone() {
					delete(view, ev.GetPod().GetUid())
				} else {
					view[ev.GetPod().GetUid()] = viewOfPod(ev.GetPod())
				}
			}
		case "resync-required":
			t.Fatalf("resync-required: %s", m.Data)
		}
	}
	next := seqOf(t, snapshotEnd) + 1
	for _, ev := range events {
		if s := seqOf(t, ev.GetCursor()); s != next {
			t.Fatalf("the page has sequence %d where %d was next (a gap or a duplicate across the reconnections; Last-Event-IDs %q)", s, next, f.lastEventIDs())
		}
		next++
	}
	// Every reconnection carried the id of a message the page had.
	ids := f.lastEventIDs()
	if len(ids) != cuts+1 || ids[0] != "" {
		t.Fatalf("stream requests with Last-Event-ID %q, want none on the first and one on each of %d reconnections", ids, cuts)
	}
	for _, id := range ids[1:] {
		if id == "" || !hasID(id) {
			t.Errorf("a reconnection's Last-Event-ID %q is not the id of a message the page got", id)
		}
	}
	// The same entries as the gRPC watcher, and the same pods as the pod API.
	var ref []*lifecyclev1.WatchResponse
	poll(t, "the gRPC watcher reaches the head", func() bool {
		msgs, err := gw.snapshot()
		must(t, err)
		ref = ref[:0]
		for _, m := range msgs {
			if (m.GetEvent() != nil || m.GetRuntimeStatus() != nil) && seqOf(t, m.GetCursor()) > seqOf(t, snapshotEnd) {
				ref = append(ref, m)
			}
		}
		return len(ref) > 0 && ref[len(ref)-1].GetCursor() == head
	})
	if len(ref) != len(events) {
		t.Fatalf("the browser got %d entries after its snapshot, the gRPC watcher %d", len(events), len(ref))
	}
	for i := range events {
		if goEntryView(events[i]) != goEntryView(ref[i]) {
			t.Fatalf("entry %s differs:\nbrowser %s\ngRPC    %s", events[i].GetCursor(), goEntryView(events[i]), goEntryView(ref[i]))
		}
	}
	if pods := cachePods(t, p.base); !equalViews(view, pods) {
		t.Errorf("the browser's pods differ from /api/v1/pods:\nbrowser %v\npods %v", view, pods)
	}
	t.Logf("EventSource: %d entries after the snapshot, %d reconnections with Last-Event-ID %q", len(events), cuts, ids[1:])
}

func equalViews(a, b map[string]podView) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !podViewEqual(v, w) {
			return false
		}
	}
	return true
}

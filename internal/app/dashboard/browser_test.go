package dashboard

// The dashboard in a real headless Chromium, driven over the Chrome DevTools
// Protocol, against a real generator relisting the simulated runtime
// through the daemon's HTTP API.
//
// Chromium comes from Debian's package: when it is missing and the test
// runs as root, the test installs it through test/apt-install.sh (which
// serializes with the other suites' installs) and says so. When it cannot be had, the test fails,
// unless PLEG_BROWSER_SKIP=1, which skips it. PLEG_CHROMIUM names another
// browser binary; PLEG_DASHBOARD_SCREENSHOT names a PNG file to write the
// final page to.

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/metrics"
)

// findBrowser returns the Chromium binary, or "".
func findBrowser() string {
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

var installOnce struct {
	sync.Once
	err error
	out string
}

// ensureBrowser returns Chromium, installing Debian's package when it is
// missing and we may.
func ensureBrowser(t *testing.T) string {
	t.Helper()
	if p := findBrowser(); p != "" {
		return p
	}
	skip := os.Getenv("PLEG_BROWSER_SKIP") == "1"
	cannot := func(why string) {
		t.Helper()
		msg := "the dashboard browser test needs Chromium, which is not installed and " + why +
			"; install Debian's package chromium (apt-get install -y chromium), or set PLEG_BROWSER_SKIP=1 to skip this test"
		if skip {
			fmt.Fprintln(os.Stderr, "SKIP:", msg)
			t.Skip(msg)
		}
		t.Fatal(msg)
	}
	installOnce.Do(func() {
		// test/apt-install.sh is the one way the suites install system
		// packages: it waits for any other suite's install (go test runs
		// test binaries in parallel) and for apt's own locks.
		fmt.Fprintln(os.Stderr, "dashboard test: Chromium is missing; installing Debian's package chromium")
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		defer cancel()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "..", "..", "test", "apt-install.sh"), "chromium")
		cmd.Stdout, cmd.Stderr = &out, &out
		installOnce.err = cmd.Run()
		installOnce.out = out.String()
		if installOnce.err == nil {
			fmt.Fprintln(os.Stderr, "dashboard test: installed", findBrowser())
		}
	})
	if installOnce.err != nil {
		tail := installOnce.out
		if len(tail) > 3000 {
			tail = tail[len(tail)-3000:]
		}
		t.Logf("test/apt-install.sh output (end):\n%s", tail)
		cannot(fmt.Sprintf("could not be installed (%v)", installOnce.err))
	}
	p := findBrowser()
	if p == "" {
		cannot("is still missing after apt-get install chromium")
	}
	return p
}

// testDaemon is what `pleg run` wires, in-process: the simulated runtime,
// the CRI client, a generator, the Ready condition, the HTTP API and the
// dashboard on "/".
type testDaemon struct {
	sim *sim.Runtime
	gen *pleg.Generator
	url string
}

func startTestDaemon(t *testing.T) *testDaemon {
	t.Helper()
	s := sim.New(sim.Config{Seed: 21, Pods: 4, ContainersPerPod: 2})
	dir, err := os.MkdirTemp("", "pleg-dash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := s.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	client, err := cri.Dial(s.Endpoint(), cri.WithTimeout(5*time.Second), cri.WithLogger(logr.Discard()))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.NodeName.WithLabelValues("node-browser").Set(1)
	g, err := pleg.New(pleg.Options{Runtime: client, Metrics: m, RelistPeriod: 100 * time.Millisecond,
		RelistThreshold: 2 * time.Second, PodInspectionTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ready := pleg.NewReadiness(g, pleg.ReadinessOptions{Runtime: client, Interval: 200 * time.Millisecond, Timeout: 2 * time.Second})
	srv := httpapi.New(httpapi.Config{Generator: g, Readiness: ready, Gatherer: reg, Heartbeat: time.Second})
	srv.Handle("/", Handler())
	ts := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ready.Run(ctx) }()
	g.Start()
	t.Cleanup(func() {
		srv.Close() // ends the event streams, so that ts.Close does not wait for them
		ts.Close()
		cancel()
		<-done
		g.Stop()
		_ = client.Close()
	})
	return &testDaemon{sim: s, gen: g, url: ts.URL + "/"}
}

// page is a browser tab on the dashboard.
type page struct {
	t   *testing.T
	ctx context.Context

	mu         sync.Mutex
	exceptions []string
}

func openPage(t *testing.T, browser, url string) *page {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browser),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1100),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	p := &page{t: t, ctx: ctx}
	// Start the browser and collect the page's uncaught exceptions.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void]("1")); err != nil {
		t.Fatalf("starting Chromium (%s): %v", browser, err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() {
				p.mu.Lock()
				p.exceptions = append(p.exceptions, m.String())
				p.mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("opening %s: %v", url, err)
	}
	return p
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](p *page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitFor waits until the JavaScript expression is true.
func (p *page) waitFor(what, expr string) {
	p.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := eval[bool](p, expr)
		if err == nil && ok {
			return
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	text, _ := eval[string](p, "document.body.innerText")
	p.t.Fatalf("the page did not show %s within 15s (last error: %v); expression: %s\npage text:\n%s", what, lastErr, expr, text)
}

func (p *page) text(id string) string {
	p.t.Helper()
	s, err := eval[string](p, fmt.Sprintf("document.getElementById(%q).textContent", id))
	if err != nil {
		p.t.Fatalf("reading #%s: %v", id, err)
	}
	return s
}

func (p *page) screenshot(path string) {
	b, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Logf("screenshot: %v", err)
		return
	}
	p.t.Logf("screenshot of the dashboard: %s", path)
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

func TestDashboardInBrowser(t *testing.T) {
	browser := ensureBrowser(t)
	start := time.Now()
	d := startTestDaemon(t)
	p := openPage(t, browser, d.url)
	defer func() {
		if path := os.Getenv("PLEG_DASHBOARD_SCREENSHOT"); path != "" {
			p.screenshot(path)
		} else if t.Failed() {
			p.screenshot(filepath.Join(t.TempDir(), "dashboard.png"))
		}
	}()

	if title, err := eval[string](p, "document.title"); err != nil || title != "PLEG dashboard" {
		t.Fatalf("title %q, %v", title, err)
	}

	// The health banner: the exact messages of /readyz and /healthz.
	p.waitFor("the healthy banner", `document.getElementById('health-state').textContent === 'Healthy' &&
		document.getElementById('health-message').textContent === 'kubelet is posting ready status'`)
	if got := p.text("health-healthz"); got != "healthz: ok" {
		t.Errorf("healthz line = %q", got)
	}
	if got := p.text("health-reason"); got != "KubeletReady" {
		t.Errorf("reason = %q", got)
	}
	p.waitFor("the node name from /metrics", `document.getElementById('node').textContent === 'on node-browser'`)

	// Every simulated pod in the table.
	var want []string
	for _, pod := range d.sim.Pods() {
		want = append(want, pod.Namespace+"/"+pod.Name)
	}
	slices.Sort(want)
	p.waitFor("every pod in the table", fmt.Sprintf(`(() => {
		const got = [...document.querySelectorAll('#pods tr')].map((r) => r.dataset.pod).sort();
		return JSON.stringify(got) === %s;
	})()`, jsString(mustJSON(want))))
	p.waitFor("running containers", `document.querySelectorAll('#pods .chip[data-state="running"]').length === 8`)

	// The relist chart against the threshold.
	p.waitFor("relists in the chart", `Number(document.getElementById('chart').dataset.bars) >= 3`)
	if got, err := eval[string](p, `document.querySelector('#chart .threshold-label').textContent`); err != nil || got != "threshold 2s" {
		t.Errorf("threshold label %q, %v", got, err)
	}
	p.waitFor("the time since the last relist", `/ of 2s$/.test(document.getElementById('since-text').textContent)`)
	p.waitFor("the event feed connected", `document.getElementById('feed-state').textContent === 'live'`)

	// A new pod: its start in the feed and its row in the table.
	added, err := d.sim.AddPod(sim.PodSpec{Name: "browser-added", Namespace: "e2e", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	p.waitFor("the new pod's ContainerStarted in the feed",
		`!!document.querySelector('#events li[data-type="ContainerStarted"][data-pod="e2e/browser-added"]')`)
	p.waitFor("the new pod in the table", `(() => {
		const row = document.querySelector('#pods tr[data-pod="e2e/browser-added"]');
		return !!row && row.textContent.includes('app running');
	})()`)

	// Its container exits: ContainerDied with the exit code, and the state.
	app, _ := added.Container("app")
	if err := d.sim.ExitContainer(app.ID, 3); err != nil {
		t.Fatal(err)
	}
	p.waitFor("ContainerDied with its exit code in the feed", `(() => {
		const li = document.querySelector('#events li[data-type="ContainerDied"][data-pod="e2e/browser-added"]');
		return !!li && li.textContent.includes('exit code 3') && li.textContent.includes('app');
	})()`)
	p.waitFor("the exited container in the table", `(() => {
		const row = document.querySelector('#pods tr[data-pod="e2e/browser-added"]');
		return !!row && row.textContent.includes('app exited (3)');
	})()`)

	// A pod whose status calls hang: a slow pod, named with its call.
	victim := d.sim.Pods()[1]
	ref := victim.Namespace + "/" + victim.Name
	d.sim.SetHung(victim.UID, true)
	if err := d.sim.ExitContainer(victim.Containers[0].ID, 1); err != nil {
		t.Fatal(err)
	}
	// The call it is stuck in, with the ID of the pod's sandbox or
	// container it is about (the client may fetch them in parallel).
	ids := []string{victim.SandboxID()[:13]}
	for _, id := range victim.ContainerIDs() {
		ids = append(ids, id[:13])
	}
	p.waitFor("the hung pod among the slow pods", fmt.Sprintf(`(() => {
		const row = document.querySelector('#slow tr[data-pod=%s]');
		if (!row) return false;
		const call = row.children[1].textContent;
		return /^(PodSandboxStatus|ContainerStatus) "[0-9a-f]{13}…"$/.test(call) &&
			%s.some((id) => call.includes(id));
	})()`, jsString(ref), mustJSON(ids)))
	if got := p.text("stat-slow"); got != "1" {
		t.Errorf("slow pods tile = %q", got)
	}
	p.waitFor("the pod's error in the table", fmt.Sprintf(`(() => {
		const row = document.querySelector('#pods tr[data-pod=%s]');
		return !!row && row.classList.contains('problem') && row.textContent.includes('inspection of pod');
	})()`, jsString(ref)))
	p.waitFor("the inspection timeouts counter", `Number(document.getElementById('stat-timeouts').textContent) >= 1`)
	d.sim.SetHung(victim.UID, false)
	p.waitFor("the slow pod recovered", `document.querySelectorAll('#slow tr').length === 0 &&
		!document.getElementById('slow-empty').classList.contains('hidden')`)
	p.waitFor("the recovered pod's ContainerDied", fmt.Sprintf(
		`!!document.querySelector('#events li[data-type="ContainerDied"][data-pod=%s]')`, jsString(ref)))

	// The runtime goes away: relists fail and PLEG turns unhealthy, with the
	// kubelet's message; then it comes back.
	d.sim.GoAway()
	p.waitFor("the unhealthy banner", `(() => {
		const msg = document.getElementById('health-message').textContent;
		return document.getElementById('health-state').textContent === 'Not healthy' &&
			/^PLEG is not healthy: pleg was last seen active [0-9.]+m?s ago; threshold is 2s$/.test(msg) &&
			document.getElementById('health-reason').textContent === 'KubeletNotReady' &&
			document.getElementById('health-healthz').textContent.startsWith('healthz: PLEG is not healthy: pleg was last seen active');
	})()`)
	p.waitFor("failed relists in the chart", `document.querySelectorAll('#chart rect.failed').length > 0`)
	if err := d.sim.ComeBack(); err != nil {
		t.Fatal(err)
	}
	p.waitFor("the healthy banner again", `document.getElementById('health-state').textContent === 'Healthy'`)

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.exceptions {
		t.Errorf("the page threw: %s", e)
	}
	t.Logf("browser test took %v", time.Since(start).Round(time.Millisecond))
}

func mustJSON(v []string) string {
	var b strings.Builder
	b.WriteString("[")
	for i, s := range v {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q", s)
	}
	b.WriteString("]")
	return b.String()
}

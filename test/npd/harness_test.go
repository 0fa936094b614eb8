package npd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/podlifecycle/pleg/internal/dockerfile"
	"github.com/podlifecycle/pleg/internal/testport"
)

// patience bounds every wait for something NPD or pleg must do. Its
// checks run every second here; a condition change takes a few seconds
// (pleg's threshold, then NPD's next check), so this is a wide bound.
const patience = 60 * time.Second

// The suite's setup, done once by TestMain.
var suite struct {
	npd  string // node-problem-detector binary
	pleg string // pleg binary, built for this run
	err  error  // why the setup failed (every test fails with it)
	skip bool   // PLEG_NPD_SKIP=1
}

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	if os.Getenv("PLEG_NPD_SKIP") == "1" {
		fmt.Fprintln(os.Stderr, "npd: skipped because PLEG_NPD_SKIP=1")
		suite.skip = true
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "pleg-npd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	suite.err = setup(dir)
	if suite.err != nil {
		fmt.Fprintln(os.Stderr, "npd: setup FAILED:", suite.err)
	}
	return m.Run()
}

// setup provisions node-problem-detector (provision.sh: cached under
// <repo>/.cache/npd, built when missing) and builds pleg into dir.
func setup(dir string) error {
	root := repoRoot()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	start := time.Now()
	var out bytes.Buffer
	prov := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "npd", "provision.sh"))
	prov.Stdout, prov.Stderr = &out, &out
	prov.WaitDelay = 10 * time.Second
	if err := prov.Run(); err != nil {
		return fmt.Errorf("test/npd/provision.sh: %w\n%s", err, tail(out.String(), 4000))
	}
	fmt.Fprintf(os.Stderr, "npd: provisioned in %v: %s", time.Since(start).Round(100*time.Millisecond), tail(out.String(), 500))
	cache := os.Getenv("PLEG_NPD_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache", "npd")
	}
	suite.npd = filepath.Join(cache, "bin", "node-problem-detector")

	start = time.Now()
	suite.pleg = filepath.Join(dir, "pleg")
	if err := dockerfile.Build(ctx, root, suite.pleg); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "npd: built pleg in %v\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// needSuite fails the test when the setup failed, and skips it (saying
// so) under PLEG_NPD_SKIP=1.
func needSuite(t *testing.T) {
	t.Helper()
	if suite.skip {
		t.Skip("PLEG_NPD_SKIP=1")
	}
	if suite.err != nil {
		t.Fatalf("the suite's setup failed: %v", suite.err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// shortDir is a temporary directory with a short path (unix socket paths
// are limited to 108 bytes; t.TempDir() can be longer).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pleg-npd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitFor polls cond until it returns nil, failing the test with its
// last error after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- processes -------------------------------------------------------------

// lineLog keeps what a process writes, line by line.
type lineLog struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

func (l *lineLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *lineLog) String() string { return strings.Join(l.snapshot(), "\n") }

// proc is a process the test started; its cleanup stops it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *lineLog
	done chan struct{} // closed when it has exited
	err  error         // its exit, once done is closed
}

// start runs bin with args in a process group of its own, its output in
// p.log. The test's cleanup stops it (SIGCONT first, in case the test
// stopped it) and prints its log when the test failed.
func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: &lineLog{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { // owned by p: ends when the process exits
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, tail(p.log.String(), 20000))
		}
	})
	return p
}

// signal sends sig to the process's group.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill -%v %s: %v", sig, p.name, err)
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s. It returns
// once the process has exited.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	p.signal(t, syscall.SIGCONT)
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not exit within 10 s of SIGTERM; killing it", p.name)
		p.signal(t, syscall.SIGKILL)
		<-p.done
	}
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ---- pleg ------------------------------------------------------------------

// plegNode is a `pleg run` relisting a `pleg simulate` process, both real
// processes, with timings in seconds instead of the kubelet's minutes.
type plegNode struct {
	sim  *proc
	run  *proc
	addr string // pleg run's --listen-address
}

func startPleg(t *testing.T) *plegNode {
	t.Helper()
	dir := shortDir(t)
	sock := "unix://" + filepath.Join(dir, "sim.sock")
	n := &plegNode{addr: testport.Addr(t)}
	n.sim = start(t, "pleg simulate", suite.pleg, "simulate", "--listen", sock,
		"--pods", "3", "--containers-per-pod", "2", "--churn", "0")
	waitFor(t, patience, "pleg simulate's socket", func() error {
		_, err := os.Stat(filepath.Join(dir, "sim.sock"))
		return err
	})
	n.run = start(t, "pleg run", suite.pleg, "run", "-r", sock,
		"--listen-address", n.addr, "--lifecycle-socket", "",
		"--relist-period", "200ms", "--relist-threshold", "3s",
		"--runtime-request-timeout", "1s", "--pod-inspection-timeout", "1s")
	waitFor(t, patience, "pleg run ready on /readyz", func() error {
		if n.run.exited() {
			t.Fatalf("pleg run exited: %v", n.run.err)
		}
		resp, err := http.Get("http://" + n.addr + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
		}
		return nil
	})
	return n
}

// ---- node-problem-detector -------------------------------------------------

// shippedConfig is deploy/npd/pleg-plugin-monitor.json, parsed.
func shippedConfig(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "npd", "pleg-plugin-monitor.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("deploy/npd/pleg-plugin-monitor.json: %v", err)
	}
	return c
}

// rules returns the shipped config's rules: pleg's own condition's
// (PLEGUnhealthy, pleg check) and the forecast's (KubeletPLEGAtRisk, pleg
// check --forecast).
func rules(t *testing.T, c map[string]any) map[string]map[string]any {
	t.Helper()
	rs, _ := c["rules"].([]any)
	out := map[string]map[string]any{}
	for _, r := range rs {
		rule, _ := r.(map[string]any)
		cond, _ := rule["condition"].(string)
		out[cond] = rule
	}
	if len(out) != 2 || out["PLEGUnhealthy"] == nil || out["KubeletPLEGAtRisk"] == nil {
		t.Fatalf("deploy/npd/pleg-plugin-monitor.json: rules for %v, want one for PLEGUnhealthy and one for KubeletPLEGAtRisk", out)
	}
	return out
}

// ruleArgs returns the shipped config's rule for pleg's own condition and
// its args.
func ruleArgs(t *testing.T, c map[string]any) (map[string]any, []any) {
	t.Helper()
	rule := rules(t, c)["PLEGUnhealthy"]
	args, _ := rule["args"].([]any)
	return rule, args
}

// testConfig writes the shipped plugin config with only what a test must
// change: the pleg binary each rule runs (the argument before "check"),
// the port of its --url (pleg run's) and a 1 s invoke_interval instead of
// 30 s. Everything else (the rules' shell wrapper, conditions, reasons,
// timeouts, pleg check's flags) runs as shipped.
func testConfig(t *testing.T, dir, plegBin, plegAddr string) string {
	t.Helper()
	c := shippedConfig(t)
	pc, _ := c["pluginConfig"].(map[string]any)
	if pc == nil {
		t.Fatal("deploy/npd/pleg-plugin-monitor.json: no pluginConfig")
	}
	pc["invoke_interval"] = "1s"
	for cond, rule := range rules(t, c) {
		args, _ := rule["args"].([]any)
		check := -1
		for i, a := range args {
			if a == "check" {
				check = i
			}
		}
		if check < 1 {
			t.Fatalf("deploy/npd/pleg-plugin-monitor.json: the %s rule's args %v do not run <pleg> check", cond, args)
		}
		args[check-1] = plegBin
		urls := 0
		for i, a := range args {
			s, _ := a.(string)
			if v, ok := strings.CutPrefix(s, "--url="); ok {
				u, err := url.Parse(v)
				if err != nil {
					t.Fatalf("the %s rule's %s: %v", cond, s, err)
				}
				u.Host = plegAddr
				args[i] = "--url=" + u.String()
				urls++
			}
		}
		if urls != 1 {
			t.Fatalf("the %s rule's args %v: %d --url flags, want 1", cond, args, urls)
		}
	}
	path := filepath.Join(dir, "pleg-plugin-monitor.json")
	writeJSON(t, path, c)
	return path
}

// npd is a running node-problem-detector, standalone: no API server,
// the custom plugin monitor with the given config, its Prometheus
// exporter on a loopback port.
type npd struct {
	*proc
	prom string
}

func startNPD(t *testing.T, config string) *npd {
	t.Helper()
	n := &npd{prom: testport.Addr(t)}
	host, port, _ := net.SplitHostPort(n.prom)
	n.proc = start(t, "node-problem-detector", suite.npd,
		"--enable-k8s-exporter=false",
		"--config.custom-plugin-monitor="+config,
		"--prometheus-address="+host, "--prometheus-port="+port,
		"--port=0", // its own HTTP server (/conditions) serves only with the k8s exporter
		"--hostname-override=npd-test-node",
		"--v=3", // each check's result ("Add check result")
	)
	return n
}

// problemMetrics are NPD's problem_gauge and problem_counter series.
type problemMetrics struct {
	gauge   map[string]float64 // problem_gauge{type="PLEGUnhealthy"} by reason
	counter map[string]float64 // problem_counter by reason
}

func (m problemMetrics) String() string {
	return fmt.Sprintf("problem_gauge{type=PLEGUnhealthy} %v, problem_counter %v", m.gauge, m.counter)
}

// metrics scrapes NPD's /metrics.
func (n *npd) metrics() (problemMetrics, error) {
	m := problemMetrics{gauge: map[string]float64{}, counter: map[string]float64{}}
	resp, err := http.Get("http://" + n.prom + "/metrics")
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return m, err
	}
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return m, fmt.Errorf("/metrics: %w", err)
	}
	labels := func(s *dto.Metric) map[string]string {
		l := map[string]string{}
		for _, lp := range s.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		return l
	}
	gauge, counter := mfs["problem_gauge"], mfs["problem_counter"]
	if gauge == nil || counter == nil {
		return m, errors.New("/metrics has no problem_gauge or problem_counter yet")
	}
	for _, s := range gauge.GetMetric() {
		if l := labels(s); l["type"] == "PLEGUnhealthy" {
			m.gauge[l["reason"]] = s.GetGauge().GetValue()
		}
	}
	for _, s := range counter.GetMetric() {
		m.counter[labels(s)["reason"]] = s.GetCounter().GetValue()
	}
	return m, nil
}

// condition is NPD's PLEGUnhealthy condition as it logs it.
type condition struct {
	Status, Reason, Message string
}

// NPD logs its conditions with %+v: when it starts ("Initialized
// conditions for <config>: [...]") and whenever one changes ("New status
// generated: &{... Conditions:[...]}"). The condition is the last field
// of its struct, its message last; a message may hold anything but the
// closing "}]".
var (
	condRE   = regexp.MustCompile(`\{Type:PLEGUnhealthy Status:(\w+) Transition:.*? Reason:(\w*) Message:(.*?)\}\]`)
	resultRE = regexp.MustCompile(`Add check result \{Rule:\S+ ExitStatus:(\d+) Message:(.*)\} for rule`)
)

// forecastRE matches the forecast's condition, KubeletPLEGAtRisk, which
// NPD logs before PLEGUnhealthy.
var forecastRE = regexp.MustCompile(`\{Type:KubeletPLEGAtRisk Status:(\w+) Transition:.*? Reason:(\w*) Message:(.*?)\} \{Type:PLEGUnhealthy `)

// forecastCondition returns NPD's current KubeletPLEGAtRisk condition (the
// last it logged).
func (n *npd) forecastCondition() condition {
	var c condition
	for _, l := range n.log.snapshot() {
		if !strings.Contains(l, "Initialized conditions for") && !strings.Contains(l, "New status generated:") {
			continue
		}
		if m := forecastRE.FindStringSubmatch(l); m != nil {
			c = condition{Status: m[1], Reason: m[2], Message: m[3]}
		}
	}
	return c
}

// condition returns NPD's current PLEGUnhealthy condition (the last it
// logged) and how many times it logged one.
func (n *npd) condition() (condition, int) {
	var c condition
	seen := 0
	for _, l := range n.log.snapshot() {
		if !strings.Contains(l, "Initialized conditions for") && !strings.Contains(l, "New status generated:") {
			continue
		}
		if m := condRE.FindStringSubmatch(l); m != nil {
			c = condition{Status: m[1], Reason: m[2], Message: m[3]}
			seen++
		}
	}
	return c, seen
}

// checkResult is one result of the rule as NPD logged it.
type checkResult struct {
	Exit    string
	Message string
}

// results returns every result of the rule NPD logged.
func (n *npd) results() []checkResult {
	var out []checkResult
	for _, l := range n.log.snapshot() {
		if m := resultRE.FindStringSubmatch(l); m != nil {
			out = append(out, checkResult{Exit: m[1], Message: m[2]})
		}
	}
	return out
}

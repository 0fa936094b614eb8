package deploy

// The Prometheus rules against the real Prometheus, Debian's package
// (2.42): promtool checks them and runs their unit tests
// (prometheus/pleg-rules.test.yaml: each alert fires on series that should
// fire it and stays silent on a healthy node), and a real Prometheus
// scrapes a real generator, relisting the simulated runtime, through the
// daemon's HTTP server and evaluates the recording rules against it, then
// sees pleg's target down when its server stops (PlegDown pending).
//
// When promtool or prometheus is missing and the test runs as root, it is
// installed through test/apt-install.sh; when it cannot be, the tests fail,
// unless PLEG_PROMETHEUS_SKIP=1, which skips them (and which .ci/run
// refuses).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/testport"
	"github.com/podlifecycle/pleg/metrics"
)

var promInstall struct {
	sync.Once
	err error
	out string
}

// promBinary returns the path of promtool or prometheus, installing
// Debian's prometheus package when it is missing.
func promBinary(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if os.Getenv("PLEG_PROMETHEUS_SKIP") == "1" {
		fmt.Fprintln(os.Stderr, "SKIP:", name, "is missing and PLEG_PROMETHEUS_SKIP=1")
		t.Skipf("%s is missing and PLEG_PROMETHEUS_SKIP=1", name)
	}
	promInstall.Do(func() {
		fmt.Fprintln(os.Stderr, "deploy test: prometheus is missing; installing Debian's package prometheus")
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		defer cancel()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "test", "apt-install.sh"), "prometheus")
		cmd.Stdout, cmd.Stderr = &out, &out
		promInstall.err = cmd.Run()
		promInstall.out = out.String()
	})
	if promInstall.err != nil {
		tail := promInstall.out
		if len(tail) > 3000 {
			tail = tail[len(tail)-3000:]
		}
		t.Fatalf("%s is missing and installing Debian's package prometheus failed (%v); set PLEG_PROMETHEUS_SKIP=1 to skip:\n%s",
			name, promInstall.err, tail)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s still missing after installing prometheus: %v", name, err)
	}
	return p
}

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promBinary(t, "promtool"), args...)
	cmd.Dir = "prometheus"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	out := promtool(t, "check", "rules", "pleg-rules.yaml")
	if !strings.Contains(out, "SUCCESS: 10 rules found") {
		t.Errorf("promtool check rules:\n%s", out)
	}
}

func TestPromtoolAlertUnitTests(t *testing.T) {
	out := promtool(t, "test", "rules", "pleg-rules.test.yaml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
	// Every alert of the rules has a test that fires it.
	tests, err := os.ReadFile("prometheus/pleg-rules.test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range []string{"KubeletPlegDurationHigh", "PlegRelistStalled", "PlegUnhealthy", "PlegPodInspectionTimeouts", "PlegDown", "PlegAbsent"} {
		if !strings.Contains(string(tests), "alertname: "+alert) {
			t.Errorf("no unit test for the alert %s", alert)
		}
	}
}

// A real Prometheus scrapes pleg's /metrics (as --metrics-address serves
// it) and evaluates the recording rules against it: the relist quantiles
// of the node appear, and no rule reports an evaluation error.
func TestPrometheusEvaluatesRulesAgainstPleg(t *testing.T) {
	bin := promBinary(t, "prometheus")

	// pleg: a generator relisting the simulated runtime, served as the
	// daemon serves it.
	s := sim.New(sim.Config{Seed: 3, Pods: 5, ContainersPerPod: 2})
	dir, err := os.MkdirTemp("", "pleg-prom-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := s.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.NodeName.WithLabelValues("node-prom").Set(1)
	client, err := cri.Dial(s.Endpoint(), cri.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pleg.New(pleg.Options{Runtime: client, Metrics: m, RelistPeriod: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g.Start()
	srv := httpapi.New(httpapi.Config{Generator: g, Gatherer: reg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.ServePublic(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
		g.Stop()
		_ = client.Close()
	})

	// Prometheus, scraping it every second under the job name the rules
	// select, evaluating the rules every second.
	rules, err := filepath.Abs("prometheus/pleg-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: pleg
    static_configs:
      - targets: ["%s"]
`, rules, ln.Addr())
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	web := testport.Addr(t)
	var logs bytes.Buffer
	pctx, pcancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(pctx, bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+web, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pcancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})

	query := func(q string) []any {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var r struct {
			Data struct{ Result []any }
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &r)
		return r.Data.Result
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := query(`node_quantile:kubelet_pleg_relist_duration_seconds:histogram_quantile{job="pleg", node="node-prom", quantile="0.99"}`)
		if len(r) == 1 {
			t.Logf("recorded: %v", r[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the recording rule produced no p99 for node-prom within 90 s (targets up: %v)", query(`up{job="pleg"}`))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if r := query(`up{job="pleg"} == 1`); len(r) != 1 {
		t.Errorf("pleg's target is not up: %v", r)
	}
	// No rule failed to evaluate against the real series.
	resp, err := http.Get("http://" + web + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rr struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				}
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&rr); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rr.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("rule %s fails against pleg's series: %s", r.Name, r.LastError)
			}
		}
	}
	if n != 10 {
		t.Errorf("%d rules loaded, want 10", n)
	}
	// A healthy node fires no alert.
	if r := query(`ALERTS{alertstate="firing"}`); len(r) != 0 {
		t.Errorf("alerts firing on a healthy node: %v", r)
	}
	if r := query(`ALERTS{alertname=~"PlegDown|PlegAbsent"}`); len(r) != 0 {
		t.Errorf("a dead-daemon alert with pleg up: %v", r)
	}

	// pleg dies: its HTTP server stops, scrapes fail. Prometheus's up for
	// the target turns 0 and PlegDown becomes pending for that instance
	// (it would fire after its 5m).
	cancel()
	<-served
	stopped := time.Now()
	pending := fmt.Sprintf(`ALERTS{alertname="PlegDown", alertstate="pending", job="pleg", instance=%q}`, ln.Addr().String())
	deadline = time.Now().Add(90 * time.Second)
	for len(query(pending)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("PlegDown not pending within 90 s of pleg's server stopping (up: %v, alerts: %v)",
				query(`up{job="pleg"}`), query(`ALERTS`))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("PlegDown pending %v after pleg stopped", time.Since(stopped).Round(100*time.Millisecond))
	if r := query(`up{job="pleg"} == 0`); len(r) != 1 {
		t.Errorf("up{job=\"pleg\"} == 0: %v, want pleg's target", r)
	}
	if r := query(`ALERTS{alertname="PlegAbsent"}`); len(r) != 0 {
		t.Errorf("PlegAbsent while pleg's target is known (down): %v", r)
	}
}

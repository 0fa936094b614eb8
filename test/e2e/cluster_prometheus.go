package e2e

// A real Prometheus beside the cluster: it discovers pleg's targets from
// the API server with deploy/prometheus/scrape-config.yaml's job
// (kubernetes_sd_configs, role node) and evaluates
// deploy/prometheus/pleg-rules.yaml. Debian's Prometheus (2.42, which the
// deploy tests run) is built without Kubernetes service discovery: this
// one is Prometheus 3.16.0, built by test/kubelet/build.sh's cluster mode.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/podlifecycle/pleg/internal/testport"
)

const (
	scrapeConfigPath = "deploy/prometheus/scrape-config.yaml"
	rulesPath        = "deploy/prometheus/pleg-rules.yaml"
)

// promClient asks Prometheus's API, each request bounded.
var promClient = &http.Client{Timeout: 10 * time.Second}

// clusterProm is a running Prometheus.
type clusterProm struct {
	base string // http://127.0.0.1:port
}

// startPrometheus runs Prometheus with the repository's scrape job and
// rules; only what reaching the API server from outside the cluster needs
// is added to the job (api_server, and the admin's client certificate).
func (c *cluster) startPrometheus(t testing.TB) *clusterProm {
	t.Helper()
	bin := filepath.Join(c.dir, "bin", "prometheus")
	if err := os.Symlink(c.bins.Prometheus, bin); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(baseEnv.repoRoot, scrapeConfigPath))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", scrapeConfigPath, err)
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	if len(jobs) == 0 {
		t.Fatalf("%s has no scrape_configs", scrapeConfigPath)
	}
	for _, j := range jobs {
		job, _ := j.(map[string]any)
		sds, _ := job["kubernetes_sd_configs"].([]any)
		if len(sds) == 0 {
			t.Fatalf("%s: job %v discovers nothing from Kubernetes", scrapeConfigPath, job["job_name"])
		}
		for _, s := range sds {
			sd := s.(map[string]any)
			sd["api_server"] = c.server
			sd["tls_config"] = map[string]any{"ca_file": c.ca.path("ca.crt"), "cert_file": c.ca.path("admin.crt"), "key_file": c.ca.path("admin.key")}
		}
	}
	cfg["global"] = map[string]any{"evaluation_interval": "5s"}
	cfg["rule_files"] = []any{filepath.Join(baseEnv.repoRoot, rulesPath)}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.dir, "prometheus")
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, out, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testport.Addr(t)
	if err := c.startProc(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn"); err != nil {
		t.Fatal(err)
	}
	p := &clusterProm{base: "http://" + addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.waitHTTP(ctx, "prometheus", http.DefaultClient, p.base+"/-/ready"); err != nil {
		t.Fatal(err)
	}
	return p
}

// promSample is one series of an instant query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query.
func (p *clusterProm) query(q string) ([]promSample, error) {
	resp, err := promClient.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, r.Error)
	}
	return r.Data.Result, nil
}

// instances maps each series' instance to its value.
func instances(ss []promSample) map[string]string {
	out := map[string]string{}
	for _, s := range ss {
		v, _ := s.Value[1].(string)
		out[s.Metric["instance"]] = v
	}
	return out
}

// ruleHealth lists the rules whose last evaluation failed.
func (p *clusterProm) ruleHealth() (evaluated int, bad []string, err error) {
	resp, err := promClient.Get(p.base + "/api/v1/rules")
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, nil, err
	}
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			switch rule.Health {
			case "ok":
				evaluated++
			case "unknown":
			default:
				bad = append(bad, rule.Name+": "+rule.LastError)
			}
		}
	}
	sort.Strings(bad)
	return evaluated, bad, nil
}

// waitTargetsUp waits until the pleg job's targets are exactly nodes, all
// up.
func (p *clusterProm) waitTargetsUp(t testing.TB, nodes ...string) {
	t.Helper()
	waitFor(t, 2*time.Minute, "Prometheus discovers and scrapes pleg on "+strings.Join(nodes, ", "), func() error {
		ss, err := p.query(`up{job="pleg"}`)
		if err != nil {
			return err
		}
		got := instances(ss)
		if len(got) != len(nodes) {
			return fmt.Errorf("targets %v, want %v", got, nodes)
		}
		for _, n := range nodes {
			if got[n] != "1" {
				return fmt.Errorf("up{instance=%q} = %q (targets %v)", n, got[n], got)
			}
		}
		return nil
	})
}

// alertState is the state ("pending", "firing", or "" when none) of the
// alert for instance.
func (p *clusterProm) alertState(alert, instance string) (string, error) {
	ss, err := p.query(fmt.Sprintf(`ALERTS{alertname=%q, instance=%q}`, alert, instance))
	if err != nil {
		return "", err
	}
	state := ""
	for _, s := range ss {
		if st := s.Metric["alertstate"]; state != "firing" {
			state = st
		}
	}
	return state, nil
}

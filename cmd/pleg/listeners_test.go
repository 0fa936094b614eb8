package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// startRunWithMetrics starts `pleg run` against r with both listeners on
// loopback and returns the process and both base URLs.
func startRunWithMetrics(t *testing.T, r *sim.Runtime, extra ...string) (p *proc, base, public string) {
	t.Helper()
	p = startPleg(t, append([]string{"run", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0",
		"--metrics-address", "127.0.0.1:0", "--relist-period", "100ms"}, extra...)...)
	base, _ = p.waitListening()
	poll(t, patience, "the --metrics-address line", func() bool {
		for _, l := range strings.Split(p.stderr(), "\n") {
			if m := publicRE.FindStringSubmatch(l); m != nil {
				public = m[1]
				return true
			}
		}
		return false
	})
	return p, base, public
}

// procMemory returns the process's resident set size now and its peak
// (VmRSS, VmHWM), in bytes.
func procMemory(t *testing.T, pid int) (rss, peak int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	kb := func(field string) int {
		m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no %s in /proc/%d/status", field, pid)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n << 10
	}
	return kb("VmRSS"), kb("VmHWM")
}

// raiseNoFile makes room for n open files in this process.
func raiseNoFile(t *testing.T, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	rl.Cur = n
	rl.Max = max(rl.Max, n) // raising the hard limit needs root
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("raising RLIMIT_NOFILE to %d: %v (run as root, or raise the hard limit)", n, err)
	}
}

// metricValue returns the value of the series named exactly series (name
// and labels, as exposed) in a /metrics body.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics lacks %s", series)
	return 0
}

// Ten thousand idle connections to the metrics port (half of them after a
// keep-alive request, half never sending a byte), as any pod can open on a
// hostNetwork node: pleg's memory stays far below the DaemonSet's 128 Mi
// limit, and /metrics keeps answering.
func TestRunIdleConnections(t *testing.T) {
	const conns = 10000
	raiseNoFile(t, conns+1000)
	r := serveSim(t, sim.Config{Seed: 7, Pods: 10, ContainersPerPod: 2})
	p, _, public := startRunWithMetrics(t, r)
	poll(t, patience, "/metrics on --metrics-address", func() bool {
		code, _ := httpGet(t, public+"/metrics")
		return code == 200
	})
	rssBefore, _ := procMemory(t, p.cmd.Process.Pid)
	addr := strings.TrimPrefix(public, "http://")

	var mu sync.Mutex
	var open []net.Conn
	var dialErrs int
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	dialStart := time.Now()
	var wg sync.WaitGroup
	const dialers = 16
	for d := range dialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := d; i < conns; i += dialers {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					mu.Lock()
					dialErrs++
					mu.Unlock()
					continue
				}
				if i%2 == 0 { // a keep-alive request, its answer never read
					_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:10266\r\n\r\n")
				}
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	dialed := time.Since(dialStart)
	if dialErrs > conns/100 {
		t.Fatalf("%d of %d connections could not be opened", dialErrs, conns)
	}

	// /metrics still answers, from a fresh connection each time (as
	// Prometheus opens one when its last was closed).
	var body string
	for i := range 3 {
		c := http.Client{Timeout: patience, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(public + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics #%d with %d idle connections: %v", i, conns, err)
		}
		b, _ := io.ReadAll(bufio.NewReader(resp.Body))
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /metrics #%d = %d", i, resp.StatusCode)
		}
		body = string(b)
	}
	rss, peak := procMemory(t, p.cmd.Process.Pid)
	t.Logf("%d connections opened in %v (%d could not be); pleg's RSS %.1f MiB before, %.1f MiB after, peak %.1f MiB",
		conns, dialed.Round(time.Millisecond), dialErrs, float64(rssBefore)/(1<<20), float64(rss)/(1<<20), float64(peak)/(1<<20))
	if limit := 64 << 20; peak > limit {
		t.Errorf("peak RSS %.1f MiB, over %d MiB (the DaemonSet's limit is 128 MiB)", float64(peak)/(1<<20), limit>>20)
	}
	nOpen := metricValue(t, body, `pleg_http_connections{listener="metrics"}`)
	evicted := metricValue(t, body, `pleg_http_connections_shed_total{listener="metrics",reason="idle_evicted"}`)
	t.Logf("pleg_http_connections{listener=\"metrics\"} %v, idle_evicted %v", nOpen, evicted)
	if nOpen > 256 {
		t.Errorf("%v connections open on the metrics listener, over the default cap of 256", nOpen)
	}
	if want := conns - dialErrs - 256; evicted < float64(want) {
		t.Errorf("%v idle connections evicted, want at least %d", evicted, want)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// The loopback API refuses a forged Host (DNS rebinding through a
// port-forward) and answers loopback and allowed ones; the metrics port,
// scraped by node IP, answers any.
func TestRunHostCheck(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7, Pods: 2})
	p, base, public := startRunWithMetrics(t, r, "--allowed-hosts", "node-a.example,10.0.0.7")
	get := func(url, host string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = host
		resp, err := (&http.Client{Timeout: patience}).Do(req)
		if err != nil {
			t.Fatalf("GET %s (Host %s): %v", url, host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for host, want := range map[string]int{
		"attacker.example":       421,
		"attacker.example:10265": 421,
		"10.0.0.8:10265":         421,
		"localhost:10265":        200,
		"127.0.0.1:10265":        200,
		"[::1]:10265":            200,
		"node-a.example:10265":   200,
		"10.0.0.7":               200,
	} {
		code, body := get(base+"/api/v1/pods", host)
		if code != want {
			t.Errorf("GET /api/v1/pods with Host %s = %d %.80q, want %d", host, code, body, want)
		}
		if code == 421 && !strings.Contains(body, "DNS rebinding") {
			t.Errorf("the 421 body does not say why: %q", body)
		}
	}
	if code, _ := get(public+"/metrics", "attacker.example"); code != 200 {
		t.Errorf("GET /metrics on --metrics-address with any Host = %d, want 200", code)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

package httpapi

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/outbox"
)

// serve serves s's full API (public: the public handler) on a loopback
// listener until the test ends, and returns its address.
func serve(t *testing.T, s *Server, public bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if public {
			_ = s.ServePublic(ctx, ln)
		} else {
			_ = s.Serve(ctx, ln)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// dial opens a raw connection, closed when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a raw GET on c and returns the status line.
func roundTrip(t *testing.T, c net.Conn, host, path string) string {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host); err != nil {
		t.Fatalf("writing a request: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response to GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status
}

// closedByServer reports whether the server has closed c (reading it ends
// at once) rather than keeping it open (the read times out).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

func gauge(t *testing.T, c prometheus.Collector) int {
	t.Helper()
	return int(testutil.ToFloat64(c))
}

// Past the cap, the connection that has waited longest outside a request
// is closed to make room: idle connections, including one trickling its
// headers, cannot lock a probe out, and never exceed the cap.
func TestConnectionCapEvictsIdle(t *testing.T) {
	s := New(Config{Generator: startGenerator(t, samplePods()), MaxConnections: 4})
	addr := serve(t, s, true)
	// net/http reports a connection idle after the client may have read
	// its response: wait for that before the next connection, or it could
	// find the one before still in its request.
	idle := make(chan struct{}, 16)
	hook := func(c net.Conn, st http.ConnState) {
		if st == http.StateIdle && c.LocalAddr().String() == addr {
			select {
			case idle <- struct{}{}:
			default:
			}
		}
	}
	testHookConnState.Store(&hook)
	t.Cleanup(func() { testHookConnState.Store(nil) })
	reportedIdle := func(what string) {
		t.Helper()
		select {
		case <-idle:
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s connection was never reported idle", what)
		}
	}
	conns := s.metrics.connections.WithLabelValues(ListenerMetrics)
	evicted := s.metrics.shed.WithLabelValues(ListenerMetrics, shedEvicted)

	// Four slots taken: a connection that never sends, two idle after a
	// keep-alive request, one trickling its request's headers.
	silent := dial(t, addr)
	kept1, kept2 := dial(t, addr), dial(t, addr)
	for _, c := range []net.Conn{kept1, kept2} {
		if st := roundTrip(t, c, "10.0.0.1:10266", "/healthz"); st != "200 OK" {
			t.Fatalf("GET /healthz = %s", st)
		}
		reportedIdle("kept-alive")
	}
	slow := dial(t, addr)
	if _, err := io.WriteString(slow, "GET /metrics HTTP/1.1\r\nHo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "four connections", func() bool { return gauge(t, conns) == 4 })

	// Four probes, one after another: each evicts the connection that has
	// waited longest, and is answered.
	for i := range 4 {
		probe := dial(t, addr)
		if st := roundTrip(t, probe, "10.0.0.1:10266", "/healthz"); st != "200 OK" {
			t.Fatalf("probe %d: GET /healthz = %s", i, st)
		}
		if n := gauge(t, conns); n > 4 {
			t.Fatalf("%d connections open, over the cap of 4", n)
		}
		reportedIdle("probe")
	}
	if n := gauge(t, evicted); n != 4 {
		t.Errorf("idle connections evicted = %d, want 4", n)
	}
	for name, c := range map[string]net.Conn{"silent": silent, "kept-alive": kept1, "kept-alive 2": kept2, "trickling": slow} {
		if !closedByServer(c) {
			t.Errorf("the %s connection is still open: it should have been evicted before the probes", name)
		}
	}
}

// When every slot is in a request, a new connection is refused at once,
// with a 503 that says why; the requests in progress go on.
func TestConnectionCapRefusesWhenBusy(t *testing.T) {
	s := New(Config{Generator: startGenerator(t, samplePods()), MaxConnections: 2})
	addr := serve(t, s, false)
	refused := s.metrics.shed.WithLabelValues(ListenerAPI, shedRefused)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 { // event streams: in a request for as long as they last
		_, sse := openStream(t, ctx, "http://"+addr)
		sse.snapshot()
	}
	c := dial(t, addr)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the refused connection: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(b), "too many connections") {
		t.Errorf("refused connection: %s %q", resp.Status, b)
	}
	if n := gauge(t, refused); n != 1 {
		t.Errorf("refused = %d, want 1", n)
	}
	cancel()
	// The slots free up with the streams.
	waitFor(t, "a new connection served", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		return roundTrip(t, c, "localhost", "/healthz") == "200 OK"
	})
}

// The full API answers loopback hosts and allowed ones only; the public
// handler (Prometheus scrapes by node IP) answers any.
func TestHostCheck(t *testing.T) {
	g := startGenerator(t, samplePods())
	for _, tc := range []struct {
		allowed []string
		host    string
		want    int
	}{
		{nil, "localhost", 200},
		{nil, "localhost:10265", 200},
		{nil, "LocalHost:10265", 200},
		{nil, "127.0.0.1", 200},
		{nil, "127.0.0.1:10265", 200},
		{nil, "127.8.9.10:80", 200},
		{nil, "[::1]", 200},
		{nil, "[::1]:10265", 200},
		{nil, "attacker.example", 421},
		{nil, "attacker.example:10265", 421},
		{nil, "localhost.attacker.example", 421},
		{nil, "10.0.0.1:10265", 421},
		{nil, "[::ffff:10.0.0.1]:10265", 421},
		{[]string{"node-a", "10.0.0.1", "fd00::1"}, "NODE-A:10265", 200},
		{[]string{"node-a", "10.0.0.1", "fd00::1"}, "10.0.0.1", 200},
		{[]string{"node-a", "10.0.0.1", "fd00::1"}, "[fd00:0::1]:10265", 200},
		{[]string{"node-a", "10.0.0.1", "fd00::1"}, "127.0.0.1", 200},
		{[]string{"node-a", "10.0.0.1", "fd00::1"}, "node-b", 421},
		{[]string{AnyHost}, "attacker.example", 200},
	} {
		t.Run(fmt.Sprintf("%v %s", tc.allowed, tc.host), func(t *testing.T) {
			s := New(Config{Generator: g, AllowedHosts: tc.allowed})
			addr := serve(t, s, false)
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/api/v1/pods", nil)
			req.Host = tc.host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("Host %q: %d %.100q, want %d", tc.host, resp.StatusCode, b, tc.want)
			}
			if tc.want == 421 {
				if !strings.Contains(string(b), "is not allowed") || !strings.Contains(string(b), "DNS rebinding") {
					t.Errorf("421 body %q does not say why", b)
				}
				if n := gauge(t, s.metrics.hostRejected); n != 1 {
					t.Errorf("pleg_http_host_rejected_total = %d, want 1", n)
				}
			}
		})
	}
	t.Run("public handler", func(t *testing.T) {
		s := New(Config{Generator: g, Gatherer: prometheus.NewRegistry()})
		addr := serve(t, s, true)
		c := dial(t, addr)
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			if st := roundTrip(t, c, "10.0.0.1:10266", path); st != "200 OK" {
				t.Errorf("GET %s with the node's address as Host = %s", path, st)
			}
		}
	})
}

func TestValidateAllowedHost(t *testing.T) {
	for h, ok := range map[string]bool{"node-a": true, "10.0.0.1": true, "fd00::1": true, "[fd00::1]": true, "*": true,
		"": false, "node-a:10265": false, "[::1]:80": false, "http://node-a": false, "a b": false} {
		if err := ValidateAllowedHost(h); (err == nil) != ok {
			t.Errorf("ValidateAllowedHost(%q) = %v", h, err)
		}
	}
}

// sendQueue returns the bytes the kernel holds, unacknowledged, in the send
// queue of the TCP socket from local to remote (tx_queue in
// /proc/net/tcp): what a server's socket holds for a client that does not
// read.
func sendQueue(t *testing.T, local, remote net.Addr) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	hexAddr := func(a net.Addr) string {
		ta := a.(*net.TCPAddr)
		ip := ta.IP.To4()
		return strings.ToUpper(hex.EncodeToString([]byte{ip[3], ip[2], ip[1], ip[0]})) + fmt.Sprintf(":%04X", ta.Port)
	}
	l, r := hexAddr(local), hexAddr(remote)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 4 && f[1] == l && f[2] == r {
			tx, err := strconv.ParseInt(strings.Split(f[4], ":")[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(tx)
		}
	}
	return -1 // closed
}

// capture is a logger keeping its lines.
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		c.lines = append(c.lines, args)
		c.mu.Unlock()
	}, funcr.Options{Verbosity: 1})
}

func (c *capture) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// longNamedPods is a runtime of n running pods of two containers, with
// long names and IDs: their resync is tens of kilobytes.
func longNamedPods(n int) *fakeRuntime {
	rt := newFakeRuntime()
	for i := range n {
		rt.pods = append(rt.pods, &cruntime.Pod{UID: runtimeUID(i), Name: fmt.Sprintf("pod-with-a-long-name-%04d", i), Namespace: "default",
			Containers: []*cruntime.Container{
				{ID: fmt.Sprintf("container-%04d-a-long-container-id", i), Name: "app", State: cruntime.StateRunning},
				{ID: fmt.Sprintf("container-%04d-b-long-container-id", i), Name: "sidecar", State: cruntime.StateRunning},
			}})
	}
	return rt
}

// churn makes the runtime change a container every 5 ms until the test
// ends: events keep flowing.
func churn(t *testing.T, rt *fakeRuntime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rt.set(func(f *fakeRuntime) {
				c := f.pods[i%len(f.pods)].Containers[0]
				if c.State == cruntime.StateRunning {
					c.State = cruntime.StateExited
				} else {
					c.State = cruntime.StateRunning
				}
			})
		}
	}()
}

// A client that connects to the event stream and never reads, with events
// flowing and the kernel's buffers left as they are on both sides: pleg
// drops it within the stream write timeout, holding a bounded number of
// bytes for it meanwhile (its queue, which the reader keeps under the
// bound by waiting, and its socket's send queue), counts the drop and logs
// it once.
func TestEventStreamDropsClientThatNeverReads(t *testing.T) {
	rt := longNamedPods(600)
	g := startGenerator(t, rt)
	waitRelisted(t, g, 600)
	churn(t, rt)
	for _, tc := range []struct {
		name      string
		timeout   time.Duration
		maxQueued int
		want      outbox.Reason
	}{
		// A short timeout keeps the test short.
		{"stalled", 2 * time.Second, DefaultStreamMaxQueuedBytes, outbox.Stalled},
		// A small bound: pleg holds at most it (the journal holds the
		// rest, the reader waits) until the client is dropped as stalled.
		{"small queue", 2 * time.Second, 16 << 10, outbox.Stalled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs capture
			s := New(Config{Generator: g, StreamWriteTimeout: tc.timeout, StreamMaxQueuedBytes: tc.maxQueued,
				Logger: logs.logger(), Registerer: prometheus.NewRegistry()})
			addr := serve(t, s, false)
			c := dial(t, addr)
			start := time.Now()
			if _, err := io.WriteString(c, "GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			// The most pleg may hold for the stream: the queue's bound
			// and a message's slack; and the kernel, the send buffer pleg
			// set (which Linux doubles) plus a segment's slack.
			waitFor(t, "the stream's first messages to be queued", func() bool {
				_, q := s.streamStats()
				return q > 0
			})
			maxHeld := tc.maxQueued + 4<<10
			maxKernel := 2*sendBuffer + 64<<10
			var peakHeld, peakKernel int
			drops := func(r outbox.Reason) int { return gauge(t, s.metrics.streamDrops.WithLabelValues(string(r))) }
			waitFor(t, "the stream to be dropped", func() bool {
				if _, q := s.streamStats(); q > peakHeld {
					peakHeld = q
				}
				if n := sendQueue(t, c.RemoteAddr(), c.LocalAddr()); n > peakKernel {
					peakKernel = n
				}
				return drops(outbox.Stalled) > 0
			})
			elapsed := time.Since(start)
			t.Logf("dropped after %v; peak queued in pleg %d bytes, in the kernel %d bytes", elapsed, peakHeld, peakKernel)
			if drops(tc.want) != 1 {
				t.Errorf("drops: stalled %d; want one %s", drops(outbox.Stalled), tc.want)
			}
			if elapsed > min(tc.timeout, 30*time.Second)+time.Second {
				t.Errorf("dropped after %v, more than the stream write timeout (%v) and a second", elapsed, tc.timeout)
			}
			if peakHeld > maxHeld {
				t.Errorf("pleg queued %d bytes for the stream, over the bound and a message (%d)", peakHeld, maxHeld)
			}
			if peakKernel > maxKernel {
				t.Errorf("the kernel held %d bytes for the stream, over %d", peakKernel, maxKernel)
			}
			waitFor(t, "the connection closed and the queue freed", func() bool {
				n, q := s.streamStats()
				return n == 0 && q == 0 && closedByServer(c)
			})
			if n := logs.count(`"msg"="Dropped an event stream client"`); n != 1 {
				t.Errorf("%d drop lines logged, want 1:\n%s", n, strings.Join(logs.lines, "\n"))
			}
		})
	}
}

// An event stream lasts longer than every request timeout (the server's
// write deadline would otherwise end it).
func TestEventStreamOutlivesRequestTimeouts(t *testing.T) {
	g := startGenerator(t, samplePods())
	// The inspected pod in the journal before the stream opens: the first
	// relist can end before its inspections do, and a pod journaled after
	// the snapshot would be an event where the test wants only heartbeats.
	// (uid-a's inspection fails every time: the journal never has it.)
	waitFor(t, "the web pod in the journal", func() bool {
		_, ok := g.Journal().Pod("uid-b")
		return ok
	})
	s := New(Config{Generator: g, Heartbeat: 50 * time.Millisecond, ReadTimeout: 100 * time.Millisecond,
		WriteTimeout: 100 * time.Millisecond, ReadHeaderTimeout: 100 * time.Millisecond, StreamWriteTimeout: time.Second})
	addr := serve(t, s, false)
	_, sse := openStream(t, context.Background(), "http://"+addr)
	start := time.Now()
	sse.snapshot()
	// Twenty heartbeats take a second: ten times the request timeouts.
	for range 20 {
		if m := sse.next(); !m.comment {
			t.Fatalf("message %+v, want a heartbeat", m)
		}
	}
	t.Logf("stream open for %v", time.Since(start))
}

// /api/v1/pods to a client that does not read is bounded by the write
// timeout: the connection is closed, not held.
func TestPodsWriteTimeout(t *testing.T) {
	rt := newFakeRuntime()
	for i := range 3000 {
		rt.pods = append(rt.pods, &cruntime.Pod{UID: runtimeUID(i), Name: fmt.Sprintf("pod-with-a-long-name-%04d", i), Namespace: "default",
			Containers: []*cruntime.Container{{ID: fmt.Sprintf("container-%04d-a-long-container-id", i), Name: "app", State: cruntime.StateRunning}}})
	}
	g := startGenerator(t, rt)
	waitRelisted(t, g, 3000)
	s := New(Config{Generator: g, WriteTimeout: 500 * time.Millisecond})
	addr := serve(t, s, false)
	conns := s.metrics.connections.WithLabelValues(ListenerAPI)
	c := dial(t, addr)
	if _, err := io.WriteString(c, "GET /api/v1/pods HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to be served", func() bool { return gauge(t, conns) == 1 })
	start := time.Now()
	waitFor(t, "the server to close the connection", func() bool { return gauge(t, conns) == 0 })
	t.Logf("closed %v after the request was accepted", time.Since(start))
}

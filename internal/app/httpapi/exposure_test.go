package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// The public handler serves what probes and Prometheus need and nothing
// that names pods.
func TestPublicHandlerServesNoPodData(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := startGenerator(t, samplePods())
	s := New(Config{Generator: g, Gatherer: reg})
	s.Handle("/", http.NotFoundHandler())
	for path, want := range map[string]int{
		"/healthz": 200, "/readyz": 200, "/metrics": 200,
		"/api/v1/pods": 404, "/api/v1/events": 404, "/api/v1/relists": 404, "/": 404,
	} {
		if code, body, _ := get(t, s.PublicHandler(), path); code != want {
			t.Errorf("public GET %s = %d, want %d (%.80s)", path, code, want, body)
		}
	}
	if code, _, _ := get(t, s.Handler(), "/api/v1/pods"); code != 200 {
		t.Errorf("the full handler lost /api/v1/pods: %d", code)
	}
}

// serveOn serves s on a loopback listener whose accepted connections have
// a small send buffer, until the test ends; it returns the base URL.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, smallSendBuffers{ln.(*net.TCPListener)}) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

type smallSendBuffers struct{ *net.TCPListener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteBuffer(4096)
	return c, nil
}

// streamStatus opens an event stream and returns its status code, closing
// it at once.
func streamStatus(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A client that asks for the event stream and never reads it is cut off by
// the write deadline: it does not keep its subscription (nor its stream
// slot) forever.
func TestEventStreamDropsClientThatStopsReading(t *testing.T) {
	rt := longNamedPods(300)
	g := startGenerator(t, rt)
	waitRelisted(t, g, 300)
	s := New(Config{Generator: g, MaxStreams: 1, StreamWriteTimeout: 500 * time.Millisecond})
	url := serveOn(t, s)

	// The stalled client: a tiny receive buffer, and it never reads the
	// resync (tens of kilobytes).
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Its handler has the only slot once its status line arrives (the
	// reader takes at most a few kilobytes of the resync with it).
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("the stalled client's stream: %q %v", line, err)
	}
	// The write deadline cuts it off; then a new stream is served.
	waitFor(t, "the stalled stream to be cut off", func() bool { return streamStatus(t, url) == 200 })
	// The stalled connection was closed by the server: reading it ends.
	for {
		if _, err := br.ReadString('\n'); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the server kept the stalled connection open")
			}
			break
		}
	}
}

// A thousand clients cannot hold a thousand subscriptions: past MaxStreams
// they get 503 at once, and the relists go on.
func TestEventStreamsAreCapped(t *testing.T) {
	g := startGenerator(t, samplePods())
	// A connection cap above the 1,000 clients: this test is about the
	// streams' cap.
	s := New(Config{Generator: g, MaxStreams: 8, MaxConnections: 2000})
	url := serveOn(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := len(g.RecentRelists())
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 1000}}
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/events", nil)
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
			if resp.StatusCode != 200 {
				resp.Body.Close()
				return
			}
			// Hold the stream open until the test ends.
			<-ctx.Done()
			resp.Body.Close()
		}()
	}
	waitFor(t, "every client answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return codes[200]+codes[503] == 1000
	})
	mu.Lock()
	got := fmt.Sprint(codes)
	ok := codes[200] == 8 && codes[503] == 992
	mu.Unlock()
	if !ok {
		t.Errorf("status codes %s, want 8 streams and 992 refusals", got)
	}
	waitFor(t, "relists while the streams are open", func() bool { return len(g.RecentRelists()) > before+5 })
	cancel()
	wg.Wait()
}

func runtimeUID(i int) types.UID { return types.UID(fmt.Sprintf("uid-%04d", i)) }

package server

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/leakcheck"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// patience bounds how long a test waits for what should come at once; a
// test that passes does not wait it out.
const patience = 30 * time.Second

// TestMain fails the run when goroutines of this package or gRPC outlive
// the tests.
func TestMain(m *testing.M) {
	leakcheck.Main(m, patience, "pleg/api/lifecycle/server.", "google.golang.org/grpc")
}

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// waitTimer waits for the next timer made on c: the server makes one
// exactly when a watch starts waiting for its client.
func waitTimer(t *testing.T, c *testkit.TimerClock) {
	t.Helper()
	select {
	case <-c.Timers:
	case <-time.After(patience):
		t.Fatal("no watch waited for its client")
	}
}

// stepUntilCut steps the server's clock by the stall timeout for each
// timer made on it (a watch's outbox arms its watchdog as a send starts)
// until a watch is cut; what is named failed to be cut otherwise.
func stepUntilCut(t *testing.T, h *harness, what string) {
	t.Helper()
	cut := h.logs.Logged("Cut a watcher")
	for {
		select {
		case <-cut:
			return
		case <-h.sclock.Timers:
			h.sclock.Step(DefaultStallTimeout)
		case <-time.After(patience):
			t.Fatalf("%s was not cut", what)
		}
	}
}

// harness is a server of a journal on a unix socket and a client of it.
type harness struct {
	j      *journal.Journal
	jclock *testkit.TimerClock // the journal's: entries' times, bookmarks
	sclock *testkit.TimerClock // the server's: stall timeouts
	srv    *Server
	reg    *prometheus.Registry
	sock   string
	conn   *grpc.ClientConn
	client lifecyclev1.LifecycleClient
	logs   *testkit.LogSink

	stop     context.CancelFunc
	serveErr chan error
}

// newHarness serves a fresh journal with cfg (Journal, Clock, Registerer
// and Logger are set here) and dials it.
func newHarness(t *testing.T, jo journal.Options, cfg Config) *harness {
	t.Helper()
	h := &harness{jclock: testkit.NewTimerClock(epoch, 1024), sclock: testkit.NewTimerClock(epoch, 1024), reg: prometheus.NewRegistry(), logs: &testkit.LogSink{}}
	jo.Clock = h.jclock
	if jo.Epoch == "" {
		jo.Epoch = "e1"
	}
	h.j = journal.New(jo)
	cfg.Journal, cfg.Clock, cfg.Registerer, cfg.Logger = h.j, h.sclock, h.reg, h.logs.Logger(2)
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	h.sock = filepath.Join(t.TempDir(), "pleg.sock")
	ln, err := ListenUnix(h.sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.serveErr = make(chan error, 1)
	go func() { h.serveErr <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { h.shutdown(t) })
	h.conn, h.client = h.dial(t)
	return h
}

// dial returns a new connection to the server, closed when the test ends.
func (h *harness) dial(t *testing.T, opts ...grpc.DialOption) (*grpc.ClientConn, lifecyclev1.LifecycleClient) {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("unix://"+h.sock, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, lifecyclev1.NewLifecycleClient(conn)
}

// shutdown stops the server (once) and checks that Serve returned nil.
func (h *harness) shutdown(t *testing.T) {
	t.Helper()
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.serveErr:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(patience):
		t.Error("Serve did not return after its context ended")
	}
}

// watch opens a Watch, ended with the test.
func (h *harness) watch(t *testing.T, req *lifecyclev1.WatchRequest) lifecyclev1.Lifecycle_WatchClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := h.client.Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recv returns the next message of s, failing the test on an error.
func recv(t *testing.T, s lifecyclev1.Lifecycle_WatchClient) *lifecyclev1.WatchResponse {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return m
}

// recvN returns the next n messages of s.
func recvN(t *testing.T, s lifecyclev1.Lifecycle_WatchClient, n int) []*lifecyclev1.WatchResponse {
	t.Helper()
	out := make([]*lifecyclev1.WatchResponse, n)
	for i := range out {
		out[i] = recv(t, s)
	}
	return out
}

// recvErr reads s until it ends and returns how it ended (io.EOF: OK) and
// what it received before.
func recvErr(s lifecyclev1.Lifecycle_WatchClient) ([]*lifecyclev1.WatchResponse, error) {
	var got []*lifecyclev1.WatchResponse
	for {
		m, err := s.Recv()
		if err != nil {
			return got, err
		}
		got = append(got, m)
	}
}

// kind names a message's type, for comparisons.
func kind(m *lifecyclev1.WatchResponse) string {
	switch x := m.GetMessage().(type) {
	case *lifecyclev1.WatchResponse_Snapshot:
		return "snapshot " + x.Snapshot.GetUid()
	case *lifecyclev1.WatchResponse_SnapshotEnd:
		return "snapshot_end"
	case *lifecyclev1.WatchResponse_Event:
		var ts []string
		for _, tr := range x.Event.GetTransitions() {
			ts = append(ts, tr.GetType().String())
		}
		return "event " + x.Event.GetPod().GetUid() + " " + strings.Join(ts, ",")
	case *lifecyclev1.WatchResponse_Bookmark:
		return "bookmark"
	case *lifecyclev1.WatchResponse_RuntimeStatus:
		return "runtime " + x.RuntimeStatus.GetState().String()
	case *lifecyclev1.WatchResponse_ResyncRequired:
		return "resync_required"
	}
	return "unknown"
}

func kinds(ms []*lifecyclev1.WatchResponse) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = kind(m)
	}
	return out
}

// pod is a pod state with a sandbox "<uid>-sb" and containers
// "<uid>-<name>" running.
func pod(uid, ns string, labels map[string]string, names ...string) *journal.Pod {
	p := &journal.Pod{UID: types.UID(uid), Name: "pod-" + uid, Namespace: ns, Labels: cruntime.NewLabels(labels), IPs: []string{"10.0.0.1"},
		Sandboxes:  []*journal.Sandbox{{ID: uid + "-sb", Name: "pod-" + uid, State: cruntime.StateRunning, CreatedAt: epoch}},
		ObservedAt: epoch}
	for _, n := range names {
		p.Containers = append(p.Containers, new(journal.Container{ID: uid + "-" + n, Name: n, State: cruntime.StateRunning,
			Image: "img"}.WithStatus(&cruntime.ContainerStatus{StartedAt: epoch})))
	}
	return p
}

// change appends a pod entry with transitions of the given types.
func change(j *journal.Journal, p *journal.Pod, types ...string) uint64 {
	e := journal.Entry{Kind: journal.KindPod, Pod: p, Source: journal.SourceRelist}
	for _, t := range types {
		e.Transitions = append(e.Transitions, journal.Transition{Type: t})
	}
	return j.Append(e)
}

// isEOF reports a stream that ended OK.
func isEOF(err error) bool { return errors.Is(err, io.EOF) }

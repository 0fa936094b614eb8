package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	"github.com/podlifecycle/pleg/api/lifecycle/server"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/leakcheck"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// patience bounds how long a test waits for what should come at once; a
// test that passes does not wait it out.
const patience = 30 * time.Second

// TestMain fails the run when goroutines of pleg's packages or gRPC
// outlive the tests.
func TestMain(m *testing.M) {
	leakcheck.Main(m, patience, "podlifecycle/pleg", "google.golang.org/grpc")
}

// clockStart is when the fake clocks start.
var clockStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// pleg is a server of a journal on a unix socket.
type pleg struct {
	j      *journal.Journal
	sclock *testkit.TimerClock
	logs   *testkit.LogSink
	stop   context.CancelFunc
	done   chan error
}

// startPleg serves a new journal of epoch on sock.
func startPleg(t *testing.T, sock, epoch string, cfg server.Config) *pleg {
	t.Helper()
	p := &pleg{j: journal.New(journal.Options{Epoch: epoch, Size: 1 << 20, MaxBytes: 1 << 30}), sclock: testkit.NewTimerClock(clockStart, 1<<16),
		logs: &testkit.LogSink{}, done: make(chan error, 1)}
	cfg.Journal, cfg.Clock, cfg.Logger = p.j, p.sclock, p.logs.Logger(0)
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := server.ListenUnix(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	go func() { p.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { p.shutdown(t) })
	return p
}

func (p *pleg) shutdown(t *testing.T) {
	t.Helper()
	if p.stop == nil {
		return
	}
	p.stop()
	p.stop = nil
	if err := <-p.done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// podState is a pod with a running container "<uid>-c" of generation gen
// (an annotation), so that every change differs.
func podState(uid string, gen int) *journal.Pod {
	return &journal.Pod{UID: types.UID(uid), Name: "pod-" + uid, Namespace: "default",
		Annotations: cruntime.LabelsOf("gen", fmt.Sprint(gen)),
		Containers:  []*journal.Container{{ID: uid + "-c", Name: "c", State: cruntime.StateRunning}}}
}

func change(j *journal.Journal, uid string, gen int) uint64 {
	return j.Append(journal.Entry{Kind: journal.KindPod, Pod: podState(uid, gen), Source: journal.SourceRelist,
		Transitions: []journal.Transition{{Type: "PodSync"}}})
}

// call is one handler call as the recorder saw it.
type call struct {
	kind   string // "resync", "event", "runtime"
	pods   []string
	uid    string
	gen    string
	cursor string
	// clientCursor is the client's Cursor() when it made the call (with
	// recorder.client set): the cursor of the last message handled.
	clientCursor string
}

func (c call) String() string {
	switch c.kind {
	case "resync":
		return "resync " + strings.Join(c.pods, ",")
	case "event":
		return "event " + c.uid + "/" + c.gen
	}
	return c.kind
}

// recorder is a handler that reports every call on a channel.
type recorder struct {
	calls chan call
	// block, when set, is waited on by the next OnEvent.
	mu    sync.Mutex
	block chan struct{}
	// client, when set, is asked for its cursor at every call.
	client *client.Client
}

// clientCursor returns the cursor of r's client, if set.
func (r *recorder) clientCursor() string {
	r.mu.Lock()
	c := r.client
	r.mu.Unlock()
	if c == nil {
		return ""
	}
	return c.Cursor()
}

func newRecorder() *recorder { return &recorder{calls: make(chan call, 1<<16)} }

func (r *recorder) OnResync(pods []*lifecyclev1.Pod, at client.Position) {
	c := call{kind: "resync", cursor: at.Cursor, pods: []string{}}
	for _, p := range pods {
		c.pods = append(c.pods, p.GetUid()+"/"+p.GetAnnotations()["gen"])
	}
	r.calls <- c
}

func (r *recorder) OnEvent(ev *lifecyclev1.PodEvent, at client.Position) {
	r.mu.Lock()
	b := r.block
	r.block = nil
	r.mu.Unlock()
	if b != nil {
		<-b
	}
	r.calls <- call{kind: "event", uid: ev.GetPod().GetUid(), gen: ev.GetPod().GetAnnotations()["gen"], cursor: at.Cursor,
		clientCursor: r.clientCursor()}
}

func (r *recorder) OnRuntimeStatus(st *lifecyclev1.RuntimeStatus, at client.Position) {
	r.calls <- call{kind: "runtime " + st.GetState().String(), cursor: at.Cursor}
}

// next returns the next call, stepping the client's backoff clock
// whenever it waits.
func (r *recorder) next(t *testing.T, backoff *testkit.TimerClock) call {
	t.Helper()
	for {
		select {
		case c := <-r.calls:
			return c
		case d := <-backoff.Timers:
			backoff.Step(d)
		case <-time.After(patience):
			t.Fatal("no handler call")
		}
	}
}

// expect reads the next calls and compares them with want.
func (r *recorder) expect(t *testing.T, backoff *testkit.TimerClock, want ...string) []call {
	t.Helper()
	got := make([]call, len(want))
	for i := range want {
		got[i] = r.next(t, backoff)
		if got[i].String() != want[i] {
			t.Fatalf("call %d: %s, want %s", i, got[i], want[i])
		}
	}
	return got
}

// runClient runs a client of sock with h until the test ends.
func runClient(t *testing.T, sock string, h client.Handler, o client.Options) (*client.Client, *testkit.TimerClock) {
	t.Helper()
	backoff := testkit.NewTimerClock(clockStart, 1<<16)
	o.Address, o.Clock = sock, backoff
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		c.Close()
	})
	return c, backoff
}

// pleg restarts under the client: the client resumes with its cursor, the
// new instance answers resync_required, the client resyncs and gets every
// later transition.
func TestServerRestartResyncsThenStreams(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pleg.sock")
	a := startPleg(t, sock, "a", server.Config{})
	change(a.j, "p1", 1)
	rec := newRecorder()
	c, backoff := runClient(t, sock, rec, client.Options{})
	rec.expect(t, backoff, "resync p1/1")
	change(a.j, "p1", 2)
	a.j.Append(journal.Entry{Kind: journal.KindRuntime, Runtime: &journal.RuntimeStatus{State: journal.RuntimeUnreachable}})
	got := rec.expect(t, backoff, "event p1/2", "runtime RUNTIME_UNREACHABLE")
	// The client's cursor, read as it hands over the next message (after
	// the handler returns it is stored, but when is the client's own
	// business): the last handled.
	rec.mu.Lock()
	rec.client = c
	rec.mu.Unlock()
	change(a.j, "p1", 3)
	next := rec.expect(t, backoff, "event p1/3")
	if cur := next[0].clientCursor; cur != got[1].cursor || cur != "a-3" {
		t.Fatalf("cursor %q, want the last handled, a-3", cur)
	}

	a.shutdown(t)
	b := startPleg(t, sock, "b", server.Config{})
	change(b.j, "p2", 1)
	rec.expect(t, backoff, "resync p2/1")
	change(b.j, "p2", 2)
	change(b.j, "p3", 1)
	rec.expect(t, backoff, "event p2/2", "event p3/1")
	if s := c.Stats(); s.Resyncs != 1 || s.Failures < 1 {
		t.Fatalf("stats %+v, want one resync and at least one failure", s)
	}
}

// A handler that blocks makes pleg cut the watch; the client then resumes
// from the last message it handled: every event exactly once, in order.
func TestCutClientResumesWithoutGap(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pleg.sock")
	p := startPleg(t, sock, "e", server.Config{QueueSize: 2})
	rec := newRecorder()
	release := make(chan struct{})
	rec.block = release
	c, backoff := runClient(t, sock, rec, client.Options{DialOptions: []grpc.DialOption{
		// 64 KiB windows: gRPC's flow control stops pleg's sender soon.
		grpc.WithInitialWindowSize(1 << 16), grpc.WithInitialConnWindowSize(1 << 16)}})
	rec.expect(t, backoff, "resync ")

	const n = 2000
	for i := range n {
		p.j.Append(journal.Entry{Kind: journal.KindPod, Pod: &journal.Pod{UID: "p", Name: "p", Namespace: "default",
			Annotations: cruntime.LabelsOf("gen", fmt.Sprint(i+1), "blob", strings.Repeat("x", 2048))}, Source: journal.SourceRelist,
			Transitions: []journal.Transition{{Type: "PodSync"}}})
	}
	// The handler holds the first event: let pleg's stall timers expire
	// until it cuts the watch.
	cut := p.logs.Logged("Cut a watcher")
	for done := false; !done; {
		select {
		case <-cut:
			done = true
		case d := <-p.sclock.Timers:
			p.sclock.Step(d)
		case <-time.After(patience):
			t.Fatal("pleg did not cut the blocked client")
		}
	}
	close(release)
	for i := range n {
		c := rec.next(t, backoff)
		if want := fmt.Sprintf("event p/%d", i+1); c.String() != want || c.cursor != fmt.Sprintf("e-%d", i+1) {
			t.Fatalf("call %d: %s at %s, want %s at e-%d", i, c, c.cursor, want, i+1)
		}
	}
	if s := c.Stats(); s.Cuts != 1 || s.Resyncs != 0 || s.Watches != 2 || s.Events != n {
		t.Fatalf("stats %+v, want 1 cut, no resync, 2 watches, %d events", s, n)
	}
}

// The connection drops (a proxy between client and pleg closes it): the
// client reconnects and resumes, with nothing lost and nothing twice.
func TestConnectionDropResumes(t *testing.T) {
	dir := t.TempDir()
	p := startPleg(t, filepath.Join(dir, "pleg.sock"), "e", server.Config{})
	px := startProxy(t, filepath.Join(dir, "proxy.sock"), filepath.Join(dir, "pleg.sock"))
	change(p.j, "p1", 1)
	rec := newRecorder()
	c, backoff := runClient(t, filepath.Join(dir, "proxy.sock"), rec, client.Options{})
	rec.expect(t, backoff, "resync p1/1")
	change(p.j, "p1", 2)
	rec.expect(t, backoff, "event p1/2")

	px.dropAll()
	change(p.j, "p1", 3)
	change(p.j, "p2", 1)
	rec.expect(t, backoff, "event p1/3", "event p2/1")
	change(p.j, "p1", 4)
	rec.expect(t, backoff, "event p1/4")
	if s := c.Stats(); s.Resyncs != 0 || s.Failures < 1 || s.Watches < 2 {
		t.Fatalf("stats %+v, want a resumed watch without resync", s)
	}
	if px.accepted() < 2 {
		t.Fatalf("the client connected %d times, want a reconnection", px.accepted())
	}
}

// A connection that drops in the middle of a snapshot: the client does
// not resume from the snapshot's cursor (that would skip the rest of it)
// but starts a new snapshot, and hands the handler one complete resync.
func TestDropDuringSnapshotStartsOver(t *testing.T) {
	dir := t.TempDir()
	p := startPleg(t, filepath.Join(dir, "pleg.sock"), "e", server.Config{})
	px := startProxy(t, filepath.Join(dir, "proxy.sock"), filepath.Join(dir, "pleg.sock"))
	const pods = 500
	var want []string
	for i := range pods {
		uid := fmt.Sprintf("p%03d", i)
		p.j.Append(journal.Entry{Kind: journal.KindPod, Source: journal.SourceRelist, Pod: &journal.Pod{UID: types.UID(uid), Name: uid,
			Namespace: "default", Annotations: cruntime.LabelsOf("gen", "1", "blob", strings.Repeat("x", 1024))}})
		want = append(want, uid+"/1")
	}
	px.setLimit(64 << 10) // ~60 of the 500 pods, then the connection drops
	rec := newRecorder()
	c, backoff := runClient(t, filepath.Join(dir, "proxy.sock"), rec, client.Options{})
	got := rec.next(t, backoff)
	if got.kind != "resync" || !slices.Equal(got.pods, want) {
		t.Fatalf("first call: %s with %d pods, want a resync of all %d", got.kind, len(got.pods), pods)
	}
	if px.accepted() != 2 || c.Stats().Watches != 2 {
		t.Fatalf("%d connections, %d watches: want the first dropped mid-snapshot and a second", px.accepted(), c.Stats().Watches)
	}
	change(p.j, "p000", 2)
	rec.expect(t, backoff, "event p000/2")
}

// A bad filter is not retried: Run returns ErrInvalidRequest at once.
func TestInvalidFilterIsReturned(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pleg.sock")
	startPleg(t, sock, "e", server.Config{})
	c, err := client.New(client.Options{Address: sock, Filter: &lifecyclev1.Filter{LabelSelector: "a in (b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err = c.Run(ctx, client.HandlerFuncs{})
	if !errors.Is(err, client.ErrInvalidRequest) || !strings.Contains(err.Error(), "filter.label_selector") {
		t.Fatalf("Run: %v, want ErrInvalidRequest naming filter.label_selector", err)
	}
}

// With pleg absent the client retries with a backoff that doubles up to
// its maximum, and returns nil when its context ends.
func TestBackoffWhilePlegIsAbsent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	backoff := testkit.NewTimerClock(clockStart, 1<<16)
	c, err := client.New(client.Options{Address: sock, Clock: backoff, InitialBackoff: time.Second, MaxBackoff: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, client.HandlerFuncs{}) }()
	var waits []time.Duration
	for range 6 {
		select {
		case d := <-backoff.Timers:
			waits = append(waits, d)
			backoff.Step(d)
		case <-time.After(patience):
			t.Fatal("no retry")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	for i, d := range waits {
		want := min(time.Second<<i, 8*time.Second)
		if d > want || d < want*4/5 {
			t.Fatalf("waits %v: wait %d is %v, want %v less at most 20%%", waits, i, d, want)
		}
	}
}

func TestTarget(t *testing.T) {
	for in, want := range map[string]string{
		"/run/pleg/pleg.sock":        "unix:///run/pleg/pleg.sock",
		"unix:///run/pleg/pleg.sock": "unix:///run/pleg/pleg.sock",
		"127.0.0.1:10266":            "dns:///127.0.0.1:10266",
		"localhost:10266":            "dns:///localhost:10266",
	} {
		if got, err := client.Target(in); err != nil || got != want {
			t.Errorf("Target(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := client.Target("http://x"); err == nil {
		t.Error("Target(http://x): no error")
	}
}

// proxy forwards unix socket connections to another socket and can drop
// them all.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	n     int
	wg    sync.WaitGroup
	// limit, when set, is how many bytes the next connection forwards
	// from the server before the proxy drops it.
	limit int64
}

func startProxy(t *testing.T, path, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.n++
			limit := p.limit
			p.limit = 0
			p.mu.Unlock()
			for i, pair := range [][2]net.Conn{{c, s}, {s, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					if i == 0 && limit > 0 {
						_, _ = io.CopyN(pair[0], pair[1], limit)
					} else {
						_, _ = io.Copy(pair[0], pair[1])
					}
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.dropAll()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) setLimit(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = n
}

func (p *proxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

package cri

// The listing transports' contract. ListPods reads its two unfiltered
// listings either from a connection of its own, decoding the bytes as they
// arrive (the direct path, the default), or through the client's grpc-go
// connection (WithDirectLists(false)). Whatever the runtime does, both give
// the same observable outcome:
//
//   - the same pods when the listing succeeds;
//   - else the same error class: the gRPC status code (status.Code), the
//     same ErrListTooLarge and context.DeadlineExceeded matches
//     (errors.Is), and a *CallError naming the same method;
//   - the same streaming decision afterwards (ListStreamingActive), from
//     the same calls made to the runtime;
//   - within a bounded time: a listing never outlives its context.
//
// The codes are grpc-go's client's: the direct path maps what it reads as
// grpc-go does. In particular: a connection that fails or is lost, at any
// point of a reply, is Unavailable (never Internal); a reply that is not
// gRPC is classed by its HTTP status as grpc-go classes it (Unknown for a
// 200); a message compressed with a compressor the process has registered
// (encoding.RegisterCompressor) is decompressed and listed, one compressed
// with any other is Internal; a message over the 16 MiB limit, before or
// after decompression, is ErrListTooLarge (ResourceExhausted). A GOAWAY
// lets the listings in flight finish, and the next listing after a GOAWAY
// or a runtime restart succeeds without a new client; a listing that races
// the runtime's closing of its connection (made before the client has read
// the connection's end) may fail Unavailable, on either transport, and the
// next succeeds. A connection lost makes the next listing probe the
// streaming RPCs again, on either transport. Neither transport sends
// keepalive pings, so a runtime's keepalive enforcement never ends their
// connections; its MaxConnectionIdle and MaxConnectionAge do.
//
// Each case runs against a real grpc-go server (grpc.NewServer serving a
// runtimeapi.RuntimeServiceServer on a unix socket) unless a grpc-go server
// cannot send what it stages: replies that are not gRPC, a stream reset
// mid-reply, a malformed grpc-status (served raw, by net/http or a bare
// listener).

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// confTransports are the two listing transports.
var confTransports = []struct {
	name string
	opts []Option
}{
	{"direct", nil},
	{"grpc", []Option{WithDirectLists(false)}},
}

// confBound bounds every listing of the table: its context's deadline,
// and how long past it the listing may take to return.
const confBound = 20 * time.Second

// outcome is what a caller of ListPods observes of one listing.
type outcome struct {
	Err       string // "" for success, else the error class (classOf)
	Method    string // the method the *CallError names
	Pods      string // the pods listed (podSummary)
	Streaming bool   // ListStreamingActive after the listing
	Calls     string // the calls the runtime got for this listing
}

func (o outcome) String() string {
	return fmt.Sprintf("{err=%q method=%q pods=%q streaming=%v calls=%q}", o.Err, o.Method, o.Pods, o.Streaming, o.Calls)
}

// classOf is err's class: its status code, and what errors.Is matches of
// ErrListTooLarge and context.DeadlineExceeded.
func classOf(err error) string {
	if err == nil {
		return ""
	}
	s := status.Code(err).String()
	if errors.Is(err, ErrListTooLarge) {
		s += "+ErrListTooLarge"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		s += "+context.DeadlineExceeded"
	}
	return s
}

// podSummary is the pods' UIDs and their items' IDs.
func podSummary(pods []*cruntime.Pod) string {
	var parts []string
	for _, p := range pods {
		var ids []string
		for _, c := range p.Sandboxes {
			ids = append(ids, c.ID)
		}
		for _, c := range p.Containers {
			ids = append(ids, c.ID)
		}
		parts = append(parts, string(p.UID)+"["+strings.Join(ids, " ")+"]")
	}
	return strings.Join(parts, " ")
}

// confPods is what listing a confCRI gives.
const confPods = "uid-a[sb-a c-a1 c-a2] uid-b[sb-b c-b1]"

// Calls a runtime without the streaming RPCs gets for one listing: the
// first streamed listing it turns down, and unary calls from then on.
const (
	callsUnaryFirst = "StreamPodSandboxes ListPodSandbox ListContainers"
	callsUnary      = "ListPodSandbox ListContainers"
	callsStreamed   = "StreamPodSandboxes StreamContainers"
)

// confCRI is a runtime service that lists two pods (node), and whose calls each
// case controls through before.
type confCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	// streaming serves StreamPodSandboxes and StreamContainers, one item a
	// message; else they are Unimplemented.
	streaming bool
	// bulk is the size of an annotation each container carries.
	bulk int
	// before, when set, runs before message msg (0 first) of the reply to
	// method: it may block, and an error ends the call with it.
	before func(ctx context.Context, method string, msg int) error

	mu         sync.Mutex
	calls      []string
	noDeadline []string // calls whose context had no deadline
}

func (f *confCRI) record(ctx context.Context, method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, method)
	if _, ok := ctx.Deadline(); !ok {
		f.noDeadline = append(f.noDeadline, method)
	}
}

// takeCalls returns the calls since the last takeCalls.
func (f *confCRI) takeCalls() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := strings.Join(f.calls, " ")
	f.calls = nil
	return s
}

func (f *confCRI) hook(ctx context.Context, method string, msg int) error {
	if f.before == nil {
		return nil
	}
	return f.before(ctx, method, msg)
}

func (f *confCRI) node() ([]*runtimeapi.PodSandbox, []*runtimeapi.Container) {
	sb := func(id, uid string) *runtimeapi.PodSandbox {
		return sandbox(id, uid, "pod-"+uid, "ns", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1)
	}
	ct := func(id, uid string) *runtimeapi.Container {
		c := container(id, id, 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 2, label(uid, "pod-"+uid, "ns", id))
		if f.bulk > 0 {
			c.Annotations = map[string]string{"bulk": strings.Repeat("x", f.bulk)}
		}
		return c
	}
	return []*runtimeapi.PodSandbox{sb("sb-a", "uid-a"), sb("sb-b", "uid-b")},
		[]*runtimeapi.Container{ct("c-a1", "uid-a"), ct("c-a2", "uid-a"), ct("c-b1", "uid-b")}
}

func (f *confCRI) ListPodSandbox(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.record(ctx, "ListPodSandbox")
	if err := f.hook(ctx, "ListPodSandbox", 0); err != nil {
		return nil, err
	}
	sbs, _ := f.node()
	return &runtimeapi.ListPodSandboxResponse{Items: sbs}, nil
}

func (f *confCRI) ListContainers(ctx context.Context, _ *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.record(ctx, "ListContainers")
	if err := f.hook(ctx, "ListContainers", 0); err != nil {
		return nil, err
	}
	_, cts := f.node()
	return &runtimeapi.ListContainersResponse{Containers: cts}, nil
}

func (f *confCRI) StreamPodSandboxes(r *runtimeapi.StreamPodSandboxesRequest, s grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	f.record(s.Context(), "StreamPodSandboxes")
	if !f.streaming {
		return f.UnimplementedRuntimeServiceServer.StreamPodSandboxes(r, s)
	}
	sbs, _ := f.node()
	return streamEach(f, s.Context(), "StreamPodSandboxes", sbs, func(sb *runtimeapi.PodSandbox) error {
		return s.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: []*runtimeapi.PodSandbox{sb}})
	})
}

func (f *confCRI) StreamContainers(r *runtimeapi.StreamContainersRequest, s grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	f.record(s.Context(), "StreamContainers")
	if !f.streaming {
		return f.UnimplementedRuntimeServiceServer.StreamContainers(r, s)
	}
	_, cts := f.node()
	return streamEach(f, s.Context(), "StreamContainers", cts, func(ct *runtimeapi.Container) error {
		return s.Send(&runtimeapi.StreamContainersResponse{Containers: []*runtimeapi.Container{ct}})
	})
}

// streamEach sends items one a batch, the case's hook before each.
func streamEach[T any](f *confCRI, ctx context.Context, method string, items []T, send func(T) error) error {
	for i, it := range items {
		if err := f.hook(ctx, method, i); err != nil {
			return err
		}
		if err := send(it); err != nil {
			return err
		}
	}
	return nil
}

// confListener is a runtime's listener that watches what the runtime
// writes on each connection, and can cut it.
type confListener struct {
	net.Listener
	// budget, when positive, is how many bytes the runtime may write on
	// a connection before the connection is closed in the middle of a
	// write.
	budget int

	mu     sync.Mutex
	conns  []*confConn
	goaway chan struct{} // closed at the first GOAWAY frame written on any connection
	pings  atomic.Int64  // PING frames the client sent, acks aside
	// clientFrames counts the frames the client sent.
	clientFrames atomic.Int64
}

func (l *confListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &confConn{Conn: c, l: l, budget: l.budget, closed: make(chan struct{})}
	l.mu.Lock()
	l.conns = append(l.conns, cc)
	l.mu.Unlock()
	return cc, nil
}

// accepted returns the connections accepted so far.
func (l *confListener) accepted() []*confConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.conns)
}

// kill closes the listener and every connection at once, as the end of a
// runtime's process does.
func (l *confListener) kill() {
	l.Listener.Close()
	for _, c := range l.accepted() {
		c.Close()
	}
}

// confConn is a connection of a confListener. It follows the HTTP/2
// frames on it, to see the runtime's GOAWAY frames and the client's pings.
type confConn struct {
	net.Conn
	l         *confListener
	budget    int
	closeOnce sync.Once
	closed    chan struct{}

	wmu     sync.Mutex
	written int
	out     frameWatcher // the runtime's frames

	rmu       sync.Mutex
	in        frameWatcher // the client's, after its preface
	inStarted bool
}

var errCut = errors.New("connection cut by the test")

func (c *confConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	cut := false
	if c.budget > 0 && c.written+len(p) > c.budget {
		p, cut = p[:c.budget-c.written], true
	}
	n, err := c.Conn.Write(p)
	c.written += n
	c.out.follow(p[:n], func(typ, _ byte) {
		if typ == 0x7 { // GOAWAY
			c.l.mu.Lock()
			select {
			case <-c.l.goaway:
			default:
				close(c.l.goaway)
			}
			c.l.mu.Unlock()
		}
	})
	if cut {
		c.Close()
		return n, errCut
	}
	return n, err
}

func (c *confConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if !c.inStarted {
		c.in.skip, c.inStarted = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), true
	}
	c.in.follow(p[:n], func(typ, flags byte) {
		c.l.clientFrames.Add(1)
		if typ == 0x6 && flags&0x1 == 0 { // PING, not an ack
			c.l.pings.Add(1)
		}
	})
	return n, err
}

// frameWatcher follows a stream of HTTP/2 frames, skip bytes in.
type frameWatcher struct {
	skip    int
	header  []byte // of the frame being read
	payload int    // bytes of the current frame's payload still to come
}

// follow follows the frames in b, the stream's next bytes, and calls
// frame with the type and flags of each frame header.
func (w *frameWatcher) follow(b []byte, frame func(typ, flags byte)) {
	for len(b) > 0 {
		if k := min(w.skip, len(b)); k > 0 {
			w.skip -= k
			b = b[k:]
			continue
		}
		if w.payload > 0 {
			k := min(w.payload, len(b))
			w.payload -= k
			b = b[k:]
			continue
		}
		k := min(9-len(w.header), len(b))
		w.header = append(w.header, b[:k]...)
		b = b[k:]
		if len(w.header) < 9 {
			return
		}
		h := w.header
		w.header = w.header[:0]
		w.payload = int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		frame(h[3], h[4])
	}
}

func (c *confConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// confEnv is one case run on one transport: a socket, the runtimes served
// on it in turn, and the clients of it.
type confEnv struct {
	t         *testing.T
	transport string
	sock      string
	opts      []Option
	fake      *confCRI // the calls of the last runtime started, when a confCRI
}

// confServer is a grpc-go server of a confCRI on the env's socket.
type confServer struct {
	srv    *grpc.Server
	lis    *confListener
	served chan struct{}
}

// serve starts a grpc-go server of f (or of no service when f is nil)
// with opts on the socket. budget, when positive, cuts each connection
// after that many bytes written.
func (e *confEnv) serve(f *confCRI, budget int, opts ...grpc.ServerOption) *confServer {
	e.t.Helper()
	l, err := net.Listen("unix", e.sock)
	if err != nil {
		e.t.Fatal(err)
	}
	s := &confServer{srv: grpc.NewServer(opts...), lis: &confListener{Listener: l, budget: budget, goaway: make(chan struct{})}, served: make(chan struct{})}
	if f != nil {
		runtimeapi.RegisterRuntimeServiceServer(s.srv, f)
		e.fake = f
	}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(s.lis)
	}()
	e.t.Cleanup(s.stop)
	return s
}

// stop stops the server and waits for it to end.
func (s *confServer) stop() {
	s.srv.Stop()
	<-s.served
}

// client dials the socket with the env's transport.
func (e *confEnv) client(opts ...Option) *Client {
	e.t.Helper()
	c, err := Dial("unix://"+e.sock, append([]Option{WithLogger(logr.Discard())}, append(opts, e.opts...)...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// list lists with c under confBound, or under ctx's deadline when
// sooner, and returns what the caller observes.
func (e *confEnv) list(ctx context.Context, c *Client) outcome {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, confBound)
	defer cancel()
	type result struct {
		pods []*cruntime.Pod
		err  error
	}
	done := make(chan result, 1)
	go func() {
		pods, err := c.ListPods(ctx)
		done <- result{pods, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * confBound):
		e.t.Fatalf("ListPods did not return within %v of its deadline", confBound)
	}
	o := outcome{Err: classOf(r.err), Pods: podSummary(r.pods), Streaming: c.ListStreamingActive()}
	if ce := (*CallError)(nil); errors.As(r.err, &ce) {
		o.Method = ce.Method
	} else if r.err != nil {
		e.t.Errorf("ListPods: %v, not a *CallError", r.err)
	}
	if e.fake != nil {
		o.Calls = e.fake.takeCalls()
	}
	return o
}

// confCase is one behaviour of a runtime, staged anew for each transport,
// and the outcomes of its listings.
type confCase struct {
	name string
	run  func(e *confEnv) []outcome
	want []outcome
}

func TestTransportConformance(t *testing.T) {
	for _, tc := range confCases() {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string][]outcome{}
			for _, tr := range confTransports {
				t.Run(tr.name, func(t *testing.T) {
					e := &confEnv{t: t, transport: tr.name, sock: filepath.Join(socketDir(t), "cri.sock"), opts: tr.opts}
					got[tr.name] = tc.run(e)
					if !slices.Equal(got[tr.name], tc.want) {
						t.Errorf("outcomes\n got %v\nwant %v", got[tr.name], tc.want)
					}
					if e.fake != nil {
						e.fake.mu.Lock()
						if len(e.fake.noDeadline) > 0 {
							t.Errorf("calls without a deadline at the runtime: %v", e.fake.noDeadline)
						}
						e.fake.mu.Unlock()
					}
				})
			}
			if d, g := got["direct"], got["grpc"]; d != nil && g != nil && !slices.Equal(d, g) {
				t.Errorf("the transports disagree:\ndirect %v\n  grpc %v", d, g)
			}
		})
	}
}

// okListing is a successful listing of a confCRI.
func okListing(streaming bool, calls string) outcome {
	return outcome{Pods: confPods, Streaming: streaming, Calls: calls}
}

// failedListing is a failed listing.
func failedListing(class, method string, streaming bool, calls string) outcome {
	return outcome{Err: class, Method: method, Streaming: streaming, Calls: calls}
}

func confCases() []confCase {
	bg := context.Background()
	return []confCase{
		{
			name: "unary",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{}, 0)
				c := e.client()
				return []outcome{e.list(bg, c), e.list(bg, c)}
			},
			// Unimplemented, trailers only, on the stream: unary from then on.
			want: []outcome{okListing(false, callsUnaryFirst), okListing(false, callsUnary)},
		},
		{
			name: "streamed",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{streaming: true}, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{okListing(true, callsStreamed)},
		},
		{
			// The runtime holds the call past the caller's deadline, which
			// it got as grpc-timeout.
			name: "deadline exceeded",
			run: func(e *confEnv) []outcome {
				ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
				defer cancel()
				clientDeadline, _ := ctx.Deadline()
				var serverDeadline atomic.Pointer[time.Time]
				e.serve(&confCRI{streaming: true, before: func(ctx context.Context, method string, msg int) error {
					if dl, ok := ctx.Deadline(); ok {
						serverDeadline.Store(&dl)
					}
					<-ctx.Done()
					return ctx.Err()
				}}, 0)
				o := e.list(ctx, e.client())
				// The runtime's deadline is the caller's, not the client's
				// 2-minute timeout: give its clock a second's slack.
				if dl := serverDeadline.Load(); dl == nil || dl.After(clientDeadline.Add(time.Second)) {
					e.t.Errorf("the runtime's deadline %v; want the caller's, %v", dl, clientDeadline)
				}
				return []outcome{o}
			},
			want: []outcome{failedListing("DeadlineExceeded+context.DeadlineExceeded", "StreamPodSandboxes", true, "StreamPodSandboxes")},
		},
		{
			// The connection is cut 64 KiB into the containers' 1.2 MiB
			// reply, in the middle of a write.
			name: "connection reset mid-message",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{bulk: 400 << 10}, 64<<10)
				c := e.client()
				o := e.list(bg, c)
				// The call can fail before the client has counted its
				// connection lost: look once it has.
				waitConnsEnded(e.t, c)
				o.Streaming = c.ListStreamingActive()
				return []outcome{o}
			},
			// The connection the stream was turned down on is gone: the
			// next listing probes it again.
			want: []outcome{failedListing("Unavailable", "ListContainers", true, callsUnaryFirst)},
		},
		{
			name: "trailers-only error, unary",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{before: func(context.Context, string, int) error {
					return status.Error(codes.Unavailable, "runtime not ready")
				}}, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unavailable", "ListPodSandbox", false, "StreamPodSandboxes ListPodSandbox")},
		},
		{
			// Not Unimplemented: no fallback, and the next listing
			// streams again.
			name: "trailers-only error, streamed",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{streaming: true, before: func(_ context.Context, method string, _ int) error {
					if method == "StreamContainers" {
						return status.Error(codes.Unavailable, "runtime not ready")
					}
					return nil
				}}, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unavailable", "StreamContainers", true, callsStreamed)},
		},
		{
			name: "oversize reply, unary",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{bulk: maxMsgSize / 2}, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("ResourceExhausted+ErrListTooLarge", "ListContainers", false, callsUnaryFirst)},
		},
		{
			name: "oversize reply, one batch streamed",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{streaming: true, bulk: maxMsgSize + 1}, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("ResourceExhausted+ErrListTooLarge", "StreamContainers", true, callsStreamed)},
		},
		{
			// A runtime that compresses whatever the client accepts (grpc-go's
			// legacy RPCCompressor), with gzip, which pleg does not register.
			name: "compressed reply, unregistered compressor",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{}, 0, grpc.RPCCompressor(grpc.NewGZIPCompressor()))
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Internal", "ListPodSandbox", false, "StreamPodSandboxes ListPodSandbox")},
		},
		{
			// The same with a compressor this test registers.
			name: "compressed reply, registered compressor",
			run: func(e *confEnv) []outcome {
				e.serve(&confCRI{streaming: true}, 0, grpc.RPCCompressor(testCompressor{}))
				c := e.client()
				return []outcome{e.list(bg, c), e.list(bg, c)}
			},
			want: []outcome{okListing(true, callsStreamed), okListing(true, callsStreamed)},
		},
		{
			// A runtime that compresses only for clients that accept it
			// (grpc.SetSendCompressor): the direct path asks for none.
			name: "compressed reply, when accepted",
			run: func(e *confEnv) []outcome {
				var compressed, plain atomic.Int32
				e.serve(&confCRI{streaming: true, before: func(ctx context.Context, _ string, msg int) error {
					if msg == 0 {
						if grpc.SetSendCompressor(ctx, testCompressorName) == nil {
							compressed.Add(1)
						} else {
							plain.Add(1) // not accepted
						}
					}
					return nil
				}}, 0)
				o := e.list(bg, e.client())
				// grpc-go accepts what the process registered; the direct
				// path, nothing.
				if want := map[string]int32{"grpc": 2, "direct": 0}[e.transport]; compressed.Load() != want || plain.Load() != 2-want {
					e.t.Errorf("%d replies compressed, %d not; want %d compressed", compressed.Load(), plain.Load(), want)
				}
				return []outcome{o}
			},
			want: []outcome{okListing(true, callsStreamed)},
		},
		{
			// A grpc-go server cannot answer with HTTP/1.1.
			name: "not gRPC, HTTP/1.1",
			run: func(e *confEnv) []outcome {
				serveHTTP1(e.t, e.sock)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unavailable", "StreamPodSandboxes", true, "")},
		},
		{
			// Nor with garbage.
			name: "not gRPC, garbage",
			run: func(e *confEnv) []outcome {
				serveGarbage(e.t, e.sock)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unavailable", "StreamPodSandboxes", true, "")},
		},
		{
			// Nor with HTTP/2 that is not gRPC.
			name: "not gRPC, HTTP/2 200 text/html",
			run: func(e *confEnv) []outcome {
				serveH2C(e.t, e.sock, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/html")
					w.Write([]byte("<html>"))
				})
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unknown", "StreamPodSandboxes", true, "")},
		},
		{
			name: "not gRPC, HTTP/2 404",
			run: func(e *confEnv) []outcome {
				serveH2C(e.t, e.sock, http.NotFound)
				return []outcome{e.list(bg, e.client())}
			},
			// 404 is Unimplemented: the stream's too, so the fallback.
			want: []outcome{failedListing("Unimplemented", "ListPodSandbox", false, "")},
		},
		{
			// A grpc-go server resets a stream only for protocol errors of
			// the client's.
			name: "stream reset mid-reply (RST_STREAM INTERNAL_ERROR)",
			run: func(e *confEnv) []outcome {
				serveH2C(e.t, e.sock, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/grpc")
					m, err := proto.Marshal(&runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "sb-a"}}})
					if err != nil {
						panic(err)
					}
					w.Write(append([]byte{0, 0, 0, 0, byte(len(m))}, m[:len(m)/2]...)) // half a message

					w.(http.Flusher).Flush()
					panic(http.ErrAbortHandler) // resets the stream with INTERNAL_ERROR
				})
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Internal", "StreamPodSandboxes", true, "")},
		},
		{
			// A grpc-go server always sends a valid grpc-status.
			name: "malformed grpc-status",
			run: func(e *confEnv) []outcome {
				serveH2C(e.t, e.sock, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/grpc")
					w.Header().Set(http.TrailerPrefix+"Grpc-Status", "zero")
				})
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unknown", "StreamPodSandboxes", true, "")},
		},
		{
			name: "unknown service",
			run: func(e *confEnv) []outcome {
				e.serve(nil, 0)
				return []outcome{e.list(bg, e.client())}
			},
			want: []outcome{failedListing("Unimplemented", "ListPodSandbox", false, "")},
		},
		{
			// GracefulStop while the containers are streamed: the GOAWAY
			// is written between two batches, and the listing finishes.
			name: "GOAWAY mid-stream, GracefulStop",
			run: func(e *confEnv) []outcome {
				mid, release := make(chan struct{}), make(chan struct{})
				s := e.serve(&confCRI{streaming: true, before: func(ctx context.Context, method string, msg int) error {
					if method == "StreamContainers" && msg == 1 {
						close(mid)
						<-release
					}
					return nil
				}}, 0)
				c := e.client()
				res := make(chan outcome, 1)
				go func() { res <- e.list(bg, c) }()
				<-mid
				stopped := make(chan struct{})
				go func() {
					s.srv.GracefulStop()
					close(stopped)
				}()
				<-s.lis.goaway
				close(release)
				o := <-res
				<-stopped
				return []outcome{o}
			},
			want: []outcome{okListing(true, callsStreamed)},
		},
		{
			name: "GOAWAY mid-stream, Stop",
			run: func(e *confEnv) []outcome {
				mid := make(chan struct{})
				s := e.serve(&confCRI{streaming: true, before: func(ctx context.Context, method string, msg int) error {
					if method == "StreamContainers" && msg == 1 {
						close(mid)
						<-ctx.Done()
						return ctx.Err()
					}
					return nil
				}}, 0)
				c := e.client()
				res := make(chan outcome, 1)
				go func() { res <- e.list(bg, c) }()
				<-mid
				s.stop()
				return []outcome{<-res}
			},
			want: []outcome{failedListing("Unavailable", "StreamContainers", true, callsStreamed)},
		},
		{
			// The runtime's process ends while a batch is being sent: its
			// listener and connections close at once, without a GOAWAY.
			name: "runtime killed mid-reply",
			run: func(e *confEnv) []outcome {
				mid := make(chan struct{})
				s := e.serve(&confCRI{streaming: true, before: func(ctx context.Context, method string, msg int) error {
					if method == "StreamContainers" && msg == 1 {
						close(mid)
						<-ctx.Done()
						return ctx.Err()
					}
					return nil
				}}, 0)
				c := e.client()
				res := make(chan outcome, 1)
				go func() { res <- e.list(bg, c) }()
				<-mid
				s.lis.kill()
				return []outcome{<-res}
			},
			want: []outcome{failedListing("Unavailable", "StreamContainers", true, callsStreamed)},
		},
		{
			// The runtime restarts; the client sees its connection end
			// before it lists again.
			name: "restart between listings",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0)
				c := e.client()
				first := e.list(bg, c)
				s.stop()
				waitConnsEnded(e.t, c)
				// The restarted runtime has no streaming lists: probed again.
				s2 := e.serve(&confCRI{}, 0)
				second := e.list(bg, c)
				if n := len(s2.lis.accepted()); n != 1 {
					e.t.Errorf("the restarted runtime accepted %d connections, want 1", n)
				}
				return []outcome{first, second}
			},
			want: []outcome{okListing(true, callsStreamed), okListing(false, callsUnaryFirst)},
		},
		{
			// The same, listing at once: the listing may go out on the
			// connection the runtime just closed, before the client has
			// read its end, and fail (Unavailable) on either transport;
			// the next one succeeds.
			name: "restart between listings, at once",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0)
				c := e.client()
				first := e.list(bg, c)
				s.stop()
				e.serve(&confCRI{streaming: true}, 0)
				second := e.list(bg, c)
				if second.Err != "" {
					if second.Err != "Unavailable" {
						e.t.Errorf("the listing at once: %v, want success or Unavailable", second)
					}
					second = e.list(bg, c)
				}
				return []outcome{first, second}
			},
			want: []outcome{okListing(true, callsStreamed), okListing(true, callsStreamed)},
		},
		{
			// A listing while the runtime is down fails; once it is back a
			// listing succeeds within the reconnect backoff (a second at
			// most): polled.
			name: "restart, listing while down",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0)
				c := e.client()
				first := e.list(bg, c)
				s.stop()
				down := e.list(bg, c)
				e.serve(&confCRI{streaming: true}, 0)
				deadline := time.Now().Add(confBound)
				var up outcome
				for {
					up = e.list(bg, c)
					if up.Err == "" || time.Now().After(deadline) {
						break
					}
					time.Sleep(10 * time.Millisecond) // pace the polling
				}
				return []outcome{first, down, up}
			},
			want: []outcome{okListing(true, callsStreamed), failedListing("Unavailable", "StreamPodSandboxes", true, ""), okListing(true, callsStreamed)},
		},
		{
			// Two listings at once on a runtime that serves one stream a
			// connection at a time: the second starts while the first's
			// call is held.
			name: "MaxConcurrentStreams 1",
			run: func(e *confEnv) []outcome {
				held, secondStarted := make(chan struct{}), make(chan struct{})
				var once sync.Once
				e.serve(&confCRI{streaming: true, before: func(ctx context.Context, method string, msg int) error {
					first := false
					once.Do(func() { first = true })
					if first {
						close(held)
						select {
						case <-secondStarted:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					return nil
				}}, 0, grpc.MaxConcurrentStreams(1))
				c := e.client()
				res := make(chan outcome, 2)
				go func() { res <- e.list(bg, c) }()
				<-held
				tracer := &startTracer{started: secondStarted}
				go func() { res <- e.list(cruntime.WithCallTracer(bg, tracer), c) }()
				a, b := <-res, <-res
				a.Calls, b.Calls = "", "" // interleaved
				return []outcome{a, b}
			},
			want: []outcome{okListing(true, ""), okListing(true, "")},
		},
		{
			// The runtime ends an idle connection with a GOAWAY between
			// two listings; the next listing makes a new one.
			name: "keepalive MaxConnectionIdle",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 50 * time.Millisecond}))
				return goAwayBetween(e, s)
			},
			want: []outcome{okListing(true, callsStreamed), okListing(true, callsStreamed)},
		},
		{
			// A runtime that ends a connection whose client pings more
			// often than once an hour, or without a call in flight: the
			// clients never ping.
			name: "keepalive enforcement policy",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Hour}))
				c := e.client()
				out := []outcome{e.list(bg, c), e.list(bg, c)}
				if n, all := s.lis.pings.Load(), s.lis.clientFrames.Load(); n != 0 || all == 0 {
					e.t.Errorf("the client sent %d pings in %d frames, want none in some", n, all)
				}
				select {
				case <-s.lis.goaway:
					e.t.Error("the runtime sent a GOAWAY")
				default:
				}
				if n := len(s.lis.accepted()); n != 1 {
					e.t.Errorf("%d connections, want 1", n)
				}
				return out
			},
			want: []outcome{okListing(true, callsStreamed), okListing(true, callsStreamed)},
		},
		{
			name: "keepalive MaxConnectionAge",
			run: func(e *confEnv) []outcome {
				s := e.serve(&confCRI{streaming: true}, 0, grpc.KeepaliveParams(keepalive.ServerParameters{
					MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: confBound}))
				return goAwayBetween(e, s)
			},
			want: []outcome{okListing(true, callsStreamed), okListing(true, callsStreamed)},
		},
	}
}

// goAwayBetween lists, waits for the runtime to have sent a GOAWAY on the
// connection and closed it, and lists again.
func goAwayBetween(e *confEnv, s *confServer) []outcome {
	c := e.client()
	first := e.list(context.Background(), c)
	<-s.lis.goaway
	conns := s.lis.accepted()
	if len(conns) == 0 {
		e.t.Fatal("no connection")
	}
	for _, cc := range conns {
		select {
		case <-cc.closed:
		case <-time.After(confBound):
			e.t.Fatal("the runtime kept its connection after its GOAWAY")
		}
	}
	second := e.list(context.Background(), c)
	if n := len(s.lis.accepted()); n <= len(conns) {
		e.t.Errorf("%d connections after the GOAWAY, want a new one", n)
	}
	return []outcome{first, second}
}

// waitConnsEnded waits until every connection c made has ended, as c saw
// it.
func waitConnsEnded(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(confBound)
	for c.conns.Load()%2 != 0 { // made and ended: two moves each
		if time.Now().After(deadline) {
			t.Fatalf("the client did not see its connection end within %v", confBound)
		}
		time.Sleep(time.Millisecond) // pace the polling
	}
}

// startTracer closes started when the first call it traces starts.
type startTracer struct {
	once    sync.Once
	started chan struct{}
}

func (s *startTracer) StartCall(string, string) func(time.Duration, error) {
	s.once.Do(func() { close(s.started) })
	return func(time.Duration, error) {}
}

// serveHTTP1 serves HTTP/1.1 only on the socket.
func serveHTTP1(t *testing.T, sock string) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// serveGarbage answers every connection with bytes that are no protocol,
// and closes it.
func serveGarbage(t *testing.T, sock string) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write(bytes.Repeat([]byte("garbage\n"), 64))
			c.Close()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
}

// serveH2C serves h, HTTP/2 without TLS, on the socket.
func serveH2C(t *testing.T, sock string, h http.HandlerFunc) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &protocols}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// testCompressorName is a gzip compressor this test registers, as a
// program that imports a compressor package would.
const testCompressorName = "x-pleg-test-gzip"

func init() { encoding.RegisterCompressor(testCompressor{}) }

// testCompressor is gzip under testCompressorName: an encoding.Compressor
// for the clients, and a grpc.Compressor for a server that compresses
// every reply (grpc.RPCCompressor).
type testCompressor struct{}

func (testCompressor) Name() string { return testCompressorName }
func (testCompressor) Type() string { return testCompressorName }

func (testCompressor) Compress(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil }

func (testCompressor) Decompress(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }

func (testCompressor) Do(w io.Writer, p []byte) error {
	z := gzip.NewWriter(w)
	if _, err := z.Write(p); err != nil {
		return err
	}
	return z.Close()
}

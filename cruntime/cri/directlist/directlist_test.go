package directlist

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/internal/leakcheck"
)

// TestMain fails the run when a lister's goroutines outlive the tests:
// every test must close its listers.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 30*time.Second, "pleg/cruntime/cri/directlist.")
}

// testMaxMsgSize is the message limit of the listers of these tests, the
// CRI client's.
const testMaxMsgSize = 16 << 20

// socketDir returns a directory for a unix socket, short enough for the
// 108-byte limit on socket paths.
func socketDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) < 80 {
		return dir
	}
	dir, err := os.MkdirTemp("", "directlist")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// rawRuntime serves HTTP/2 without TLS on a unix socket with a handler
// that writes gRPC's framing by hand: replies a gRPC server would not
// send, to see what the lister makes of them.
func rawRuntime(t *testing.T, maxMsgSize int, h http.HandlerFunc) *Lister {
	t.Helper()
	l := New(serveRaw(t, &http.Server{Handler: h}), maxMsgSize, nil)
	t.Cleanup(l.Close)
	return l
}

// serveRaw serves srv, HTTP/2 without TLS, on a unix socket of t's, and
// returns the socket's path.
func serveRaw(t *testing.T, srv *http.Server) string {
	t.Helper()
	sock := filepath.Join(socketDir(t), "raw.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv.Protocols = &protocols
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// grpcMessage is m with gRPC's 5-byte prefix.
func grpcMessage(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := requestBody(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func containersReply(ids ...string) *runtimeapi.ListContainersResponse {
	r := &runtimeapi.ListContainersResponse{}
	for _, id := range ids {
		r.Containers = append(r.Containers, &runtimeapi.Container{Id: id, PodSandboxId: "sb"})
	}
	return r
}

// list lists containers from l, streamed or not, decoding each message
// whole with the generated code.
func list(ctx context.Context, l *Lister, streamed bool) (int, []string, error) {
	method, req := runtimeapi.RuntimeService_ListContainers_FullMethodName, proto.Message(&runtimeapi.ListContainersRequest{})
	if streamed {
		method, req = runtimeapi.RuntimeService_StreamContainers_FullMethodName, &runtimeapi.StreamContainersRequest{}
	}
	var ids []string
	var scratch []byte
	n, err := l.Call(ctx, method, req, !streamed, func(m *Message) error {
		b, ok := m.Bytes(m.Left(), &scratch)
		if !ok {
			return io.ErrUnexpectedEOF
		}
		var r runtimeapi.ListContainersResponse // StreamContainersResponse's fields too
		if err := proto.Unmarshal(b, &r); err != nil {
			return err
		}
		for _, c := range r.Containers {
			ids = append(ids, c.Id)
		}
		return nil
	})
	return n, ids, err
}

// The request a runtime gets: gRPC's, as grpc-go's server reads it.
func TestRequest(t *testing.T) {
	var got http.Header
	var path string
	var body []byte
	l := rawRuntime(t, testMaxMsgSize, func(w http.ResponseWriter, r *http.Request) {
		got, path = r.Header.Clone(), r.URL.Path
		body = make([]byte, 64)
		n, _ := r.Body.Read(body)
		body = body[:n]
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		w.Write(grpcMessage(t, containersReply("a")))
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, ids, err := list(ctx, l, false); err != nil || !reflect.DeepEqual(ids, []string{"a"}) {
		t.Fatalf("list: %v, %v; want [a]", ids, err)
	}
	if path != runtimeapi.RuntimeService_ListContainers_FullMethodName {
		t.Errorf("path %q", path)
	}
	if ct := got.Get("Content-Type"); ct != "application/grpc" {
		t.Errorf("content-type %q, want exactly application/grpc (CRI-O's cmux)", ct)
	}
	if te := got.Get("Te"); te != "trailers" {
		t.Errorf("te %q", te)
	}
	if ae := got.Get("Grpc-Accept-Encoding"); ae != "" {
		t.Errorf("grpc-accept-encoding %q, want none: no compression", ae)
	}
	if to := got.Get("Grpc-Timeout"); !regexp.MustCompile(`^(5[0-9]{7}|60000000)u$`).MatchString(to) {
		t.Errorf("grpc-timeout %q, want the context's deadline, a minute at most away", to)
	}
	if len(body) != 5 || body[0] != 0 || binary.BigEndian.Uint32(body[1:]) != 0 {
		t.Errorf("body % x, want one empty uncompressed message", body)
	}
}

// testCompressorName is a gzip compressor this test registers.
const testCompressorName = "x-directlist-test-gzip"

func init() { encoding.RegisterCompressor(testCompressor{}) }

type testCompressor struct{}

func (testCompressor) Name() string                                 { return testCompressorName }
func (testCompressor) Compress(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil }
func (testCompressor) Decompress(r io.Reader) (io.Reader, error)    { return gzip.NewReader(r) }

// compressed is m compressed with testCompressor, as one gRPC message.
func compressed(t *testing.T, m []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	b.Write(make([]byte, 5))
	z := gzip.NewWriter(&b)
	z.Write(m)
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	out := b.Bytes()
	out[0] = 1
	binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
	return out
}

// Each reply a runtime might send, or a broken one might, gives the
// status gRPC's own client gives, and never a listing that is short.
func TestReplies(t *testing.T) {
	ok := func(w http.ResponseWriter, msgs ...[]byte) {
		w.Header().Set("Content-Type", "application/grpc")
		for _, m := range msgs {
			w.Write(m)
		}
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	}
	two := func(t *testing.T) [][]byte {
		return [][]byte{grpcMessage(t, containersReply("a", "b")), grpcMessage(t, containersReply("c"))}
	}
	for _, tc := range []struct {
		name     string
		streamed bool
		max      int // the message limit, when not testMaxMsgSize
		reply    func(t *testing.T, w http.ResponseWriter)
		code     codes.Code
		msg      string // in the error
		ids      []string
	}{
		{name: "unary", reply: func(t *testing.T, w http.ResponseWriter) { ok(w, two(t)[0]) }, ids: []string{"a", "b"}},
		{name: "streamed", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) { ok(w, two(t)...) }, ids: []string{"a", "b", "c"}},
		{name: "streamed, no batch", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) { ok(w) }},
		{name: "unary, two messages", reply: func(t *testing.T, w http.ResponseWriter) { ok(w, two(t)...) }, code: codes.Internal, msg: "more than one message"},
		{name: "unary, no message", reply: func(t *testing.T, w http.ResponseWriter) { ok(w) }, code: codes.Internal, msg: errNoMessage.Error()},
		{name: "trailers only", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "12")
			w.Header().Set("Grpc-Message", "unknown method StreamContainers")
			w.WriteHeader(http.StatusOK)
		}, code: codes.Unimplemented, msg: "unknown method StreamContainers"},
		{name: "trailers only, OK, streamed", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "0")
			w.WriteHeader(http.StatusOK)
		}},
		{name: "trailers only, OK, unary", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "0")
			w.WriteHeader(http.StatusOK)
		}, code: codes.Internal, msg: errNoMessage.Error()},
		{name: "status after a batch", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write(two(t)[0])
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "8")
			w.Header().Set(http.TrailerPrefix+"Grpc-Message", "trying to send message larger than max (17000000 vs. 16777216)%20%E2%9C%93")
		}, code: codes.ResourceExhausted, msg: "larger than max (17000000 vs. 16777216) ✓"},
		{name: "no status", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write(two(t)[0])
		}, code: codes.Internal, msg: "without a gRPC status"},
		{name: "malformed status", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write(two(t)[0])
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "zero")
		}, code: codes.Unknown, msg: "malformed grpc-status"},
		{name: "over the message limit", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte{0, 0x01, 0, 0, 1}) // 16 MiB + 1, and nothing after: not read
		}, code: codes.ResourceExhausted, msg: "larger than max (16777217 vs. 16777216)"},
		{name: "compressed, no encoding", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			m := two(t)[0]
			m[0] = 1
			w.Write(m)
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "compressed message without its encoding"},
		{name: "compressed, unknown encoding", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Encoding", "snappy")
			w.Write(compressed(t, two(t)[0][5:]))
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: `compressed with "snappy"`},
		{name: "compressed, registered encoding", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Encoding", testCompressorName)
			m := two(t)
			w.Write(compressed(t, m[0][5:]))
			w.Write(m[1]) // uncompressed: each message says
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, ids: []string{"a", "b", "c"}},
		{name: "compressed, over the limit once decompressed", max: 1 << 10, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Encoding", testCompressorName)
			big := &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: strings.Repeat("x", 4<<10)}}}
			w.Write(compressed(t, grpcMessage(t, big)[5:]))
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.ResourceExhausted, msg: "after decompression larger than max 1024"},
		{name: "unknown payload format", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			m := two(t)[0]
			m[0] = 2
			w.Write(m)
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "unknown payload format 2"},
		{name: "cut inside a message", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			m := two(t)[0]
			w.Write(m[:len(m)-3])
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "ended inside a message"},
		{name: "cut inside a prefix", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte{0, 0})
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "ended inside a message"},
		{name: "malformed message", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte{0, 0, 0, 0, 2, 0x0a, 0x05}) // an item 5 bytes long in a message of 2
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "decoding message 1 of the reply"},
		{name: "reset mid-reply", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			m := two(t)[0]
			w.Write(m[:len(m)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // RST_STREAM INTERNAL_ERROR
		}, code: codes.Internal, msg: "RST_STREAM with error code 2"},
		{name: "not gRPC", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>"))
		}, code: codes.Unknown, msg: `content type "text/html"`},
		{name: "HTTP 404", reply: func(t *testing.T, w http.ResponseWriter) { http.NotFound(w, nil) }, code: codes.Unimplemented, msg: "HTTP status 404"},
		{name: "HTTP 503", reply: func(t *testing.T, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }, code: codes.Unavailable, msg: "HTTP status 503"},
		{name: "HTTP 503, gRPC", reply: func(t *testing.T, w http.ResponseWriter) {
			// A gRPC reply is read whatever its HTTP status.
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "9")
			w.WriteHeader(http.StatusServiceUnavailable)
		}, code: codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = testMaxMsgSize
			}
			l := rawRuntime(t, max, func(w http.ResponseWriter, r *http.Request) { tc.reply(t, w) })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, ids, err := list(ctx, l, tc.streamed)
			if status.Code(err) != tc.code || (tc.msg != "" && !strings.Contains(err.Error(), tc.msg)) {
				t.Fatalf("error %v; want %v with %q", err, tc.code, tc.msg)
			}
			if err == nil && !reflect.DeepEqual(ids, tc.ids) {
				t.Fatalf("items %v, want %v", ids, tc.ids)
			}
		})
	}
}

// A runtime that stops sending in the middle of a listing: the call ends
// at its context's deadline, DeadlineExceeded, and the handler sees its
// request canceled (the stream reset, so the runtime stops too).
func TestStalledReply(t *testing.T) {
	gone := make(chan struct{})
	l := rawRuntime(t, testMaxMsgSize, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		m := grpcMessage(t, containersReply("a", "b"))
		w.Write(m[:8])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := list(ctx, l, false)
	if status.Code(err) != codes.DeadlineExceeded || ctx.Err() == nil {
		t.Fatalf("error %v (context %v); want DeadlineExceeded at the context's deadline", err, ctx.Err())
	}
	<-gone // the runtime's handler saw the stream end; a leak would hang here until the test's timeout
}

func TestEncodeTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:               "1n",
		1500 * time.Nanosecond:     "1500n",
		2 * time.Minute:            "120000m",
		time.Hour:                  "3600000m",
		30 * 24 * time.Hour:        "2592000S",
		200 * 24 * 365 * time.Hour: "1752000H",
	} {
		if got := encodeTimeout(d); got != want {
			t.Errorf("encodeTimeout(%v) = %q, want %q", d, got, want)
		}
	}
}

// Closing the lister ends a call in flight (Canceled) and closes its
// connection once the call has ended; later calls fail at once.
func TestCloseEndsCalls(t *testing.T) {
	closed := make(chan struct{}, 4)
	entered := make(chan struct{})
	sock := serveRaw(t, &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/grpc")
			w.(http.Flusher).Flush()
			close(entered)
			<-r.Context().Done()
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closed <- struct{}{}
			}
		},
	})
	l := New(sock, testMaxMsgSize, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, _, err := list(ctx, l, true)
		errc <- err
	}()
	<-entered
	l.Close()
	if err := <-errc; status.Code(err) != codes.Canceled || ctx.Err() != nil {
		t.Fatalf("the call in flight: %v; want Canceled by the close, before its deadline", err)
	}
	<-closed // the connection; a lister that kept it would hang here until the test's timeout
	if _, _, err := list(ctx, l, true); status.Code(err) != codes.Canceled {
		t.Errorf("a call after the close: %v, want Canceled", err)
	}
}

// A connection counts as made once read, and as lost once closed then; one
// closed unread (net/http drops one now and then) does not count at all.
func TestConnCount(t *testing.T) {
	var conns atomic.Uint64
	l := &Lister{live: map[*countedConn]struct{}{}}
	conn := func() *countedConn {
		a, b := net.Pipe()
		t.Cleanup(func() { b.Close() })
		go b.Write([]byte("xy"))
		return &countedConn{Conn: a, r: bufio.NewReader(a), conns: &conns, owner: l}
	}

	unread := conn()
	unread.Close()
	unread.Close()
	if n := conns.Load(); n != 0 {
		t.Errorf("a connection closed unread: conns %d, want 0", n)
	}

	read := conn()
	if _, err := read.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	read.Read(make([]byte, 1)) // the second read counts nothing
	if n := conns.Load(); n != 1 {
		t.Errorf("a connection read: conns %d, want 1", n)
	}
	read.Close()
	read.Close()
	if n := conns.Load(); n != 2 {
		t.Errorf("a connection read and closed: conns %d, want 2", n)
	}
}

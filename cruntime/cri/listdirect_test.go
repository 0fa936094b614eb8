package cri

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// rawRuntime serves HTTP/2 without TLS on a unix socket with a handler
// that writes gRPC's framing by hand: replies a gRPC server would not
// send, to see what the direct listings make of them.
func rawRuntime(t *testing.T, h http.HandlerFunc) *directLister {
	t.Helper()
	d := newDirectLister(serveRaw(t, &http.Server{Handler: h}), &atomic.Uint64{})
	t.Cleanup(d.close)
	return d
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
		r.Containers = append(r.Containers, &runtimeapi.Container{
			Id: id, PodSandboxId: "sb", Metadata: &runtimeapi.ContainerMetadata{Name: "c-" + id},
			State:  runtimeapi.ContainerState_CONTAINER_RUNNING,
			Labels: label("uid-1", "pod", "ns", "c-"+id),
		})
	}
	return r
}

// directList lists containers from d as ListPods does, streamed or not.
func directList(ctx context.Context, d *directLister, streamed bool) (int, []string, error) {
	r := listReply{strings: (&interner{}).begin()}
	method, req := listContainersCall.unary, listContainersCall.req
	if streamed {
		method, req = listContainersCall.streamed, listContainersCall.streamReq
	}
	n, err := d.call(ctx, method, req, !streamed, r.decode)
	var ids []string
	for _, it := range r.items {
		ids = append(ids, it.ID)
	}
	return n, ids, err
}

// The request a runtime gets: gRPC's, as grpc-go's server reads it.
func TestDirectRequest(t *testing.T) {
	var got http.Header
	var path string
	var body []byte
	d := rawRuntime(t, func(w http.ResponseWriter, r *http.Request) {
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
	if _, ids, err := directList(ctx, d, false); err != nil || !reflect.DeepEqual(ids, []string{"a"}) {
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
	if to := got.Get("Grpc-Timeout"); !regexp.MustCompile(`^(5[0-9]{7}|60000000)u$`).MatchString(to) {
		t.Errorf("grpc-timeout %q, want the context's deadline, a minute at most away", to)
	}
	if len(body) != 5 || body[0] != 0 || binary.BigEndian.Uint32(body[1:]) != 0 {
		t.Errorf("body % x, want one empty uncompressed message", body)
	}
}

// Each reply a runtime might send, or a broken one might, gives the
// status gRPC's own client gives, and never a listing that is short.
func TestDirectReplies(t *testing.T) {
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
		}, code: codes.Internal, msg: "malformed grpc-status"},
		{name: "over the message limit", streamed: true, reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte{0, 0x01, 0, 0, 1}) // 16 MiB + 1, and nothing after: not read
		}, code: codes.ResourceExhausted, msg: "larger than max (16777217 vs. 16777216)"},
		{name: "compressed", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			m := two(t)[0]
			m[0] = 1
			w.Write(m)
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "compressed"},
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
		{name: "malformed item", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.Write([]byte{0, 0, 0, 0, 2, 0x0a, 0x05}) // an item 5 bytes long in a message of 2
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}, code: codes.Internal, msg: "malformed"},
		{name: "not gRPC", reply: func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>"))
		}, code: codes.Internal, msg: `content type "text/html"`},
		{name: "HTTP 404", reply: func(t *testing.T, w http.ResponseWriter) { http.NotFound(w, nil) }, code: codes.Unimplemented, msg: "HTTP status 404"},
		{name: "HTTP 503", reply: func(t *testing.T, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }, code: codes.Unavailable, msg: "HTTP status 503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rawRuntime(t, func(w http.ResponseWriter, r *http.Request) { tc.reply(t, w) })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, ids, err := directList(ctx, d, tc.streamed)
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
func TestDirectStalledReply(t *testing.T) {
	gone := make(chan struct{})
	d := rawRuntime(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		m := grpcMessage(t, containersReply("a", "b"))
		w.Write(m[:8])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := directList(ctx, d, false)
	if status.Code(err) != codes.DeadlineExceeded || ctx.Err() == nil {
		t.Fatalf("error %v (context %v); want DeadlineExceeded at the context's deadline", err, ctx.Err())
	}
	<-gone // the runtime's handler saw the stream end; a leak would hang here until the test's timeout
}

// No runtime at the socket: Unavailable, and the CallError names why.
func TestDirectNoRuntime(t *testing.T) {
	sock := filepath.Join(socketDir(t), "none.sock")
	c, err := Dial("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.ListPods(ctx)
	var ce *CallError
	if status.Code(err) != codes.Unavailable || !errors.As(err, &ce) || ce.Unreachable == nil {
		t.Fatalf("error %v; want Unavailable with the socket's dial error", err)
	}
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

// Closing the client ends a listing in flight (Canceled) and closes its
// connection once the call has ended; later listings fail at once.
func TestDirectCloseEndsCalls(t *testing.T) {
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
	d := newDirectLister(sock, &atomic.Uint64{})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, _, err := directList(ctx, d, true)
		errc <- err
	}()
	<-entered
	d.close()
	if err := <-errc; status.Code(err) != codes.Canceled || ctx.Err() != nil {
		t.Fatalf("the call in flight: %v; want Canceled by the close, before its deadline", err)
	}
	<-closed // the connection; a lister that kept it would hang here until the test's timeout
	if _, _, err := directList(ctx, d, true); status.Code(err) != codes.Canceled {
		t.Errorf("a call after the close: %v, want Canceled", err)
	}
}

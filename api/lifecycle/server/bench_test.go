package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// BenchmarkWatchFanout: 100 watchers, each on its own connection over a
// unix socket, receive every event (a pod of a sandbox and three
// containers); one op is one event delivered to all of them. It reports
// the process's CPU per event per watcher: pleg's side and the clients'
// transport (they count frames without decoding them).
//
//	go test ./api/lifecycle/server -run XXX -bench WatchFanout -benchtime 2000x -count 3
//
// shared: each event is encoded once for every watcher (as served);
// per-watcher: each watch encodes it itself (the baseline).
func BenchmarkWatchFanout(b *testing.B) {
	for _, perWatcher := range []bool{false, true} {
		name := "shared"
		if perWatcher {
			name = "per-watcher"
		}
		b.Run(name, func(b *testing.B) { benchmarkFanout(b, perWatcher) })
	}
}

func benchmarkFanout(b *testing.B, perWatcher bool) {
	const watchers = 100
	j := journal.New(journal.Options{Epoch: "bench", Size: 1 << 16, BookmarkInterval: time.Hour})
	srv, err := New(Config{Journal: j})
	if err != nil {
		b.Fatal(err)
	}
	srv.perWatcherEncoding = perWatcher
	sock, stop := serveBench(b, srv)
	defer stop()

	received := make(chan int, watchers)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	for range watchers {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		// The clients count frames without decoding them: the CPU
		// measured is pleg's side (and the transport's).
		s, err := conn.NewStream(wctx, &lifecyclev1.Lifecycle_ServiceDesc.Streams[0], lifecyclev1.Lifecycle_Watch_FullMethodName,
			grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.SendMsg(&lifecyclev1.WatchRequest{}); err != nil {
			b.Fatal(err)
		}
		_ = s.CloseSend()
		var f rawFrame
		if err := s.RecvMsg(&f); err != nil { // snapshot_end
			b.Fatal(err)
		}
		go func() {
			n := 0
			for {
				var f rawFrame
				if err := s.RecvMsg(&f); err != nil {
					return
				}
				if n++; n == b.N {
					received <- n
				}
			}
		}()
	}
	testkit.MeasureFanOut(b, j, watchers, received, "cpu-ns/event/watcher")
}

// rawFrame is a message the benchmark's clients do not decode.
type rawFrame struct{ n int }

// rawCodec marshals requests as protobuf and only measures responses.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawFrame).n = data.Len()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// serveBench serves srv on a unix socket in a temporary directory, and
// returns the socket's path and what stops the server (reporting an error
// of Serve).
func serveBench(b *testing.B, srv *Server) (sock string, stop func()) {
	b.Helper()
	sock = filepath.Join(b.TempDir(), "pleg.sock")
	ln, err := ListenUnix(sock, 0o600, -1)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	return sock, func() {
		cancel()
		if err := <-served; err != nil {
			b.Errorf("Serve: %v", err)
		}
	}
}

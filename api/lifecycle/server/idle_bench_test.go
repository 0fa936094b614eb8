package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/journal"
)

// What an idle watch costs pleg's side, in Go heap and stacks and in
// goroutines, with the watches on connections of their own (an agent
// each) and all on one connection (one agent, many watches). The watchers
// run in another process (this test binary re-executed), so that the
// benchmark's process is the server's side only.
//
//	go test -run '^$' -bench BenchmarkIdleWatch -benchtime 1x ./api/lifecycle/server
func BenchmarkIdleWatch(b *testing.B) {
	const watches = 200
	for _, conns := range []int{watches, 1} {
		b.Run(fmt.Sprintf("watches=%d/conns=%d", watches, conns), func(b *testing.B) {
			heap, goroutines := idleWatchCost(b, watches, conns)
			b.ReportMetric(heap/1024, "heap+stack-KiB/watch")
			b.ReportMetric(goroutines, "goroutines/watch")
		})
	}
}

// idleEnv, set in a re-executed test binary, makes it the idle watchers'
// process: "SOCKET WATCHES CONNECTIONS".
const idleEnv = "PLEG_IDLE_WATCHERS"

func init() {
	if v := os.Getenv(idleEnv); v != "" {
		os.Exit(idleWatchers(v))
	}
}

// idleWatchers opens the watches over the connections, round robin,
// prints "ready" once each has its snapshot's end, and holds them until
// its standard input closes.
func idleWatchers(spec string) int {
	var sock string
	var watches, conns int
	if _, err := fmt.Sscan(spec, &sock, &watches, &conns); err != nil || conns < 1 {
		fmt.Fprintln(os.Stderr, "bad", idleEnv, spec, err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clients := make([]lifecyclev1.LifecycleClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer conn.Close()
		clients[i] = lifecyclev1.NewLifecycleClient(conn)
	}
	for i := range watches {
		stream, err := clients[i%conns].Watch(ctx, &lifecyclev1.WatchRequest{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		m, err := stream.Recv()
		if err != nil || m.GetSnapshotEnd() == nil {
			fmt.Fprintln(os.Stderr, "watch", i, "began with", m, err)
			return 1
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// idleWatchCost returns the server's heap and stacks (bytes) and its
// goroutines per idle watch.
func idleWatchCost(b *testing.B, watches, conns int) (heap, goroutines float64) {
	b.Helper()
	j := journal.New(journal.Options{Epoch: "bench"})
	srv, err := New(Config{Journal: j, Logger: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	sock, stop := serveBench(b, srv)
	defer stop()

	heap0, g0 := heapAndStacks(), runtime.NumGoroutine()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", idleEnv, sock, watches, conns))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatalf("the watchers' process: %q %s", lines.Text(), stderr.String())
	}
	// An idle watch's sender goroutine returns SenderLinger after its
	// last message (the snapshot's end): count after that.
	time.Sleep(outbox.SenderLinger + 100*time.Millisecond)
	heap = float64(heapAndStacks()-heap0) / float64(watches)
	goroutines = float64(runtime.NumGoroutine()-g0) / float64(watches)
	_ = in.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("the watchers' process: %v %s", err, stderr.String())
	}
	b.Logf("%d idle watches on %d connection(s): %.1f KiB of heap and stacks and %.2f goroutines a watch",
		watches, conns, heap/1024, goroutines)
	return heap, goroutines
}

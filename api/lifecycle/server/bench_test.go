package server

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// benchPod is a pod as a kubelet-managed runtime lists it: a sandbox and
// three containers with the kubelet's labels and annotations.
func benchPod(i int) *journal.Pod {
	uid := types.UID(fmt.Sprintf("9c1b7d2e-3f4a-4b5c-8d6e-%012d", i))
	labels := map[string]string{"app": "web", "pod-template-hash": "7d4b9c8f6d",
		"io.kubernetes.pod.name": fmt.Sprintf("web-7d4b9c8f6d-%05d", i), "io.kubernetes.pod.namespace": "default",
		"io.kubernetes.pod.uid": string(uid)}
	ann := map[string]string{"kubernetes.io/config.seen": "2026-03-01T12:00:00.000000000Z", "kubernetes.io/config.source": "api"}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := &journal.Pod{UID: uid, Name: labels["io.kubernetes.pod.name"], Namespace: "default", IPs: []string{"10.88.0.7"},
		Labels: labels, Annotations: ann, ObservedAt: now,
		Sandboxes: []journal.Sandbox{{ID: fmt.Sprintf("%064d", i), Name: labels["io.kubernetes.pod.name"], State: cruntime.StateRunning,
			CreatedAt: now, IPs: []string{"10.88.0.7"}, Labels: labels, Annotations: ann}}}
	for _, n := range []string{"app", "sidecar", "proxy"} {
		p.Containers = append(p.Containers, journal.Container{ID: fmt.Sprintf("%060d%-4.4s", i, n), Name: n, State: cruntime.StateRunning,
			Image: "registry.example/" + n + ":1.2.3", ImageRef: "registry.example/" + n + "@sha256:0123456789abcdef",
			CreatedAt: now, StartedAt: now, Labels: map[string]string{"io.kubernetes.container.name": n}, Annotations: ann})
	}
	return p
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

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
	sock := filepath.Join(b.TempDir(), "pleg.sock")
	ln, err := ListenUnix(sock, 0o600, -1)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-served }()

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
	pods := make([]*journal.Pod, 64)
	for i := range pods {
		pods[i] = benchPod(i)
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		j.Append(journal.Entry{Kind: journal.KindPod, Pod: pods[i%len(pods)], Source: journal.SourceHint,
			Transitions: []journal.Transition{{Type: "ContainerDied", ContainerID: pods[i%len(pods)].Containers[0].ID, ContainerName: "app"}}})
	}
	for range watchers {
		<-received
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/watchers, "cpu-ns/event/watcher")
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

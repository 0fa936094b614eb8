package server

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/stats"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// Fan-out figures of issue 20: subscribers watching over gRPC on a unix
// socket while the journal takes 1,000 (and 200) events a second for 3 s (a pod of three
// containers with the kubelet's labels and annotations, ~1.5 KB as
// protobuf). The subscribers run in another process (this test binary
// re-executed), as agents do, so that the benchmark's process is pleg's
// side only: the server and the journal. A phase appends fanoutEvents
// events at that pace, each stamped with the time it is appended (pleg's
// own event time), and waits until every subscriber received every one.
//
//	go test -run '^$' -bench BenchmarkFanout -benchtime 1x ./api/lifecycle/server
//
// reports, for 100 subscribers against a baseline phase of 1 subscriber
// in the same run:
//   - delivery-p99-ms / -p50-ms: receipt by a subscriber minus the
//     event's time, over every delivery (100 x events), and the p99's
//     ratio to the baseline's;
//   - cpu-us/event/sub: pleg's CPU (the benchmark process: server and
//     journal) per event per subscriber beyond the baseline's, i.e. what
//     one more subscriber costs pleg; cpu-us/event-1-sub is the baseline's
//     per event; client-cpu-us/event/sub is the subscribers' own (their
//     process), for comparison;
//   - heap-KiB/sub: pleg's Go heap and stacks per open watch, measured
//     after a GC once every subscriber has its snapshot.
//
// On a machine of few cores, the subscribers' process competes with pleg
// for them, as agents on a node do.
func BenchmarkFanout(b *testing.B) {
	for _, rate := range []int{1000, 200} {
		b.Run(fmt.Sprintf("subscribers=100/rate=%d", rate), func(b *testing.B) { benchFanout(b, rate) })
	}
}

func benchFanout(b *testing.B, rate int) {
	fanoutEvents := 3 * rate // 3 s of load
	base := runFanout(b, 1, rate)
	got := runFanout(b, 100, rate)
	b.ReportMetric(float64(got.p99)/float64(time.Millisecond), "delivery-p99-ms")
	b.ReportMetric(float64(got.p50)/float64(time.Millisecond), "delivery-p50-ms")
	b.ReportMetric(float64(got.p99)/float64(base.p99), "p99-vs-1-sub")
	perSub := float64(got.cpu-base.cpu) / float64(fanoutEvents) / 99
	b.ReportMetric(perSub/float64(time.Microsecond), "cpu-us/event/sub")
	b.ReportMetric(float64(base.cpu)/float64(fanoutEvents)/float64(time.Microsecond), "cpu-us/event-1-sub")
	b.ReportMetric(float64(got.clientCPU)/float64(fanoutEvents)/100/float64(time.Microsecond), "client-cpu-us/event/sub")
	b.ReportMetric(float64(got.heapPerSub)/1024, "heap-KiB/sub")
}

// fanoutEnv, set in a re-executed test binary, makes it the subscribers'
// process: "SOCKET SUBSCRIBERS EVENTS".
const fanoutEnv = "PLEG_FANOUT_SUBSCRIBERS"

func init() {
	if v := os.Getenv(fanoutEnv); v != "" {
		os.Exit(fanoutSubscribers(v))
	}
}

// fanoutSubscribers opens the watches, prints "ready" once each has its
// snapshot's end, then, once each received every event, the delivery
// times (ns, sorted, one line) and its own CPU.
func fanoutSubscribers(spec string) int {
	var sock string
	var subs, events int
	if _, err := fmt.Sscan(spec, &sock, &subs, &events); err != nil {
		fmt.Fprintln(os.Stderr, "bad", fanoutEnv, spec, err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lat := make([][]time.Duration, subs)
	ready := make(chan struct{}, subs)
	failed := make(chan error, subs)
	for i := range subs {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer conn.Close()
		stream, err := lifecyclev1.NewLifecycleClient(conn).Watch(ctx, &lifecyclev1.WatchRequest{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lat[i] = make([]time.Duration, 0, events)
		go func() {
			for {
				m, err := stream.Recv()
				if err != nil {
					if ctx.Err() == nil {
						failed <- err
					}
					return
				}
				switch {
				case m.GetSnapshotEnd() != nil:
					ready <- struct{}{}
				case m.GetEvent() != nil:
					lat[i] = append(lat[i], time.Since(m.GetTime().AsTime()))
					if len(lat[i]) == events {
						ready <- struct{}{}
					}
				}
			}
		}()
	}
	for round := range 2 {
		for range subs {
			select {
			case <-ready:
			case err := <-failed:
				fmt.Fprintln(os.Stderr, "a subscriber failed:", err)
				return 1
			case <-time.After(2 * time.Minute):
				fmt.Fprintln(os.Stderr, "subscribers: timed out")
				return 1
			}
		}
		if round == 0 {
			fmt.Println("ready")
		}
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Println(len(all), stats.Percentile(all, 0.50).Nanoseconds(), stats.Percentile(all, 0.99).Nanoseconds(), stats.Percentile(all, 1).Nanoseconds(),
		ru.Utime.Nano()+ru.Stime.Nano())
	return 0
}

type fanoutResult struct {
	p50, p99   time.Duration
	cpu        time.Duration // pleg's side (this process) over the phase
	clientCPU  time.Duration // the subscribers' process, in all
	heapPerSub int64
}

// fanoutPod is a pod as the kubelet labels it, with three containers.
func fanoutPod(i int) *journal.Pod {
	uid := fmt.Sprintf("0b6f7c1e-4d2a-4f3b-9c8d-%012d", i%50)
	labels := cruntime.LabelsOf("io.kubernetes.pod.uid", uid, "io.kubernetes.pod.name", "web-7d9f8b6c5d-x2k4p",
		"io.kubernetes.pod.namespace", "shop", "app", "web", "pod-template-hash", "7d9f8b6c5d")
	now := time.Now()
	p := &journal.Pod{UID: types.UID(uid), Name: "web-7d9f8b6c5d-x2k4p", Namespace: "shop", IPs: []string{"10.244.1.17"},
		Labels: labels, Annotations: cruntime.LabelsOf("kubernetes.io/config.source", "api", "kubernetes.io/config.seen", now.Format(time.RFC3339Nano)),
		Sandboxes: []*journal.Sandbox{{ID: fmt.Sprintf("%064d", i), Name: "web-7d9f8b6c5d-x2k4p", State: cruntime.StateRunning,
			CreatedAt: now, IPs: []string{"10.244.1.17"}, Labels: labels}},
		ObservedAt: now}
	for _, n := range []string{"app", "istio-proxy", "log-shipper"} {
		c := journal.Container{ID: fmt.Sprintf("%s%058d", n[:3]+"abc", i), Name: n, State: cruntime.StateRunning,
			Image: "registry.example/shop/" + n + ":1.4.2"}.WithStatus(&cruntime.ContainerStatus{
			ImageRef:  "registry.example/shop/" + n + "@sha256:" + fmt.Sprintf("%064d", i%7),
			CreatedAt: now, StartedAt: now, Labels: cruntime.LabelsOf("io.kubernetes.container.name", n, "io.kubernetes.pod.uid", uid),
			Annotations: cruntime.LabelsOf("io.kubernetes.container.restartCount", "0", "io.kubernetes.container.terminationMessagePath", "/dev/termination-log")})
		p.Containers = append(p.Containers, &c)
	}
	return p
}

func heapAndStacks() int64 {
	// Twice: the first GC runs the finalizers of what the previous phase
	// left, the second frees what they held.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse)
}

func runFanout(b *testing.B, subs, rate int) fanoutResult {
	b.Helper()
	fanoutEvents := 3 * rate
	j := journal.New(journal.Options{Size: 2 * fanoutEvents, Epoch: "bench"})
	srv, err := New(Config{Journal: j, Logger: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	sock, stop := serveBench(b, srv)
	defer stop()

	heap0 := heapAndStacks()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", fanoutEnv, sock, subs, fanoutEvents))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = cmd.Wait()
		b.Fatalf("the subscribers' process: %q %s", lines.Text(), stderr.String())
	}
	heapPerSub := (heapAndStacks() - heap0) / int64(subs)

	pods := make([]*journal.Pod, 50)
	for i := range pods {
		pods[i] = fanoutPod(i)
	}
	cpu0 := testkit.CPUTime()
	start := time.Now()
	for i := range fanoutEvents {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate)))) // the load's pace
		j.Append(journal.Entry{Kind: journal.KindPod, Pod: pods[i%len(pods)], Source: journal.SourceHint,
			Transitions: []journal.Transition{{Type: "ContainerStarted", ContainerID: pods[i%len(pods)].Containers[0].ID, ContainerName: "app"}}})
	}
	var n int
	var p50, p99, maxd, ccpu int64
	if !lines.Scan() {
		_ = cmd.Wait()
		b.Fatalf("the subscribers' process ended: %s", stderr.String())
	}
	cpu := testkit.CPUTime() - cpu0
	if _, err := fmt.Sscan(lines.Text(), &n, &p50, &p99, &maxd, &ccpu); err != nil || n != subs*fanoutEvents {
		b.Fatalf("the subscribers' process printed %q (%v), want %d deliveries", lines.Text(), err, subs*fanoutEvents)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("the subscribers' process: %v %s", err, stderr.String())
	}
	b.Logf("%d subscribers: %d deliveries, p50 %v p99 %v max %v; pleg's CPU %v, the subscribers' %v; pleg's heap+stacks %d KiB per subscriber",
		subs, n, time.Duration(p50), time.Duration(p99), time.Duration(maxd), cpu, time.Duration(ccpu), heapPerSub>>10)
	return fanoutResult{p50: time.Duration(p50), p99: time.Duration(p99), cpu: cpu, clientCPU: time.Duration(ccpu), heapPerSub: heapPerSub}
}

package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// benchEventsPod is a pod as the kubelet labels it: a sandbox and three
// containers.
func benchEventsPod(i int) *journal.Pod {
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

// BenchmarkEventsFanout: DefaultMaxStreams event streams (/api/v1/events)
// over loopback TCP receive every event; one op is one event delivered to
// all of them. It reports the process's CPU (server and the clients'
// line scanning) per event per stream.
//
//	go test ./internal/httpapi -run '^$' -bench EventsFanout -benchtime 2000x -count 3
func BenchmarkEventsFanout(b *testing.B) {
	const streams = DefaultMaxStreams
	gen, err := pleg.New(pleg.Options{Runtime: newFakeRuntime()})
	if err != nil {
		b.Fatal(err)
	}
	j := journal.New(journal.Options{Epoch: "bench", Size: 1 << 16, BookmarkInterval: time.Hour})
	ts := httptest.NewServer(New(Config{Generator: journalGen{Generator: gen, j: j}, Heartbeat: time.Hour}).Handler())
	defer ts.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	received := make(chan int, streams)
	for range streams {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/api/v1/events", nil)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		lines := bufio.NewScanner(resp.Body)
		lines.Buffer(make([]byte, 64<<10), 1<<20)
		for lines.Scan() && lines.Text() != "event: snapshot-end" {
		}
		go func() {
			n := 0
			for lines.Scan() {
				if strings.HasPrefix(lines.Text(), "event: event") {
					if n++; n == b.N {
						received <- n
					}
				}
			}
		}()
	}
	pods := make([]*journal.Pod, 64)
	for i := range pods {
		pods[i] = benchEventsPod(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := eventsCPU()
	for i := range b.N {
		j.Append(journal.Entry{Kind: journal.KindPod, Pod: pods[i%len(pods)], Source: journal.SourceHint,
			Transitions: []journal.Transition{{Type: "ContainerDied", ContainerID: pods[i%len(pods)].Containers[0].ID, ContainerName: "app"}}})
	}
	for range streams {
		<-received
	}
	b.StopTimer()
	b.ReportMetric(float64(eventsCPU()-cpu0)/float64(b.N)/streams, "cpu-ns/event/stream")
}

func eventsCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

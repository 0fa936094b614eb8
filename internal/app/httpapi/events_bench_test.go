package httpapi

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/internal/testkit"
	"github.com/podlifecycle/pleg/journal"
)

// BenchmarkEventsFanout: DefaultMaxStreams event streams (/api/v1/events)
// over loopback TCP receive every event; one op is one event delivered to
// all of them. It reports the process's CPU (server and the clients'
// line scanning) per event per stream.
//
//	go test ./internal/app/httpapi -run '^$' -bench EventsFanout -benchtime 2000x -count 3
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
	testkit.MeasureFanOut(b, j, streams, received, "cpu-ns/event/stream")
}

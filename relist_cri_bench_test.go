package pleg_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/metrics"
)

// BenchmarkRelistIdleCRI is one global relist of a node where nothing
// changed, through the real CRI client over gRPC against the simulated
// runtime (served from this process: its work is in the figures too; `pleg
// bench` separates them).
func BenchmarkRelistIdleCRI(b *testing.B) {
	for _, n := range []struct{ pods, containers int }{{110, 5}, {1000, 10}} {
		b.Run(fmt.Sprintf("%dx%d", n.pods, n.containers), func(b *testing.B) {
			s := sim.New(sim.Config{Seed: 1, Pods: n.pods, ContainersPerPod: n.containers})
			if err := s.Serve(filepath.Join(b.TempDir(), "cri.sock")); err != nil {
				b.Fatal(err)
			}
			defer s.Stop()
			m := metrics.New(nil)
			rt, err := cri.Dial(s.Endpoint(), cri.WithTimeout(5*time.Second), cri.WithMetrics(m), cri.WithLogger(logr.Discard()))
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			g, err := pleg.New(pleg.Options{Runtime: rt, Metrics: m, Events: pleg.EventsOff})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Stop()
			ctx := context.Background()
			for range 2 {
				if err := g.Relist(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := g.Relist(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package criserve

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// BenchmarkListContainers lists 1,000 containers (200 pods x 5) through
// pleg's endpoint, from its state, and straight from the simulator.
func BenchmarkListContainers(b *testing.B) {
	r := newRig(b, sim.Config{Seed: 1, Pods: 200, ContainersPerPod: 5}, Config{})
	r.synced(b)
	r.stopGen()
	for _, c := range []struct {
		name   string
		client runtimeapi.RuntimeServiceClient
	}{{"pleg", r.pleg}, {"runtime", r.direct}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				resp, err := c.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				if err != nil {
					b.Fatal(err)
				}
				if len(resp.GetContainers()) != 1000 {
					b.Fatalf("%d containers", len(resp.GetContainers()))
				}
			}
		})
	}
}

package e2e

// A load of running pods created at once, for the tests that run many
// (TestPLEG50Pods, TestMeasureRelist50Pods, the CPU and event storm
// measurements).

import (
	"fmt"
	"testing"
)

// loadPod is one pod of a scale test: its sandbox and container IDs.
type loadPod struct {
	name, uid, sandbox string
	containers         []string
}

// runLoad creates pods × containers running pods "at once" (8 CRI clients
// in parallel) and returns them in name order.
func runLoad(t testing.TB, prefix string, pods, containers int) []loadPod {
	t.Helper()
	out := make([]loadPod, pods)
	inParallel(t, pods, 8, func(tb testing.TB, i int) {
		p := loadPod{name: fmt.Sprintf("%s-%02d", prefix, i)}
		p.sandbox, p.uid = RunPod(tb, p.name)
		for j := 0; j < containers; j++ {
			p.containers = append(p.containers, CreateAndStart(tb, p.sandbox, fmt.Sprintf("c%d", j), []string{"run"}))
		}
		out[i] = p
	})
	return out
}

package cri

import (
	"context"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// sinkRecorder records what a VerboseSink gets.
type sinkRecorder struct {
	mu  sync.Mutex
	got map[string]cruntime.State
	inf map[string]string
}

func (s *sinkRecorder) ContainerVerbose(id string, state cruntime.State, resp *runtimeapi.ContainerStatusResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[id] = state
	s.inf[id] = resp.GetInfo()["info"]
}

// TestWithVerboseStatuses: with a sink, ItemStatuses' ContainerStatus
// calls are verbose and each answer goes to the sink, by the listed ID,
// with its state; PodSandboxStatus calls stay plain; a container that
// vanished (NotFound) gives the sink nothing; the statuses returned are
// the same as without. Without a sink, every call is plain.
func TestWithVerboseStatuses(t *testing.T) {
	for _, withSink := range []bool{false, true} {
		f := &fakeCRI{}
		var mu sync.Mutex
		verboseCts, verboseSbs := 0, 0
		statusServer(f,
			map[string]*runtimeapi.PodSandboxStatus{"sb-new": sandboxStatus("sb-new", runtimeapi.PodSandboxState_SANDBOX_READY, 1, "10.0.0.1")},
			map[string]*runtimeapi.ContainerStatus{
				"c1": {Id: "c1", State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: 2},
				"c2": {Id: "c2", State: runtimeapi.ContainerState_CONTAINER_EXITED, CreatedAt: 3},
			}, nil)
		sbStatus, ctStatus := f.sandboxStatus, f.containerStatus
		f.sandboxStatus = func(ctx context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
			if r.Verbose {
				mu.Lock()
				verboseSbs++
				mu.Unlock()
			}
			return sbStatus(ctx, r)
		}
		f.containerStatus = func(ctx context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			resp, err := ctStatus(ctx, r)
			if err == nil && r.Verbose {
				mu.Lock()
				verboseCts++
				mu.Unlock()
				resp.Info = map[string]string{"info": `{"pid":42,"id":"` + r.ContainerId + `"}`}
			}
			return resp, err
		}
		sink := &sinkRecorder{got: map[string]cruntime.State{}, inf: map[string]string{}}
		var opts []Option
		if withSink {
			opts = append(opts, WithVerboseStatuses(sink))
		}
		c := f.start(t, opts...)
		ps, err := c.PodStatus(context.Background(), testPod())
		if err != nil {
			t.Fatal(err)
		}
		if len(ps.ContainerStatuses) != 2 || len(ps.SandboxStatuses) != 1 {
			t.Fatalf("sink %t: statuses %+v", withSink, ps)
		}
		if verboseSbs != 0 {
			t.Errorf("sink %t: %d verbose PodSandboxStatus calls, want none", withSink, verboseSbs)
		}
		if !withSink {
			if verboseCts != 0 {
				t.Errorf("without a sink: %d verbose ContainerStatus calls", verboseCts)
			}
			continue
		}
		// c1, c-gone (NotFound), c2.
		if verboseCts != 2 {
			t.Errorf("with a sink: %d verbose ContainerStatus answers, want 2 (c1, c2)", verboseCts)
		}
		want := map[string]cruntime.State{"c1": cruntime.StateRunning, "c2": cruntime.StateExited}
		if len(sink.got) != len(want) || sink.got["c1"] != want["c1"] || sink.got["c2"] != want["c2"] {
			t.Errorf("the sink got %v, want %v", sink.got, want)
		}
		if sink.inf["c1"] != `{"pid":42,"id":"c1"}` {
			t.Errorf("the sink's answer for c1 has info %q", sink.inf["c1"])
		}
	}
}

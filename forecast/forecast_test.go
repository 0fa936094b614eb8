package forecast_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/forecast"
)

// The model's rules, each in a line: a hung call costs the request timeout
// once per relist; a pod's calls stop at its first failure; a failing
// listing is fatal whatever it cost; the period counts.
func TestEstimate(t *testing.T) {
	s := forecast.Settings{}.WithDefaults()
	hung := func(m string) forecast.Call {
		return forecast.Call{Method: m, Hung: true, Failed: true, Took: 10 * time.Second}
	}
	ok := func(m string, d time.Duration) forecast.Call { return forecast.Call{Method: m, Took: d} }
	list := []forecast.Call{ok("ListPodSandbox", 2*time.Millisecond), ok("ListContainers", 3*time.Millisecond)}
	for _, c := range []struct {
		name    string
		r       forecast.Relist
		relist  time.Duration
		exceeds bool
		hung    int
		cause   string
	}{
		{"healthy", forecast.Relist{List: list, Pods: []forecast.Pod{{Ref: "a", Calls: []forecast.Call{ok("PodSandboxStatus", time.Millisecond)}}}},
			6 * time.Millisecond, false, 0, " ListContainers"},
		{"one hung pod", forecast.Relist{List: list, Pods: []forecast.Pod{{Ref: "a", Calls: []forecast.Call{ok("PodSandboxStatus", time.Millisecond), hung("ContainerStatus"), ok("ContainerStatus", time.Hour)}}}},
			2*time.Minute + 6*time.Millisecond, false, 1, "a ContainerStatus"},
		{"two hung pods", forecast.Relist{List: list, Pods: []forecast.Pod{{Ref: "a", Calls: []forecast.Call{hung("ContainerStatus")}}, {Ref: "b", Calls: []forecast.Call{hung("PodSandboxStatus")}}}},
			4*time.Minute + 5*time.Millisecond, true, 2, "a ContainerStatus"},
		{"slow but answering", forecast.Relist{List: list, Pods: []forecast.Pod{{Ref: "a", Calls: []forecast.Call{ok("ContainerStatus", time.Hour)}}}},
			2*time.Minute + 5*time.Millisecond, false, 0, "a ContainerStatus"},
		{"listing fails", forecast.Relist{List: []forecast.Call{{Method: "ListPodSandbox", Failed: true}}},
			0, true, 0, " ListPodSandbox"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := s.Estimate(c.r)
			cause := ""
			if e.Cause != nil {
				cause = e.Cause.Pod + " " + e.Cause.Call.Method
			}
			if e.Relist != c.relist || e.Exceeds != c.exceeds || e.HungCalls != c.hung || cause != c.cause {
				t.Errorf("relist %v exceeds %v hung %d cause %q; want %v %v %d %q", e.Relist, e.Exceeds, e.HungCalls, cause,
					c.relist, c.exceeds, c.hung, c.cause)
			}
		})
	}
	// The relist plus the period must exceed the threshold strictly.
	edge := forecast.Relist{Pods: []forecast.Pod{{Calls: []forecast.Call{ok("ContainerStatus", 2*time.Minute+59*time.Second)}}}}
	if s.Estimate(edge).Exceeds {
		t.Error("2m59s + 1s period exceeds 3m")
	}
	edge.Pods[0].Calls[0].Took += time.Nanosecond
	s.RequestTimeout = time.Hour
	if !s.Estimate(edge).Exceeds {
		t.Error("2m59s+1ns + 1s period does not exceed 3m")
	}
}

// A tracker fed by hand, as pleg run's loop feeds it.
func ExampleTracker() {
	start := time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC)
	tr := forecast.NewTracker(forecast.Settings{}, 10*time.Second)
	tr.ListStarted(start)
	tr.Listed(start, start.Add(5*time.Millisecond))
	// Two pods' status calls hang; pleg's 10 s bound on each runs out.
	tr.PodFailed(start.Add(11*time.Second), "uid-0", "default/db-0", forecast.Call{Method: "ContainerStatus", Hung: true, Took: 10 * time.Second})
	tr.PodFailed(start.Add(12*time.Second), "uid-1", "default/db-1", forecast.Call{Method: "PodSandboxStatus", Hung: true, Took: 10 * time.Second})
	fmt.Println(tr.Verdict(start.Add(20 * time.Second)).Message())
	tr.PodOK("uid-1")
	fmt.Println(tr.Verdict(start.Add(30 * time.Second)).Message())
	// Output:
	// the kubelet's PLEG will report not healthy in ~2m42s: ContainerStatus for pod default/db-0 hangs (2m0s request timeout, once per relist), and 1 more pod hangs: default/db-1; relist ~4m0s, threshold 3m0s
	// the kubelet's PLEG is not at risk: its relist would take ~2m0s (threshold 3m0s); ContainerStatus for pod default/db-0 hangs (2m0s request timeout, once per relist)
}

// A diagnosis's suspect is named while the episode it was made for lasts:
// not for another, not once a listing answers.
func TestBlame(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC)
	tr := forecast.NewTracker(forecast.Settings{}, 10*time.Second)
	tr.ListStarted(t0)
	tr.Listed(t0, t0.Add(time.Millisecond))
	tr.ListStarted(t0.Add(time.Second)) // does not answer
	v := tr.Verdict(t0.Add(15 * time.Second))
	if !v.RuntimeDown || !v.Since.Equal(t0.Add(time.Second)) || v.Suspect != nil {
		t.Fatalf("down: %+v", v)
	}
	s := forecast.Suspect{Pod: "default/db-0", PodUID: "u", Call: "a verbose PodSandboxStatus", ID: "sb"}
	tr.Blame(t0, s) // another episode
	if v := tr.Verdict(t0.Add(16 * time.Second)); v.Suspect != nil {
		t.Fatalf("blamed for another episode: %+v", v.Suspect)
	}
	tr.Blame(v.Since, s)
	v = tr.Verdict(t0.Add(20 * time.Second))
	want := "the kubelet's PLEG will report not healthy in ~2m40s: the container runtime does not answer its listing (ListPodSandbox, ListContainers) for 19s; the shim of pod default/db-0 does not answer (a verbose PodSandboxStatus hangs): a call waiting on it holds a container's lock"
	if v.Suspect == nil || *v.Suspect != s || v.Message() != want {
		t.Fatalf("blamed: %+v\n got %q\nwant %q", v.Suspect, v.Message(), want)
	}
	tr.Listed(t0.Add(21*time.Second), t0.Add(22*time.Second))
	tr.ListStarted(t0.Add(23 * time.Second))
	if v := tr.Verdict(t0.Add(40 * time.Second)); !v.RuntimeDown || v.Suspect != nil {
		t.Fatalf("a new episode after a listing answered: %+v", v)
	}
}

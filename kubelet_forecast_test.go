package pleg

import (
	"errors"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podlifecycle/pleg/metrics"
)

// The forecast of the kubelet's PLEG from what the generator's relists
// observe: one pod whose status call hangs costs the kubelet's relist the
// 2m request timeout, once per relist, and leaves it healthy (2m1s apart
// is under 3m); a second one puts it at risk, naming the pod and the call
// and when the kubelet turns unhealthy; the hangs' end clears it within a
// relist.
func TestForecastHungPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) { o.Metrics = m })
		rt.setPods(pod("ok", "c0=running"), pod("a", "c1=running"), pod("b", "c2=running"))
		g.Start()
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk || len(v.FailingPods) != 0 {
			t.Fatalf("healthy node: %+v", v)
		}

		// Pod a's status hangs once its container exits.
		releaseA, releaseB := make(chan struct{}), make(chan struct{})
		rt.hang["a"] = releaseA
		rt.setPods(pod("ok", "c0=running"), pod("a", "c1=exited"), pod("b", "c2=running"))
		time.Sleep(time.Second) // the next relist
		synctest.Wait()
		hangA := time.Now()
		if v := g.Forecast(); v.AtRisk || len(v.HungPods) != 0 {
			t.Fatalf("before pleg's bound on the call ran out: %+v", v)
		}
		time.Sleep(DefaultPodInspectionTimeout)
		synctest.Wait()
		v := g.Forecast()
		if v.AtRisk || len(v.HungPods) != 1 || v.HungPods[0] != "ns/name-a" {
			t.Fatalf("one hung pod: %+v", v)
		}
		if v.Estimate.Relist < 2*time.Minute || v.Estimate.Relist > 2*time.Minute+time.Second {
			t.Fatalf("one hung pod: relist %v, want the 2m request timeout (and the listing)", v.Estimate.Relist)
		}
		if msg := v.Message(); !strings.HasPrefix(msg, "the kubelet's PLEG is not at risk: its relist would take ~2m0s (threshold 3m0s); ContainerStatus for pod ns/name-a hangs") {
			t.Fatalf("one hung pod: %q", msg)
		}
		if got := testutil.ToFloat64(m.KubeletPLEGAtRisk); got != 0 {
			t.Fatalf("at risk gauge %v", got)
		}

		// A second pod hangs: 4m a relist.
		rt.hang["b"] = releaseB
		rt.setPods(pod("ok", "c0=running"), pod("a", "c1=exited"), pod("b", "c2=exited"))
		time.Sleep(time.Second)
		synctest.Wait()
		hangB := time.Now()
		time.Sleep(DefaultPodInspectionTimeout)
		synctest.Wait()
		v = g.Forecast()
		if !v.AtRisk || v.RuntimeDown || len(v.HungPods) != 2 {
			t.Fatalf("two hung pods: %+v", v)
		}
		if !v.Since.Equal(hangB) || !v.UnhealthyAt.Equal(hangB.Add(3*time.Minute)) {
			t.Fatalf("since %v, unhealthy at %v; want the second hang's start %v, and 3m later (the first began at %v)",
				v.Since, v.UnhealthyAt, hangB, hangA)
		}
		want := "the kubelet's PLEG will report not healthy in ~2m50s: ContainerStatus for pod ns/name-a hangs (2m0s request timeout, once per relist), and 1 more pod hangs: ns/name-b; relist ~4m0s, threshold 3m0s"
		if msg := v.Message(); msg != want {
			t.Fatalf("message\n got %q\nwant %q", msg, want)
		}
		if c := v.Estimate.Cause; c == nil || c.Pod != "ns/name-a" || c.Call.Method != "ContainerStatus" || c.Call.ID != "hung-container" {
			t.Fatalf("cause %+v", v.Estimate.Cause)
		}
		if got := testutil.ToFloat64(m.KubeletPLEGAtRisk); got != 1 {
			t.Fatalf("at risk gauge %v", got)
		}
		if got := testutil.ToFloat64(m.KubeletRelistForecast); got < 240 || got > 241 {
			t.Fatalf("forecast gauge %v", got)
		}
		if got := testutil.ToFloat64(m.KubeletPLEGUnhealthyAt); got != float64(hangB.Add(3*time.Minute).UnixNano())/1e9 {
			t.Fatalf("unhealthy-at gauge %v", got)
		}
		// pleg's own health is not the kubelet's.
		if ok, err := g.Healthy(); !ok {
			t.Fatalf("pleg's own health: %v", err)
		}
		// Past the moment, it says so.
		time.Sleep(3 * time.Minute)
		if msg := g.Forecast().Message(); !strings.HasPrefix(msg, "the kubelet's PLEG will report not healthy now (since ~10s): ") {
			t.Fatalf("past the moment: %q", msg)
		}

		// The hangs end: the calls return, the pods are relisted, the
		// forecast clears at once.
		close(releaseA)
		close(releaseB)
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk || len(v.FailingPods) != 0 {
			t.Fatalf("after the hangs: %+v", v)
		}
		if got := testutil.ToFloat64(m.KubeletPLEGAtRisk); got != 0 {
			t.Fatalf("at risk gauge after %v", got)
		}
	})
}

// A runtime that does not answer its listing: at risk once the listing has
// been out for the pod inspection timeout, with the kubelet unhealthy 3m
// after the start of the last listing that answered; the forecast gauge is
// +Inf. A listing that answers clears it.
func TestForecastRuntimeDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		m := metrics.New(nil)
		g := newLoopGenerator(t, rt, func(o *Options) { o.Metrics = m })
		rt.setPods(pod("a", "c1=running"))
		g.Start()
		synctest.Wait()
		lastOK := g.LastRelist()
		release := make(chan struct{})
		rt.mu.Lock()
		rt.hangAll = release
		rt.mu.Unlock()
		time.Sleep(time.Second) // the next relist's listing hangs
		synctest.Wait()
		time.Sleep(DefaultPodInspectionTimeout - time.Millisecond)
		if v := g.Forecast(); v.AtRisk {
			t.Fatalf("before the bound: %+v", v)
		}
		time.Sleep(time.Millisecond)
		v := g.Forecast()
		if !v.AtRisk || !v.RuntimeDown || !v.UnhealthyAt.Equal(lastOK.Add(3*time.Minute)) {
			t.Fatalf("listing out for 10s: %+v (last listing %v)", v, lastOK)
		}
		want := "the kubelet's PLEG will report not healthy in ~2m49s: the container runtime does not answer its listing (ListPodSandbox, ListContainers) for 10s"
		if msg := v.Message(); msg != want {
			t.Fatalf("message\n got %q\nwant %q", msg, want)
		}
		if got := testutil.ToFloat64(m.KubeletRelistForecast); !math.IsInf(got, 1) {
			t.Fatalf("forecast gauge %v, want +Inf", got)
		}
		rt.mu.Lock()
		rt.hangAll = nil
		rt.mu.Unlock()
		close(release)
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk {
			t.Fatalf("after the listing answered: %+v", v)
		}
	})
}

// Listings that fail (not hang) put the kubelet at risk once they have
// failed for the pod inspection timeout, and say why; pods whose
// inspection fails fast cost the kubelet nothing worth a warning.
func TestForecastListingFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newFakeRuntime()
		g := newLoopGenerator(t, rt, nil)
		rt.setPods(pod("a", "c1=running"), pod("b", "c2=running"))
		rt.fail["b"] = errors.New("boom")
		g.Start()
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk || len(v.FailingPods) != 1 || len(v.HungPods) != 0 {
			t.Fatalf("a pod failing fast: %+v", v)
		}
		rt.mu.Lock()
		rt.listErr = errors.New("connection refused")
		rt.mu.Unlock()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk {
			t.Fatalf("failing for 5s: %+v", v)
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		v := g.Forecast()
		if !v.AtRisk || !v.RuntimeDown || !strings.Contains(v.Message(), "listing fails for ") || !strings.HasSuffix(v.Message(), ": connection refused") {
			t.Fatalf("failing for 11s: %+v %q", v, v.Message())
		}
		rt.mu.Lock()
		rt.listErr = nil
		rt.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		if v := g.Forecast(); v.AtRisk {
			t.Fatalf("after a listing answered: %+v", v)
		}
	})
}

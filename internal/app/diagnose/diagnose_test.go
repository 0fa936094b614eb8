package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// serveSim serves a simulated runtime and returns it with a CRI client whose
// calls are bounded by probe and made one after another, as `pleg diagnose`
// dials it.
func serveSim(t *testing.T, cfg sim.Config, probe time.Duration) (*sim.Runtime, *cri.Client) {
	t.Helper()
	s := sim.New(cfg)
	if err := s.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c, err := cri.Dial(s.Endpoint(), cri.WithTimeout(probe), cri.WithStatusConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return s, c
}

func TestHealthyNode(t *testing.T) {
	// Every call answers: a probe timeout no loaded machine reaches costs
	// nothing.
	const probe = 10 * time.Second
	s, c := serveSim(t, sim.Config{Seed: 1, Pods: 5, ContainersPerPod: 2}, probe)
	r, err := Run(context.Background(), c, Options{Endpoint: s.Endpoint(), ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Healthy || r.Estimate.ExceedsThreshold || r.Cause != nil {
		t.Errorf("healthy node judged unhealthy: %+v", r.Estimate)
	}
	if !regexp.MustCompile(`^relist would take ~[0-9.]+(µs|ms|s) \(threshold 3m0s\): healthy$`).MatchString(r.Verdict) {
		t.Errorf("verdict = %q", r.Verdict)
	}
	if r.Runtime == nil || r.Runtime.Name != sim.RuntimeName || len(r.Runtime.Conditions) != 2 {
		t.Errorf("runtime = %+v", r.Runtime)
	}
	if r.Counts.Pods != 5 || r.Counts.Sandboxes != 5 || r.Counts.Containers != 10 {
		t.Errorf("counts = %+v", r.Counts)
	}
	if got := callNames(r.List.Calls); !slices.Equal(got, []string{"ListPodSandbox", "ListContainers"}) {
		t.Errorf("list calls = %v", got)
	}
	if len(r.Pods) != 5 {
		t.Fatalf("%d pods reported, want 5", len(r.Pods))
	}
	want := []string{"PodSandboxStatus", "ContainerStatus", "ContainerStatus"}
	var sum float64
	for _, p := range r.Pods {
		if p.Result != ResultOK || p.KubeletInspections != 1 || p.FailedCall != nil || p.Error != "" {
			t.Errorf("pod %s: %+v", p.Ref(), p)
		}
		if got := callNames(p.Calls); !slices.Equal(got, want) {
			t.Errorf("pod %s calls = %v, want %v", p.Ref(), got, want)
		}
		if p.SlowestCall == nil || p.Name == "" || p.Namespace == "" || p.UID == "" {
			t.Errorf("pod %+v lacks its slowest call or identity", p)
		}
		sum += p.KubeletSeconds
	}
	e := r.Estimate
	if e.ListSeconds <= 0 || !near(e.InspectionSeconds, sum) || e.FailingPods != 0 || e.HungCalls != 0 ||
		!near(e.RelistSeconds, e.ListSeconds+e.InspectionSeconds) {
		t.Errorf("estimate = %+v (pods sum %v)", e, sum)
	}
}

// TestHungPod is the situation `pleg diagnose` exists for: pods whose
// status calls never answer. The kubelet v1.37 inspects a failing pod once
// per relist, each hung call costing the 2m request timeout: one such pod
// leaves its relists 2m1s apart (healthy, but named), two make them 4m
// (unhealthy). The verdict names the pod and the call, and the report is
// done in about the probe timeout.
func TestHungPod(t *testing.T) {
	// The probe timeout tells a hung call (the simulated one never
	// answers) from one that answers: it must leave the calls that answer
	// room on a loaded machine.
	const probe = time.Second
	s1, c1 := serveSim(t, sim.Config{Seed: 2, Pods: 6, ContainersPerPod: 2, HangPods: 1}, probe)
	one, err := Run(context.Background(), c1, Options{ProbeTimeout: probe, MaxParallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	hung1, _ := s1.Pod(s1.Hung()[0])
	wantOne := regexp.MustCompile(`^relist would take ~(2m[0-9]+s) \(threshold 3m0s\): healthy, but PodSandboxStatus for pod ` +
		regexp.QuoteMeta(hung1.Namespace+"/"+hung1.Name) + ` hangs \(the kubelet waits the 2m0s runtime request timeout for it, once per relist\)$`)
	if !one.Healthy || !wantOne.MatchString(one.Verdict) || one.Estimate.HungCalls != 1 || one.Estimate.FailingPods != 1 {
		t.Errorf("one hung pod: healthy %v, verdict %q, estimate %+v; want healthy and it named", one.Healthy, one.Verdict, one.Estimate)
	}

	s, c := serveSim(t, sim.Config{Seed: 2, Pods: 6, ContainersPerPod: 2, HangPods: 2}, probe)
	hungUID := s.Hung()[0]
	hung, _ := s.Pod(hungUID)
	start := time.Now()
	r, err := Run(context.Background(), c, Options{ProbeTimeout: probe, MaxParallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	// About one probe timeout; the hung call alone would take forever.
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("diagnosis took %v with a hung pod", took)
	}
	ref := hung.Namespace + "/" + hung.Name
	if r.Healthy || !r.Estimate.ExceedsThreshold {
		t.Errorf("hung pod judged healthy: %s", r.Verdict)
	}
	// 4m: the 2m request timeout, for each pod; plus the calls that
	// answered, as long as they took here.
	other, _ := s.Pod(s.Hung()[1])
	wantVerdict := regexp.MustCompile(`^relist would take ~(4m[0-9]+s) \(threshold 3m0s\) because PodSandboxStatus for pod ` +
		regexp.QuoteMeta(ref) + ` hangs \(the kubelet waits the 2m0s runtime request timeout for it, once per relist\); 1 more pod hangs: ` +
		regexp.QuoteMeta(other.Namespace+"/"+other.Name) + `$`)
	if m := wantVerdict.FindStringSubmatch(r.Verdict); m == nil || m[1] != r.Estimate.Relist {
		t.Errorf("verdict = %q (estimate %s), want it to match %v", r.Verdict, r.Estimate.Relist, wantVerdict)
	}
	if r.Cause == nil || r.Cause.Pod != ref || r.Cause.PodUID != hungUID || r.Cause.Call != "PodSandboxStatus" ||
		!r.Cause.Hung || r.Cause.ID != hung.SandboxID() || r.Cause.KubeletSeconds != 120 {
		t.Errorf("cause = %+v, want PodSandboxStatus of %s (%s)", r.Cause, ref, hung.SandboxID())
	}
	p := r.Pods[0]
	if p.UID != hungUID || p.Result != ResultHung || p.KubeletInspections != 1 || p.FailedCall == nil ||
		!p.FailedCall.Hung || p.Error == "" {
		t.Errorf("first pod = %+v, want the hung one", p)
	}
	// The client's bound on the hung call ends the pod's probe after about
	// one probe timeout, not Run's safety net (a probe timeout per call
	// and a second: 6s here).
	if p.InspectionSeconds > 3*probe.Seconds() {
		t.Errorf("the hung pod's probe took %vs, want about the probe timeout (%v)", p.InspectionSeconds, probe)
	}
	e := r.Estimate
	hungSecs, answered := splitEstimate(t, r)
	if e.HungCalls != 2 || e.FailingPods != 2 || hungSecs != 240 ||
		!near(e.RelistSeconds, hungSecs+answered) || !near(e.RelistSeconds, e.ListSeconds+e.InspectionSeconds) {
		t.Errorf("estimate = %+v; hung calls charged %vs, answered calls %vs", e, hungSecs, answered)
	}
	for _, q := range r.Pods[2:] {
		if q.Result != ResultOK {
			t.Errorf("pod %s: %s", q.Ref(), q.Result)
		}
	}

	var text bytes.Buffer
	if err := WriteText(&text, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{"pod " + ref + ": PodSandboxStatus \"" + hung.SandboxID() + "\" hung (no answer within 1s); try: crictl inspectp " + hung.SandboxID(), "of which 2 failing pods  (inspected again in every relist)", r.Verdict + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, r.Verdict+"\n") {
		t.Errorf("the verdict is not the last line:\n%s", out)
	}
	t.Logf("text report:\n%s", out)
}

// A hung call that the kubelet's request timeout keeps short is not fatal,
// but the verdict still names it.
func TestHungPodShortRequestTimeout(t *testing.T) {
	const probe = time.Second // room for the calls that answer
	s, c := serveSim(t, sim.Config{Seed: 3, Pods: 3, HangPods: 1}, probe)
	hung, _ := s.Pod(s.Hung()[0])
	r, err := Run(context.Background(), c, Options{ProbeTimeout: probe, RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Healthy {
		t.Errorf("20s relist judged unhealthy: %s", r.Verdict)
	}
	// ~20s: the 20s request timeout, once, and the calls that answered
	// (shown to the 100ms: "20s" on an idle machine, "20.1s" on a busy one).
	want := regexp.MustCompile(`^relist would take ~(2[0-9](\.[0-9])?s) \(threshold 3m0s\): healthy, but PodSandboxStatus for pod ` +
		regexp.QuoteMeta(hung.Namespace+"/"+hung.Name) + ` hangs`)
	if m := want.FindStringSubmatch(r.Verdict); m == nil || m[1] != r.Estimate.Relist {
		t.Errorf("verdict = %q (estimate %s), want it to match %v", r.Verdict, r.Estimate.Relist, want)
	}
	if hungSecs, answered := splitEstimate(t, r); hungSecs != 20 || !near(r.Estimate.RelistSeconds, hungSecs+answered) {
		t.Errorf("estimate = %+v; hung calls charged %vs, answered calls %vs; want 20s for the hung one", r.Estimate, hungSecs, answered)
	}
}

// splitEstimate adds up what the report's calls cost the kubelet's relist,
// as the estimate should: the hung calls (each the request timeout) and
// the calls that answered (each as long as it took here, so the part that
// depends on the machine's load), every pod's as often as a relist
// inspects it.
func splitEstimate(t *testing.T, r *Report) (hung, answered float64) {
	t.Helper()
	add := func(c Call, times int) {
		switch {
		case c.Hung:
			if c.KubeletSeconds != r.Settings.RequestTimeoutSeconds {
				t.Errorf("hung call %+v not charged the request timeout", c)
			}
			hung += c.KubeletSeconds * float64(times)
		default:
			if !near(c.KubeletSeconds, c.Seconds) {
				t.Errorf("call %+v not charged what it took", c)
			}
			answered += c.KubeletSeconds * float64(times)
		}
	}
	for _, c := range r.List.Calls {
		add(c, 1)
	}
	for _, p := range r.Pods {
		for _, c := range p.Calls {
			add(c, p.KubeletInspections)
		}
	}
	return hung, answered
}

func TestUnreachableRuntime(t *testing.T) {
	c, err := cri.Dial("unix://"+filepath.Join(t.TempDir(), "nothing.sock"), cri.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := Run(context.Background(), c, Options{ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Healthy || !r.Estimate.ListFails || r.List.Error == "" || r.Runtime == nil || r.Runtime.Error == "" {
		t.Errorf("report = %+v", r)
	}
	// ListPodSandbox failed: no sandbox to probe the shim of.
	if r.ShimProbe != nil || r.StuckShims != nil {
		t.Errorf("shim probe %+v, stuck shims %v, want none", r.ShimProbe, r.StuckShims)
	}
	if !strings.HasPrefix(r.Verdict, "relist fails: ListPodSandbox") ||
		!strings.HasSuffix(r.Verdict, "so PLEG turns unhealthy 3m0s after its last successful relist") {
		t.Errorf("verdict = %q", r.Verdict)
	}
}

// fakeRuntime is an in-memory runtime that reports no calls to tracers.
type fakeRuntime struct {
	pods      []*cruntime.Pod
	listBlock chan struct{} // ListPods blocks on it, ignoring its context, when not nil
	delay     time.Duration // of every status fetch
	fail      types.UID     // the status fetch of this pod fails
	// rendezvous, when not 0, holds every status fetch until that many have
	// been in flight at once (or rendezvousWait passed), so that a test of
	// the parallelism does not depend on how soon goroutines get a CPU.
	rendezvous int32

	missed                atomic.Bool // the rendezvous timed out
	inflight, maxInflight atomic.Int32
}

// rendezvousWait bounds the wait for fakeRuntime.rendezvous: far beyond
// any scheduling delay, and within Run's safety net for one pod (a probe
// timeout per call and a second; at least 16s with the default 5s).
const rendezvousWait = 10 * time.Second

func (f *fakeRuntime) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	if f.listBlock != nil {
		<-f.listBlock
	}
	return f.pods, nil
}

func (f *fakeRuntime) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	for _, p := range f.pods {
		if p.UID == uid {
			return p, nil
		}
	}
	return nil, nil
}

func (f *fakeRuntime) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxInflight.Load()
		if n <= m || f.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	for deadline := time.Now().Add(rendezvousWait); f.maxInflight.Load() < f.rendezvous && !f.missed.Load(); {
		if time.Now().After(deadline) {
			f.missed.Store(true) // the test fails on maxInflight: no need to hold the others
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(f.delay)
	if pod.UID == f.fail {
		return nil, nil, errors.New("ContainerStatus \"c1\": rpc error: code = Internal desc = shim is gone")
	}
	return make([]*cruntime.SandboxStatus, len(sbs)), make([]*cruntime.ContainerStatus, len(cts)), nil
}

func fakePods(n int) []*cruntime.Pod {
	var pods []*cruntime.Pod
	for i := range n {
		pods = append(pods, &cruntime.Pod{UID: types.UID(fmt.Sprintf("uid-%d", i)), Name: fmt.Sprintf("pod-%d", i),
			Namespace: "ns", Sandboxes: []*cruntime.Container{{ID: fmt.Sprintf("sb-%d", i), State: cruntime.StateRunning}}})
	}
	return pods
}

// Pods are probed in parallel, MaxParallel at once, but the estimate adds
// them up one after another, as the kubelet inspects them.
func TestSlowPodsExceedThreshold(t *testing.T) {
	const delay = 40 * time.Millisecond
	// The probes meet 4 at once before taking their time: probed one
	// after another, they would never be 4 in flight.
	f := &fakeRuntime{pods: fakePods(8), delay: delay, rendezvous: 4}
	r, err := Run(context.Background(), f, Options{Threshold: 200 * time.Millisecond, RelistPeriod: -1, MaxParallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.maxInflight.Load(); got != 4 {
		t.Errorf("at most %d pods probed at once, want 4", got)
	}
	if r.Healthy || r.Cause == nil || r.Cause.Pod == "" {
		t.Errorf("report = %+v", r)
	}
	// 8 pods of at least 40ms each, one after another: at least 320ms, over
	// the 200ms threshold however slow the machine. How much more depends
	// on the machine: the verdict shows the estimate's own figures.
	e := r.Estimate
	var sum float64
	for _, p := range r.Pods {
		sum += p.KubeletSeconds
	}
	if e.InspectionSeconds < 8*delay.Seconds() || !near(e.InspectionSeconds, sum) || !e.ExceedsThreshold {
		t.Errorf("estimate = %+v (pods sum %v), want the 8 pods added up: at least %v", e, sum, 8*delay)
	}
	m := regexp.MustCompile(`^relist would take ~(\S+) \(threshold 200ms\) because inspecting 8 pods one after another takes ~(\S+) \(slowest: pod ns/pod-[0-9], \S+; its slowest call: GetPodStatus \S+\)$`).FindStringSubmatch(r.Verdict)
	if m == nil || m[1] != e.Relist || m[2] != Round(seconds(e.InspectionSeconds)).String() {
		t.Errorf("verdict = %q (estimate %+v)", r.Verdict, e)
	}
}

func TestFailingPod(t *testing.T) {
	f := &fakeRuntime{pods: fakePods(3), fail: "uid-1"}
	r, err := Run(context.Background(), f, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Healthy || r.Estimate.FailingPods != 1 || r.Cause == nil || r.Cause.Pod != "ns/pod-1" || r.Cause.Hung {
		t.Errorf("report = %+v, cause %+v", r.Estimate, r.Cause)
	}
	want := `: healthy, but GetPodStatus for pod ns/pod-1 fails: ContainerStatus "c1": rpc error: code = Internal desc = shim is gone`
	if !strings.HasSuffix(r.Verdict, want) {
		t.Errorf("verdict = %q, want suffix %q", r.Verdict, want)
	}
}

// A listing that hangs in a runtime that ignores its context still ends the
// diagnosis in bounded time.
func TestHungListingIgnoringContext(t *testing.T) {
	// ListPods blocks until the test ends: without the safety net (two
	// probe timeouts and a second here), Run would never return.
	f := &fakeRuntime{pods: fakePods(1), listBlock: make(chan struct{})}
	defer close(f.listBlock)
	start := time.Now()
	r, err := Run(context.Background(), f, Options{ProbeTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("took %v, want about 1.2s", took)
	}
	want := "relist fails: ListPods hangs (no answer within 100ms; the kubelet gives up after the 2m0s runtime request timeout), so PLEG turns unhealthy 3m0s after its last successful relist"
	// No ListPodSandbox seen to answer (nor an endpoint): no shim probe.
	if r.Verdict != want || r.Healthy || r.Estimate.HungCalls != 1 || r.Estimate.RelistSeconds != 120 || r.ShimProbe != nil {
		t.Errorf("verdict = %q (estimate %+v), want %q", r.Verdict, r.Estimate, want)
	}
}

func TestInterrupted(t *testing.T) {
	f := &fakeRuntime{pods: fakePods(20), delay: 50 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
	defer cancel()
	r, err := Run(ctx, f, Options{MaxParallel: 2})
	if !errors.Is(err, context.DeadlineExceeded) || r == nil {
		t.Fatalf("err = %v", err)
	}
	skipped := 0
	for _, p := range r.Pods {
		if p.Result == ResultSkipped {
			skipped++
		}
	}
	if skipped == 0 || len(r.Pods) != 20 {
		t.Errorf("%d of %d pods skipped", skipped, len(r.Pods))
	}
}

// TestJSONShape pins the keys scripts (and the real-containerd suite) read.
func TestJSONShape(t *testing.T) {
	const probe = time.Second // room for the listing to answer on a loaded machine
	_, c := serveSim(t, sim.Config{Seed: 4, Pods: 2, HangPods: 1}, probe)
	r, err := Run(context.Background(), c, Options{ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{
		"endpoint?", "runtime.name", "runtime.version", "runtime.conditions", "startedAt", "tookSeconds",
		"settings.requestTimeoutSeconds", "settings.probeTimeoutSeconds", "settings.thresholdSeconds",
		"settings.relistPeriodSeconds", "settings.maxParallel",
		"list.calls", "counts.pods", "counts.sandboxes", "counts.containers", "counts.sandboxStates", "counts.containerStates",
		"pods", "estimate.relistSeconds", "estimate.relist", "estimate.listSeconds", "estimate.inspectionSeconds",
		"estimate.hungCalls", "estimate.failingPods", "estimate.thresholdSeconds",
		"estimate.exceedsThreshold", "estimate.listFails", "healthy", "cause.pod", "cause.podUID", "cause.call",
		"cause.id", "cause.hung", "cause.error", "cause.kubeletSeconds", "verdict",
	} {
		optional := strings.HasSuffix(path, "?")
		if _, ok := lookup(m, strings.TrimSuffix(path, "?")); !ok && !optional {
			t.Errorf("JSON lacks %s: %s", path, b)
		}
	}
	pod := m["pods"].([]any)[0].(map[string]any)
	for _, k := range []string{"podUID", "podName", "podNamespace", "sandboxes", "containers", "result",
		"inspectionSeconds", "kubeletSeconds", "kubeletInspections", "slowestCall", "failedCall", "error", "calls"} {
		if _, ok := pod[k]; !ok {
			t.Errorf("pod JSON lacks %s: %v", k, pod)
		}
	}
	call := pod["failedCall"].(map[string]any)
	for _, k := range []string{"call", "operation", "id", "seconds", "kubeletSeconds", "hung", "error"} {
		if _, ok := call[k]; !ok {
			t.Errorf("call JSON lacks %s: %v", k, call)
		}
	}
}

func lookup(m map[string]any, path string) (any, bool) {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = mm[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

func TestRound(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{35*time.Millisecond + 421*time.Microsecond, "35ms"},
		{812 * time.Nanosecond, "1µs"},
		{2345 * time.Millisecond, "2.35s"},
		{4*time.Minute + 12*time.Millisecond, "4m0s"},
		{4*time.Minute + 10*time.Second + 600*time.Millisecond, "4m11s"},
	} {
		if got := Round(c.d).String(); got != c.want {
			t.Errorf("Round(%v) = %s, want %s", c.d, got, c.want)
		}
	}
}

func callNames(calls []Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Call)
	}
	return out
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func (f *fakeRuntime) Identities(context.Context, *cruntime.Pod, []*cruntime.Container) ([]*cruntime.Identity, error) {
	return nil, cruntime.ErrIdentityUnsupported
}

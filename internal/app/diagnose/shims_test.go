package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
)

// shimCRI is a CRI runtime in the way containerd 2.x answers when a pod's
// shim is stopped and a call waiting on it holds a container's status
// lock: ListPodSandbox and the (non-verbose) status calls answer, the
// verbose PodSandboxStatus of the stuck sandboxes hangs, and, with
// hangList, ListContainers hangs. Hanging calls return when their context
// is done.
type shimCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	sandboxes []*runtimeapi.PodSandbox
	stuck     map[string]bool // sandbox IDs whose verbose status hangs
	// unknown: sandbox IDs whose verbose status answers at once with the
	// task's processStatus "unknown", as containerd 2.x does once its
	// task State call to a stopped shim fails (see classifyShimAnswer).
	// The others' verbose info says "running".
	unknown  map[string]bool
	hangList bool
	delay    time.Duration // of the verbose status calls that answer
	// rendezvous, when not 0, holds the verbose status calls that answer
	// until that many have been in flight at once (or their context
	// ends), so that a test of the parallelism does not depend on how soon
	// goroutines get a CPU.
	rendezvous int
	// onVerbose, when set, is called as a verbose status call arrives.
	onVerbose func(id string)

	mu                      sync.Mutex
	verbose                 []string // sandbox IDs of verbose status calls
	inflight, maxInflight   int
	sandboxLists, listConts int
}

func hang(ctx context.Context) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

func (f *shimCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "shimcri", RuntimeVersion: "1"}, nil
}

func (f *shimCRI) ListPodSandbox(ctx context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	f.sandboxLists++
	f.mu.Unlock()
	uid := r.GetFilter().GetLabelSelector()["io.kubernetes.pod.uid"]
	var items []*runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		if uid == "" || s.Metadata.Uid == uid {
			items = append(items, s)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func (f *shimCRI) ListContainers(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	f.listConts++
	f.mu.Unlock()
	if f.hangList {
		return nil, hang(ctx)
	}
	return &runtimeapi.ListContainersResponse{}, nil
}

func (f *shimCRI) PodSandboxStatus(ctx context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	var sb *runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		if s.Id == r.PodSandboxId {
			sb = s
		}
	}
	if sb == nil {
		return nil, status.Errorf(codes.NotFound, "sandbox %q not found", r.PodSandboxId)
	}
	if r.Verbose {
		f.mu.Lock()
		f.verbose = append(f.verbose, r.PodSandboxId)
		f.inflight++
		f.maxInflight = max(f.maxInflight, f.inflight)
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			f.inflight--
			f.mu.Unlock()
		}()
		if f.onVerbose != nil {
			f.onVerbose(r.PodSandboxId)
		}
		if f.stuck[r.PodSandboxId] {
			return nil, hang(ctx)
		}
		if f.unknown[r.PodSandboxId] {
			return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{
				Id: sb.Id, Metadata: sb.Metadata, State: sb.State, CreatedAt: sb.CreatedAt, Labels: sb.Labels},
				Info: map[string]string{"info": `{"pid":4242,"processStatus":"unknown"}`}}, nil
		}
		for ctx.Err() == nil {
			f.mu.Lock()
			met := f.maxInflight >= f.rendezvous
			f.mu.Unlock()
			if met {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(f.delay)
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{
		Id: sb.Id, Metadata: sb.Metadata, State: sb.State, CreatedAt: sb.CreatedAt, Labels: sb.Labels}}
	if r.Verbose && f.unknown != nil {
		resp.Info = map[string]string{"info": `{"pid":4242,"processStatus":"running"}`}
	}
	return resp, nil
}

// serveShimCRI serves f on a unix socket and returns its endpoint and a
// client dialled as `pleg diagnose` dials it.
func serveShimCRI(t *testing.T, f *shimCRI, probe time.Duration) (string, *cri.Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	endpoint := "unix://" + sock
	c, err := cri.Dial(endpoint, cri.WithTimeout(probe), cri.WithStatusConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return endpoint, c
}

// sandbox returns a listed sandbox of pod ns/name whose ID repeats c.
func sandbox(c byte, name string, ready bool) *runtimeapi.PodSandbox {
	state := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if ready {
		state = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	uid := "uid-" + name
	return &runtimeapi.PodSandbox{
		Id:       strings.Repeat(string(c), 64),
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "ns"},
		State:    state,
		Labels:   map[string]string{"io.kubernetes.pod.uid": uid},
	}
}

// TestHungListNamesStuckShim is containerd/containerd#9770 as
// containerd 2.x shows it: ListContainers hangs behind a container's
// status lock, held by a call waiting on a stopped shim. The diagnosis
// names the pod whose shim does not answer.
func TestHungListNamesStuckShim(t *testing.T) {
	// The probe timeout tells the hung calls (they never answer) from the
	// others: it leaves those room on a loaded machine.
	const probe = time.Second
	stuck := sandbox('b', "stuck", true)
	f := &shimCRI{
		sandboxes: []*runtimeapi.PodSandbox{sandbox('a', "fine", true), stuck, sandbox('c', "gone", false)},
		stuck:     map[string]bool{stuck.Id: true},
		hangList:  true,
	}
	endpoint, c := serveShimCRI(t, f, probe)
	start := time.Now()
	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// The listing's probe timeout, then one round of verbose calls (the
	// count of verbose calls below says one round): at least 2 probe
	// timeouts, and bounded, where the hung calls alone would never end.
	if took < 2*probe || took > 30*time.Second {
		t.Errorf("diagnosis took %v, want about 2 probe timeouts (%v)", took, 2*probe)
	}
	if r.Healthy || !r.Estimate.ListFails || len(r.Pods) != 0 {
		t.Errorf("report healthy=%v estimate=%+v pods=%d, want the listing failing", r.Healthy, r.Estimate, len(r.Pods))
	}
	if c := r.Cause; c == nil || c.Call != "ListContainers" || !c.Hung || c.Pod != "ns/stuck" || c.PodUID != "uid-stuck" || c.ID != "" {
		t.Errorf("cause = %+v, want ListContainers hung, pod ns/stuck", r.Cause)
	}
	sp := r.ShimProbe
	if sp == nil || sp.Reason != ShimProbeListHung || sp.Sandboxes != 3 || sp.Answered != 2 || sp.Stuck != 1 ||
		sp.Failed != 0 || sp.Skipped != 0 || sp.Error != "" || sp.TookSeconds < probe.Seconds() {
		t.Errorf("shim probe = %+v", sp)
	}
	if len(r.StuckShims) != 1 {
		t.Fatalf("stuck shims = %+v, want ns/stuck's", r.StuckShims)
	}
	s := r.StuckShims[0]
	// It waited about the probe timeout (timed from a moment after the
	// call's deadline was set: maybe a hair less).
	if s.Pod != "ns/stuck" || s.PodUID != "uid-stuck" || s.SandboxID != stuck.Id || s.SandboxState != "running" ||
		s.Seconds < probe.Seconds()/2 || s.Error != "verbose PodSandboxStatus: no answer within 1s" {
		t.Errorf("stuck shim = %+v", s)
	}
	want := "relist fails: ListContainers hangs (no answer within 1s; the kubelet gives up after the 2m0s runtime request timeout), " +
		"so PLEG turns unhealthy 3m0s after its last successful relist; the shim of pod ns/stuck does not answer " +
		"(crictl inspectp bbbbbbbbbbbbb hangs): a call waiting on a stuck shim while holding a container's lock is the usual cause"
	if r.Verdict != want {
		t.Errorf("verdict = %q\nwant      %q", r.Verdict, want)
	}
	f.mu.Lock()
	if len(f.verbose) != 3 || f.sandboxLists != 2 {
		t.Errorf("verbose status calls %v, ListPodSandbox calls %d; want one verbose call per sandbox and the listing made again", f.verbose, f.sandboxLists)
	}
	f.mu.Unlock()

	var text bytes.Buffer
	if err := WriteText(&text, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"Shims:    verbose PodSandboxStatus (crictl inspectp; not a kubelet call) of every sandbox, because ListContainers hung: 3 sandboxes: 1 shim does not answer, 2 answered",
		"  pod ns/stuck: its shim does not answer: verbose PodSandboxStatus hung (no answer within 1s); try: crictl inspectp " + stuck.Id,
		want,
	} {
		if !strings.Contains(text.String(), line+"\n") {
			t.Errorf("text lacks the line %q:\n%s", line, text.String())
		}
	}

	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"shimProbe.reason", "shimProbe.sandboxes", "shimProbe.answered", "shimProbe.stuck",
		"shimProbe.tookSeconds", "cause.pod", "cause.podUID"} {
		if _, ok := lookup(m, path); !ok {
			t.Errorf("JSON lacks %s: %s", path, b)
		}
	}
	shims, _ := m["stuckShims"].([]any)
	if len(shims) != 1 {
		t.Fatalf("JSON stuckShims = %v", m["stuckShims"])
	}
	for _, k := range []string{"pod", "podUID", "sandboxID", "sandboxState", "seconds", "error"} {
		if _, ok := shims[0].(map[string]any)[k]; !ok {
			t.Errorf("stuck shim JSON lacks %s: %v", k, shims[0])
		}
	}
}

// containerd 2.x answers the verbose PodSandboxStatus of a stopped shim
// without an error once its own task State call to the shim gives up
// (at the caller's deadline or after its 2 s task state timeout), with
// the task's processStatus "unknown": the shim did not answer, and the
// probe says so, though the call returned at once here.
func TestStuckShimAnswersUnknown(t *testing.T) {
	const probe = time.Second // room for the calls that answer
	stuck := sandbox('b', "stuck", true)
	f := &shimCRI{
		sandboxes: []*runtimeapi.PodSandbox{sandbox('a', "fine", true), stuck, sandbox('c', "other", true)},
		unknown:   map[string]bool{stuck.Id: true},
		hangList:  true,
	}
	endpoint, c := serveShimCRI(t, f, probe)
	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	if sp := r.ShimProbe; sp == nil || sp.Sandboxes != 3 || sp.Answered != 2 || sp.Stuck != 1 || sp.Failed != 0 || sp.Skipped != 0 {
		t.Errorf("shim probe = %+v, want 3 sandboxes, 2 answered, 1 stuck", sp)
	}
	if len(r.StuckShims) != 1 || r.StuckShims[0].Pod != "ns/stuck" || r.StuckShims[0].SandboxID != stuck.Id ||
		!strings.Contains(r.StuckShims[0].Error, `processStatus "unknown"`) {
		t.Errorf("stuck shims = %+v, want ns/stuck's, its task status unknown", r.StuckShims)
	}
	if c := r.Cause; c == nil || c.Call != "ListContainers" || c.Pod != "ns/stuck" || c.PodUID != "uid-stuck" {
		t.Errorf("cause = %+v, want ListContainers hung, pod ns/stuck", r.Cause)
	}
	if !strings.Contains(r.Verdict, "the shim of pod ns/stuck does not answer (crictl inspectp bbbbbbbbbbbbb hangs)") {
		t.Errorf("verdict %q does not name ns/stuck's shim", r.Verdict)
	}
}

func TestClassifyShimAnswer(t *testing.T) {
	const timeout = time.Second
	withInfo := func(info string) *runtimeapi.PodSandboxStatusResponse {
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{}, Info: map[string]string{"info": info}}
	}
	for _, c := range []struct {
		name string
		resp *runtimeapi.PodSandboxStatusResponse
		err  error
		took time.Duration
		want shimAnswer
	}{
		{"running", withInfo(`{"processStatus":"running"}`), nil, 3 * time.Millisecond, shimAnswered},
		{"no verbose info (another runtime)", &runtimeapi.PodSandboxStatusResponse{}, nil, 3 * time.Millisecond, shimAnswered},
		{"info not JSON", withInfo(`{`), nil, 3 * time.Millisecond, shimAnswered},
		{"deleted task", withInfo(`{"processStatus":"deleted"}`), nil, 3 * time.Millisecond, shimAnswered},
		{"gone", nil, status.Error(codes.NotFound, "sandbox not found"), time.Millisecond, shimAnswered},
		// containerd gave up on the shim before the deadline (its 2 s
		// task state timeout under a longer probe timeout).
		{"unknown in time", withInfo(`{"processStatus":"unknown"}`), nil, 300 * time.Millisecond, shimUnknown},
		// containerd gave up at the (its copy of the) deadline, and the
		// answer beat the client's deadline timer.
		{"unknown at the deadline", withInfo(`{"processStatus":"unknown"}`), nil, timeout + time.Millisecond, shimUnknown},
		{"answer after the deadline", withInfo(`{"processStatus":"running"}`), nil, timeout + 2*time.Millisecond, shimAnsweredLate},
		{"answer exactly at the deadline", nil, nil, timeout, shimAnsweredLate},
		{"deadline (gRPC)", nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded"), timeout, shimTimedOut},
		{"deadline (context)", nil, context.DeadlineExceeded, timeout, shimTimedOut},
		{"other error", nil, status.Error(codes.Unavailable, "connection refused"), time.Millisecond, shimFailed},
	} {
		if got := classifyShimAnswer(c.resp, c.err, c.took, timeout); got != c.want {
			t.Errorf("%s: classifyShimAnswer = %d, want %d", c.name, got, c.want)
		}
	}
}

// With every shim answering, a hung listing is reported as before; the
// probe says it found nothing.
func TestHungListNoStuckShim(t *testing.T) {
	const probe = time.Second // room for the calls that answer
	f := &shimCRI{sandboxes: []*runtimeapi.PodSandbox{sandbox('a', "a", true), sandbox('b', "b", true)}, hangList: true}
	endpoint, c := serveShimCRI(t, f, probe)
	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	want := "relist fails: ListContainers hangs (no answer within 1s; the kubelet gives up after the 2m0s runtime request timeout), so PLEG turns unhealthy 3m0s after its last successful relist"
	if r.Verdict != want || r.Cause == nil || r.Cause.Pod != "" || r.Cause.Call != "ListContainers" || len(r.StuckShims) != 0 {
		t.Errorf("verdict %q cause %+v stuck %v, want %q and no pod", r.Verdict, r.Cause, r.StuckShims, want)
	}
	if sp := r.ShimProbe; sp == nil || sp.Sandboxes != 2 || sp.Answered != 2 || sp.Stuck != 0 {
		t.Errorf("shim probe = %+v", sp)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "because ListContainers hung: 2 sandboxes: 0 shims do not answer, 2 answered\n") {
		t.Errorf("text:\n%s", text.String())
	}
}

// Without raw CRI calls the probe cannot be made; the report says why and
// is otherwise unchanged.
func TestHungListNoRawCRI(t *testing.T) {
	const probe = time.Second // room for ListPodSandbox to answer
	f := &shimCRI{sandboxes: []*runtimeapi.PodSandbox{sandbox('a', "a", true)}, hangList: true,
		stuck: map[string]bool{strings.Repeat("a", 64): true}}
	endpoint, c := serveShimCRI(t, f, probe)
	r, err := Run(context.Background(), noRaw{c}, Options{Endpoint: endpoint, ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	if sp := r.ShimProbe; sp == nil || sp.Error == "" || sp.Sandboxes != 0 || len(r.StuckShims) != 0 || r.Cause.Pod != "" {
		t.Errorf("shim probe %+v, stuck %v, cause %+v", sp, r.StuckShims, r.Cause)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Shims: .*because ListContainers hung: not made: .+$`).MatchString(text.String()) {
		t.Errorf("text:\n%s", text.String())
	}
}

// noRaw hides the raw CRI calls of a client.
type noRaw struct{ cruntime.Runtime }

// Many stuck shims: the probe stays within its budget of probe timeouts
// and says what it did not probe.
func TestShimProbeBounded(t *testing.T) {
	// Long enough for the calls that answer on a loaded machine; the
	// probe's listing must answer within 2 probe timeouts for a round of
	// verbose calls to start.
	const probe = time.Second
	f := &shimCRI{stuck: map[string]bool{}, hangList: true}
	for i := range 20 {
		s := sandbox(byte('A'+i), string(rune('a'+i)), true)
		f.sandboxes = append(f.sandboxes, s)
		f.stuck[s.Id] = true
	}
	endpoint, c := serveShimCRI(t, f, probe)
	start := time.Now()
	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe, MaxParallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	// The listing's probe timeout and the shim probe's three (4s here),
	// and some room for the calls that answer; without the budget, 7
	// rounds of verbose calls would take 8 probe timeouts in all. (The
	// count of verbose calls below is the exact check of the budget.)
	if took := time.Since(start); took > 4*probe+3*time.Second {
		t.Errorf("diagnosis took %v, want at most about 4 probe timeouts (%v)", took, 4*probe)
	}
	sp := r.ShimProbe
	if sp == nil || sp.Sandboxes != 20 || sp.Stuck == 0 || sp.Skipped == 0 || sp.Stuck+sp.Skipped != 20 || sp.Answered != 0 {
		t.Errorf("shim probe = %+v, want some of 20 stuck and the rest not probed", sp)
	}
	if len(r.StuckShims) != sp.Stuck || r.Cause == nil || r.Cause.Pod != r.StuckShims[0].Pod {
		t.Errorf("stuck shims %d, cause %+v", len(r.StuckShims), r.Cause)
	}
	if !regexp.MustCompile(`; the shims of [0-9]+ pods do not answer \(crictl inspectp hangs\): ns/a \(AAAAAAAAAAAAA\), ns/b \(BBBBBBBBBBBBB\), ns/c \(CCCCCCCCCCCCC\), and [0-9]+ more: `).MatchString(r.Verdict) {
		t.Errorf("verdict = %q", r.Verdict)
	}
	f.mu.Lock()
	// At most 3 at once, in the two probe timeouts the budget leaves.
	if n := len(f.verbose); n != sp.Stuck || n > 6 {
		t.Errorf("%d verbose calls, %d stuck; want them equal and at most 6", n, sp.Stuck)
	}
	f.mu.Unlock()
}

// The verbose calls are made at most MaxParallel at once.
func TestShimProbeParallel(t *testing.T) {
	// No verbose call hangs: a probe timeout no loaded machine reaches
	// costs nothing. The listing's calls (ListContainers hangs) are bounded
	// by the client's timeout.
	const probe = 10 * time.Second
	// The verbose calls meet 3 at once before taking their time: made one
	// after another, they would never be 3 in flight.
	f := &shimCRI{hangList: true, delay: 50 * time.Millisecond, rendezvous: 3}
	for i := range 10 {
		f.sandboxes = append(f.sandboxes, sandbox(byte('A'+i), string(rune('a'+i)), true))
	}
	endpoint, c := serveShimCRI(t, f, time.Second)
	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe, MaxParallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	// 3 at once: 4 rounds of at least 50ms.
	if sp := r.ShimProbe; sp == nil || sp.Answered != 10 || sp.TookSeconds < 0.2 {
		t.Errorf("shim probe = %+v, want 10 answered in 4 rounds of 50ms", sp)
	}
	f.mu.Lock()
	if f.maxInflight != 3 {
		t.Errorf("%d verbose calls at once, want 3", f.maxInflight)
	}
	f.mu.Unlock()
}

// ProbeShims makes the probe on a node whose listing answers. A stuck
// shim does not slow the kubelet's relist; the verdict names it all the
// same. Without ProbeShims nothing is probed.
func TestProbeShimsRequested(t *testing.T) {
	const probe = time.Second // room for the calls that answer
	stuck := sandbox('b', "stuck", true)
	f := &shimCRI{sandboxes: []*runtimeapi.PodSandbox{sandbox('a', "fine", true), stuck},
		stuck: map[string]bool{stuck.Id: true}}
	endpoint, c := serveShimCRI(t, f, probe)

	r, err := Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Healthy || r.Cause != nil || r.ShimProbe != nil || r.StuckShims != nil ||
		!regexp.MustCompile(`^relist would take ~\S+ \(threshold 3m0s\): healthy$`).MatchString(r.Verdict) {
		t.Errorf("without ProbeShims: healthy=%v cause=%+v probe=%+v verdict %q", r.Healthy, r.Cause, r.ShimProbe, r.Verdict)
	}
	f.mu.Lock()
	if len(f.verbose) != 0 {
		t.Errorf("without ProbeShims: verbose calls %v", f.verbose)
	}
	f.mu.Unlock()

	r, err = Run(context.Background(), c, Options{Endpoint: endpoint, ProbeTimeout: probe, ProbeShims: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Healthy || len(r.Pods) != 2 {
		t.Errorf("with ProbeShims: healthy=%v pods=%d, want healthy with 2 pods", r.Healthy, len(r.Pods))
	}
	if sp := r.ShimProbe; sp == nil || sp.Reason != ShimProbeRequested || sp.Sandboxes != 2 || sp.Stuck != 1 || sp.Answered != 1 {
		t.Errorf("with ProbeShims: shim probe = %+v", sp)
	}
	if c := r.Cause; c == nil || c.Pod != "ns/stuck" || c.PodUID != "uid-stuck" || c.Call != "PodSandboxStatus" ||
		c.ID != stuck.Id || !c.Hung || c.KubeletSeconds != 0 {
		t.Errorf("with ProbeShims: cause = %+v", r.Cause)
	}
	want := regexp.MustCompile(`^relist would take ~\S+ \(threshold 3m0s\): healthy, but the shim of pod ns/stuck does not answer \(crictl inspectp bbbbbbbbbbbbb hangs\)$`)
	if !want.MatchString(r.Verdict) {
		t.Errorf("with ProbeShims: verdict = %q, want it to match %v", r.Verdict, want)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "of every sandbox, as asked: 2 sandboxes: 1 shim does not answer, 1 answered\n") ||
		!strings.Contains(text.String(), "  pod ns/stuck: its shim does not answer") {
		t.Errorf("with ProbeShims: text:\n%s", text.String())
	}
}

// An interrupted shim probe reports what it did not probe as skipped, not
// as stuck: whether the diagnosis is cancelled while the verbose call
// waits, or its deadline comes before the call's probe timeout.
func TestShimProbeInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name string
		// interrupt returns the diagnosis' context and the hook that
		// sees the stuck verbose call arrive.
		interrupt func(t *testing.T) (context.Context, func(string))
	}{
		{"cancelled", func(t *testing.T) (context.Context, func(string)) {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			return ctx, func(string) { cancel() }
		}},
		// The deadline must leave the listing and the pod's inspection
		// time on a loaded machine; the probe timeout is far beyond it.
		{"deadline", func(t *testing.T) (context.Context, func(string)) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			t.Cleanup(cancel)
			return ctx, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const probe = time.Minute
			stuck := sandbox('b', "stuck", true)
			f := &shimCRI{sandboxes: []*runtimeapi.PodSandbox{stuck}, stuck: map[string]bool{stuck.Id: true}}
			ctx, onVerbose := tc.interrupt(t)
			f.onVerbose = onVerbose
			endpoint, c := serveShimCRI(t, f, probe)
			r, err := Run(ctx, c, Options{Endpoint: endpoint, ProbeTimeout: probe, ProbeShims: true})
			if err == nil {
				t.Fatalf("no error from an interrupted diagnosis: %+v %+v took %v", r.ShimProbe, r.StuckShims, r.TookSeconds)
			}
			if sp := r.ShimProbe; sp == nil || sp.Stuck != 0 || sp.Skipped != 1 || len(r.StuckShims) != 0 {
				t.Errorf("shim probe = %+v, stuck %v", sp, r.StuckShims)
			}
			f.mu.Lock()
			if len(f.verbose) != 1 {
				t.Errorf("verbose calls %v, want the one interrupted", f.verbose)
			}
			f.mu.Unlock()
		})
	}
}

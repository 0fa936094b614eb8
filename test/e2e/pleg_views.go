package e2e

// The three views of the code under test that the scenario tests compare
// with what containerd really did:
//
//   - the library: a pleg.Generator on a cri.Client in this process, read
//     through a Subscription (startLib);
//   - `pleg watch --output json`: one JSON event a line on stdout
//     (startWatch);
//   - `pleg run`: the daemon's HTTP API, its /api/v1/events SSE stream,
//     /api/v1/pods, /healthz, /readyz, /api/v1/relists (startDaemon).
//
// Each view records the lifecycle events it received, with the time it
// received them, in an eventLog. The pleg binary is built once per suite
// run into <suite dir>/bin, so the teardown counts any pleg process left
// behind as ours (see referencesDir).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/metrics"
)

// ---------------------------------------------------------------------------
// The pleg binary.

// PlegBinary (plegimage.go) builds it as deploy/Dockerfile does.

// ---------------------------------------------------------------------------
// Event logs.

// seenEvent is a lifecycle event as one view received it.
type seenEvent struct {
	pleg.Event
	At time.Time // when the view received it
}

func (e seenEvent) String() string {
	s := fmt.Sprintf("%s %.12s", e.Type, e.ContainerID)
	if e.ContainerName != "" {
		s += "(" + e.ContainerName + ")"
	}
	if e.ExitCode != nil {
		s += fmt.Sprintf(" exit=%d", *e.ExitCode)
	}
	return s
}

// eventLog records what one view delivered.
type eventLog struct {
	name string

	mu      sync.Mutex
	events  []seenEvent
	resyncs int
	bad     []string // lines that did not parse
}

func newEventLog(name string) *eventLog { return &eventLog{name: name} }

func (l *eventLog) add(e pleg.Event) {
	now := time.Now()
	l.mu.Lock()
	l.events = append(l.events, seenEvent{Event: e, At: now})
	l.mu.Unlock()
}

func (l *eventLog) addResync() {
	l.mu.Lock()
	l.resyncs++
	l.mu.Unlock()
}

func (l *eventLog) addBad(line string) {
	l.mu.Lock()
	l.bad = append(l.bad, line)
	l.mu.Unlock()
}

func (l *eventLog) all() []seenEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func (l *eventLog) resyncCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.resyncs
}

func (l *eventLog) badLines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.bad)
}

// find returns the first event of type typ for container id.
func (l *eventLog) find(typ pleg.EventType, id string) (seenEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Type == typ && e.ContainerID == id {
			return e, true
		}
	}
	return seenEvent{}, false
}

// index returns the position of the first event of type typ for id, or -1.
func (l *eventLog) index(typ pleg.EventType, id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range l.events {
		if e.Type == typ && e.ContainerID == id {
			return i
		}
	}
	return -1
}

// sequence returns the types of the events for id, in order.
func (l *eventLog) sequence(id string) []pleg.EventType {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pleg.EventType
	for _, e := range l.events {
		if e.ContainerID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

// counts returns how many events of type typ each container ID got.
func (l *eventLog) counts(typ pleg.EventType) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, e := range l.events {
		if e.Type == typ {
			out[e.ContainerID]++
		}
	}
	return out
}

// dump describes the log, for failure messages.
func (l *eventLog) dump() string {
	evs := l.all()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d events, %d resyncs", l.name, len(evs), l.resyncCount())
	if len(evs) > 60 {
		fmt.Fprintf(&b, " (last 60)")
		evs = evs[len(evs)-60:]
	}
	for _, e := range evs {
		fmt.Fprintf(&b, "\n    %s pod=%s/%s", e, e.PodNamespace, e.PodName)
	}
	return b.String()
}

// eventually polls cond every 10 ms until it returns nil, and fails the
// test with cond's last error after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after %v: %v", what, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitEvents waits until every log holds an event of type typ for every
// one of ids.
func waitEvents(t testing.TB, timeout time.Duration, logs []*eventLog, typ pleg.EventType, ids ...string) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%s for %d IDs in %d views", typ, len(ids), len(logs)), func() error {
		var missing []string
		for _, l := range logs {
			n := 0
			for _, id := range ids {
				if _, ok := l.find(typ, id); !ok {
					if n < 5 {
						missing = append(missing, fmt.Sprintf("%s:%.12s", l.name, id))
					}
					n++
				}
			}
			if n > 5 {
				missing = append(missing, fmt.Sprintf("%s: and %d more", l.name, n-5))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("missing %v", missing)
		}
		return nil
	})
}

// ---------------------------------------------------------------------------
// Caches: what a view says about one pod.

// podView is one pod as a cache (or the runtime) describes it: state of
// every sandbox and container it holds, by ID.
type podView struct {
	Name, Namespace string
	Err             string
	Sandboxes       map[string]string // ID -> running, exited, ...
	Containers      map[string]ctrView
}

type ctrView struct {
	Name     string
	Attempt  uint32
	State    string
	ExitCode *int32 // set when exited
}

func (c ctrView) String() string {
	s := fmt.Sprintf("%s#%d %s", c.Name, c.Attempt, c.State)
	if c.ExitCode != nil {
		s += fmt.Sprintf("(%d)", *c.ExitCode)
	}
	return s
}

// diffPods describes how got differs from want ("" if not at all).
func diffPods(want, got podView) string {
	var d []string
	if got.Err != "" {
		d = append(d, "cached inspection error "+got.Err)
	}
	if want.Name != "" && (got.Name != want.Name || got.Namespace != want.Namespace) {
		d = append(d, fmt.Sprintf("pod %s/%s, want %s/%s", got.Namespace, got.Name, want.Namespace, want.Name))
	}
	for id, st := range want.Sandboxes {
		if g, ok := got.Sandboxes[id]; !ok || g != st {
			d = append(d, fmt.Sprintf("sandbox %.12s: %q, want %q", id, g, st))
		}
	}
	for id := range got.Sandboxes {
		if _, ok := want.Sandboxes[id]; !ok {
			d = append(d, fmt.Sprintf("unexpected sandbox %.12s", id))
		}
	}
	for id, w := range want.Containers {
		g, ok := got.Containers[id]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("container %.12s (%s) missing", id, w))
		case g.State != w.State || g.Name != w.Name || g.Attempt != w.Attempt ||
			(w.ExitCode != nil && (g.ExitCode == nil || *g.ExitCode != *w.ExitCode)):
			d = append(d, fmt.Sprintf("container %.12s: %s, want %s", id, g, w))
		}
	}
	for id, g := range got.Containers {
		if _, ok := want.Containers[id]; !ok {
			d = append(d, fmt.Sprintf("unexpected container %.12s (%s)", id, g))
		}
	}
	sort.Strings(d)
	return strings.Join(d, "; ")
}

func criContainerState(s runtimeapi.ContainerState) string {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return "running"
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return "exited"
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return "created"
	default:
		return "unknown"
	}
}

// truthPod is pod uid as containerd itself reports it right now (CRI list
// and status calls of the harness's own client).
func truthPod(t testing.TB, uid string) podView {
	t.Helper()
	v, err := runtimePodView(criCtx(t), RuntimeClient(), uid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// runtimePodView is pod uid as the runtime rt reports it (list calls
// filtered to the pod, a status call per container). A container removed
// between the list and its status call is left out: the view is what the
// runtime has once the call returns.
func runtimePodView(ctx context.Context, rt runtimeapi.RuntimeServiceClient, uid string) (podView, error) {
	sel := map[string]string{labelPodUID: uid}
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: sel}})
	if err != nil {
		return podView{}, fmt.Errorf("ListPodSandbox: %w", err)
	}
	ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: sel}})
	if err != nil {
		return podView{}, fmt.Errorf("ListContainers: %w", err)
	}
	v := podView{Sandboxes: map[string]string{}, Containers: map[string]ctrView{}}
	for _, s := range sbs.Items {
		v.Name, v.Namespace = s.Metadata.Name, s.Metadata.Namespace
		st := "exited"
		if s.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			st = "running"
		}
		v.Sandboxes[s.Id] = st
	}
	for _, c := range ctrs.Containers {
		resp, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return podView{}, fmt.Errorf("ContainerStatus %s: %w", c.Id, err)
		}
		st := resp.Status
		cv := ctrView{Name: st.Metadata.Name, Attempt: st.Metadata.Attempt, State: criContainerState(st.State)}
		if st.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			code := st.ExitCode
			cv.ExitCode = &code
		}
		v.Containers[c.Id] = cv
	}
	return v, nil
}

// podCache is a view that keeps a pod status cache.
type podCache interface {
	cacheName() string
	// cachedPod returns the cached pod uid and whether the cache has it.
	cachedPod(uid string) (podView, bool, error)
}

// waitCached waits until every cache holds pod uid exactly as want.
func waitCached(t testing.TB, timeout time.Duration, caches []podCache, uid string, want podView) {
	t.Helper()
	eventually(t, timeout, "caches match the runtime for pod "+uid, func() error {
		var errs []string
		for _, c := range caches {
			got, ok, err := c.cachedPod(uid)
			switch {
			case err != nil:
				errs = append(errs, c.cacheName()+": "+err.Error())
			case !ok:
				errs = append(errs, c.cacheName()+": pod not cached")
			default:
				if d := diffPods(want, got); d != "" {
					errs = append(errs, c.cacheName()+": "+d)
				}
			}
		}
		if len(errs) > 0 {
			return errors.New(strings.Join(errs, " | "))
		}
		return nil
	})
}

// waitUncached waits until no cache holds pod uid.
func waitUncached(t testing.TB, timeout time.Duration, caches []podCache, uid string) {
	t.Helper()
	eventually(t, timeout, "cache entries of pod "+uid+" gone", func() error {
		for _, c := range caches {
			got, ok, err := c.cachedPod(uid)
			if err != nil {
				return fmt.Errorf("%s: %v", c.cacheName(), err)
			}
			if ok {
				return fmt.Errorf("%s still caches it: %+v", c.cacheName(), got)
			}
		}
		return nil
	})
}

// ---------------------------------------------------------------------------
// The library view.

// libView is a pleg.Generator in this process, on its own CRI client and
// metrics registry, read through a Subscription taken before Start (so its
// log holds every event from an empty view on).
type libView struct {
	name string
	g    *pleg.Generator
	m    *metrics.Metrics
	reg  *prometheus.Registry
	log  *eventLog

	logMu sync.Mutex
	lines []string // the generator's log (V<=2), last 300 lines
}

func (v *libView) cacheName() string { return v.name }

func (v *libView) cachedPod(uid string) (podView, bool, error) {
	e, ok := v.g.Cache().Entry(types.UID(uid))
	if !ok {
		return podView{}, false, nil
	}
	p := podView{Name: e.Status.Name, Namespace: e.Status.Namespace,
		Sandboxes: map[string]string{}, Containers: map[string]ctrView{}}
	if e.Err != nil {
		p.Err = e.Err.Error()
	}
	for _, s := range e.Status.SandboxStatuses {
		p.Sandboxes[s.ID] = s.State.String()
	}
	for _, c := range e.Status.ContainerStatuses {
		cv := ctrView{Name: c.Name, Attempt: c.Attempt, State: c.State.String()}
		if cv.State == "exited" {
			code := c.ExitCode
			cv.ExitCode = &code
		}
		p.Containers[c.ID] = cv
	}
	return p, true, nil
}

func (v *libView) logLine(line string) {
	v.logMu.Lock()
	defer v.logMu.Unlock()
	v.lines = append(v.lines, line)
	if len(v.lines) > 300 {
		v.lines = slices.Clone(v.lines[len(v.lines)-300:])
	}
}

// startLib starts a generator with opts (Runtime, Metrics and Logger are
// set here) against the suite's containerd. A cleanup stops it.
func startLib(t testing.TB, name string, opts pleg.Options) *libView {
	t.Helper()
	v := &libView{name: name, reg: prometheus.NewRegistry(), log: newEventLog(name)}
	v.m = metrics.New(v.reg)
	client, err := cri.Dial(CRIEndpoint(), cri.WithTimeout(10*time.Second), cri.WithMetrics(v.m))
	if err != nil {
		t.Fatal(err)
	}
	opts.Runtime = client
	if g, ok := opts.EventSource.(*gatedSource); ok && g.src == nil {
		g.src = client // TestEventStreamReplay22's gate in front of this client's stream
	}
	opts.Metrics = v.m
	opts.Logger = funcr.New(func(prefix, args string) {
		v.logLine(time.Now().Format("15:04:05.000 ") + prefix + " " + args)
	}, funcr.Options{Verbosity: 2})
	v.g, err = pleg.New(opts)
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	sub := v.g.Subscribe()
	v.g.Start()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			u, err := sub.Next(context.Background())
			if err != nil {
				return
			}
			if u.Resync {
				v.log.addResync()
				continue
			}
			v.log.add(u.Event)
		}
	}()
	t.Cleanup(func() {
		v.g.Stop()
		<-done
		client.Close()
		if t.Failed() {
			v.logMu.Lock()
			t.Logf("%s: generator log (last %d lines):\n  %s", name, len(v.lines), strings.Join(v.lines, "\n  "))
			v.logMu.Unlock()
			t.Logf("%s", v.log.dump())
		}
	})
	return v
}

// waitFirstRelist waits for the generator's first successful relist.
func (v *libView) waitFirstRelist(t testing.TB) {
	t.Helper()
	eventually(t, 10*time.Second, v.name+": first relist", func() error {
		if v.g.LastRelist().IsZero() {
			return errors.New("no successful relist yet")
		}
		return nil
	})
}

// waitStreamConnected waits until the generator's runtime event stream is
// connected.
func (v *libView) waitStreamConnected(t testing.TB) {
	t.Helper()
	eventually(t, 10*time.Second, v.name+": event stream connected", func() error {
		if s := v.g.EventStream(); s.State != pleg.StreamConnected {
			return fmt.Errorf("state %q (last error %q)", s.State, s.LastError)
		}
		return nil
	})
}

// waitStreamState waits until the generator's runtime event stream is in
// state.
func (v *libView) waitStreamState(t testing.TB, state string) {
	t.Helper()
	eventually(t, 10*time.Second, v.name+": event stream "+state, func() error {
		if s := v.g.EventStream(); s.State != state {
			return fmt.Errorf("state %q (last error %q)", s.State, s.LastError)
		}
		return nil
	})
}

// histogramCount returns the sample count of a histogram of the view's
// registry (0 if it has none).
func (v *libView) histogramCount(t testing.TB, name string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := v.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

// metric returns the value of a counter or gauge of the view's registry,
// summed over its label values.
func (v *libView) metric(t testing.TB, name string) float64 {
	t.Helper()
	return v.labelled(t, name, "", "")
}

// ---------------------------------------------------------------------------
// pleg processes.

// plegProc is a running pleg binary. Its stderr is kept; its stdout goes to
// onStdout line by line.
type plegProc struct {
	name   string
	args   []string
	cmd    *exec.Cmd
	done   chan struct{} // closed once it exited and its output is drained
	listen chan string   // the address of the "listening on http://" line

	mu      sync.Mutex
	stderr  []string
	waitErr error
	stopped bool // stop ran
}

var listenRE = regexp.MustCompile(`listening on http://([^\s"]+)`)

// startPleg runs the pleg binary with args. A cleanup stops it with
// SIGTERM (SIGKILL 10 s later) and fails the test if it had already exited
// or does not exit 0.
func startPleg(t testing.TB, name string, onStdout func(string), args ...string) *plegProc {
	t.Helper()
	bin := PlegBinary(t)
	p := &plegProc{name: name, args: args, cmd: exec.Command(bin, args...),
		done: make(chan struct{}), listen: make(chan string, 1)}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting pleg %s: %v", strings.Join(args, " "), err)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 8<<20)
		for sc.Scan() {
			if onStdout != nil {
				onStdout(sc.Text())
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 8<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr = append(p.stderr, line)
			p.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				select {
				case p.listen <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	go func() {
		readers.Wait()
		err := p.cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *plegProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// requireRunning fails the test if the process has exited.
func (p *plegProc) requireRunning(t testing.TB) {
	t.Helper()
	if p.exited() {
		t.Fatalf("%s exited: %v\nstderr:\n%s", p.name, p.exitErr(), p.stderrTail(40))
	}
}

func (p *plegProc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

func (p *plegProc) stderrLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.stderr)
}

func (p *plegProc) stderrTail(n int) string {
	l := p.stderrLines()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return "  | " + strings.Join(l, "\n  | ")
}

// waitStderr waits until the process logged a line containing s.
func (p *plegProc) waitStderr(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, p.name+": log line "+s, func() error {
		for _, l := range p.stderrLines() {
			if strings.Contains(l, s) {
				return nil
			}
		}
		if p.exited() {
			t.Fatalf("%s exited: %v\nstderr:\n%s", p.name, p.exitErr(), p.stderrTail(40))
		}
		return errors.New("not logged yet")
	})
}

// stop stops the process with SIGTERM (SIGKILL 10 s later) and fails the
// test if it had exited by itself or does not exit 0. Later calls do
// nothing.
func (p *plegProc) stop(t testing.TB) {
	p.mu.Lock()
	stopped := p.stopped
	p.stopped = true
	p.mu.Unlock()
	if stopped {
		return
	}
	if p.exited() {
		t.Errorf("%s (pleg %s) exited before the end of the test: %v\nstderr:\n%s",
			p.name, strings.Join(p.args, " "), p.exitErr(), p.stderrTail(40))
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if err := p.exitErr(); err != nil {
			t.Errorf("%s: exit after SIGTERM: %v, want exit code 0\nstderr:\n%s", p.name, err, p.stderrTail(40))
		}
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not exit within 10s of SIGTERM; killed\nstderr:\n%s", p.name, p.stderrTail(40))
	}
	if t.Failed() {
		t.Logf("%s (pleg %s) stderr:\n%s", p.name, strings.Join(p.args, " "), p.stderrTail(80))
	}
}

// watchView is `pleg watch --output json`: its stdout, one event a line.
type watchView struct {
	*plegProc
	log *eventLog
}

// startWatch runs `pleg watch --output json -r <endpoint>` with extra args.
func startWatch(t testing.TB, name string, args ...string) *watchView {
	t.Helper()
	w := &watchView{log: newEventLog(name)}
	all := append([]string{"watch", "--output", "json", "-r", CRIEndpoint()}, args...)
	w.plegProc = startPleg(t, name, func(line string) {
		var e pleg.Event
		var raw map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			w.log.addBad(line)
			return
		}
		if err := json.Unmarshal([]byte(line), &raw); err != nil || raw["type"] == nil || raw["podUID"] == nil || raw["time"] == nil {
			w.log.addBad(line)
			return
		}
		w.log.add(e)
	}, all...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", w.log.dump())
		}
	})
	return w
}

// daemonView is `pleg run`: its HTTP API and its SSE event stream, read
// from the moment it is up.
type daemonView struct {
	*plegProc
	base string
	log  *eventLog
}

// startDaemon runs `pleg run -r <endpoint> --listen-address 127.0.0.1:0`
// with extra args, reads its address from the log and subscribes to
// /api/v1/events; it returns once the stream's first resync arrived.
func startDaemon(t testing.TB, name string, args ...string) *daemonView {
	t.Helper()
	return startDaemonOn(t, name, CRIEndpoint(), args...)
}

// startDaemonOn is startDaemon on the runtime at endpoint rather than the
// suite's (for tests that run at once, each on a runtime of its own,
// without useEnv).
func startDaemonOn(t testing.TB, name, endpoint string, args ...string) *daemonView {
	t.Helper()
	// A lifecycle socket of its own (the default is /run/pleg/pleg.sock).
	all := append([]string{"run", "-r", endpoint, "--listen-address", "127.0.0.1:0",
		"--lifecycle-socket", filepath.Join(t.TempDir(), "pleg.sock")}, args...)
	d := &daemonView{plegProc: startPleg(t, name, nil, all...)}
	select {
	case addr := <-d.listen:
		d.base = "http://" + addr
	case <-d.done:
		t.Fatalf("%s exited: %v\nstderr:\n%s", name, d.exitErr(), d.stderrTail(40))
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no \"listening on\" line within 30s\nstderr:\n%s", name, d.stderrTail(40))
	}
	d.log = followEvents(t, d.base, name)
	return d
}

// followEvents subscribes to the /api/v1/events of the pleg at api until
// the test ends and returns the log of what it delivers, once the
// stream's first resync arrived.
func followEvents(t testing.TB, api, name string) *eventLog {
	t.Helper()
	d := &daemonView{base: api, log: newEventLog(name)}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/api/v1/events", nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("%s: GET /api/v1/events: %v", name, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		cancel()
		t.Fatalf("%s: GET /api/v1/events: %s, Content-Type %q", name, resp.Status, resp.Header.Get("Content-Type"))
	}
	sseDone := make(chan struct{})
	go func() {
		defer close(sseDone)
		defer resp.Body.Close()
		d.readSSE(resp.Body)
	}()
	t.Cleanup(func() {
		cancel()
		<-sseDone
		if t.Failed() {
			t.Logf("%s", d.log.dump())
		}
	})
	eventually(t, 10*time.Second, name+": first SSE resync", func() error {
		if d.log.resyncCount() == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	return d.log
}

// readSSE parses the lifecycle stream's Server-Sent Events
// (docs/stream.md): "snapshot-end" counts as the view's resync (and
// "resync-required", which ends the stream), each transition of an
// "event" is one event (its data: the protojson of a WatchResponse);
// snapshots, bookmarks, runtime status, ids and heartbeats are read past.
func (d *daemonView) readSSE(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var event, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			switch event {
			case "", "snapshot", "bookmark", "runtime-status":
			case "snapshot-end", "resync-required":
				d.log.addResync()
			case "event":
				var msg lifecyclev1.WatchResponse
				if err := protojson.Unmarshal([]byte(data), &msg); err != nil || msg.GetEvent() == nil {
					d.log.addBad("event: " + data)
					break
				}
				for _, e := range streamEvents(&msg) {
					d.log.add(e)
				}
			default:
				d.log.addBad("event " + event + ": " + data)
			}
			event, data = "", ""
		case strings.HasPrefix(line, ":"), line == "id", strings.HasPrefix(line, "id: "), strings.HasPrefix(line, "retry: "):
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		default:
			d.log.addBad(line)
		}
	}
}

// streamEvents are the kubelet-style events of a stream's pod event:
// one a transition (PodUpdated, which fills in optional fields, is none).
func streamEvents(msg *lifecyclev1.WatchResponse) []pleg.Event {
	kinds := map[lifecyclev1.EventType]pleg.EventType{
		lifecyclev1.EventType_CONTAINER_STARTED: pleg.ContainerStarted,
		lifecyclev1.EventType_CONTAINER_DIED:    pleg.ContainerDied,
		lifecyclev1.EventType_CONTAINER_REMOVED: pleg.ContainerRemoved,
		lifecyclev1.EventType_POD_SYNC:          pleg.PodSync,
	}
	ev := msg.GetEvent()
	var out []pleg.Event
	for _, t := range ev.GetTransitions() {
		typ, ok := kinds[t.GetType()]
		if !ok {
			continue
		}
		e := pleg.Event{Time: msg.GetTime().AsTime(), Type: typ, PodUID: types.UID(ev.GetPod().GetUid()),
			PodName: ev.GetPod().GetName(), PodNamespace: ev.GetPod().GetNamespace(), ContainerID: t.GetContainerId(),
			ContainerName: t.GetContainerName(), Sandbox: t.GetSandbox()}
		if t.ExitCode != nil {
			code := t.GetExitCode()
			e.ExitCode = &code
		}
		out = append(out, e)
	}
	return out
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// get fetches path from the daemon.
func (d *daemonView) get(path string) (int, []byte, error) {
	resp, err := httpClient.Get(d.base + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// getJSON fetches path and decodes its JSON body into v.
func (d *daemonView) getJSON(path string, v any) (int, error) {
	code, b, err := d.get(path)
	if err != nil {
		return code, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return code, fmt.Errorf("GET %s: %v: %s", path, err, b)
	}
	return code, nil
}

// readyzBody is /readyz as a client reads it.
type readyzBody struct {
	Type    string   `json:"type"`
	Status  string   `json:"status"`
	Reason  string   `json:"reason"`
	Message string   `json:"message"`
	Errors  []string `json:"errors"`
	Details struct {
		LastRelist  string `json:"lastRelist"`
		EventStream struct {
			Mode      string `json:"mode"`
			State     string `json:"state"`
			Connects  int64  `json:"connects"`
			Events    int64  `json:"events"`
			LastError string `json:"lastError"`
		} `json:"eventStream"`
	} `json:"details"`
}

func (d *daemonView) readyz(t testing.TB) (int, readyzBody) {
	t.Helper()
	var body readyzBody
	code, err := d.getJSON("/readyz", &body)
	if err != nil {
		t.Fatalf("%s: /readyz: %v", d.name, err)
	}
	return code, body
}

func (d *daemonView) cacheName() string { return d.name + " /api/v1/pods" }

func (d *daemonView) allPods() (httpapi.PodsBody, error) {
	var body httpapi.PodsBody
	code, err := d.getJSON("/api/v1/pods", &body)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/api/v1/pods: HTTP %d", code)
	}
	return body, err
}

func (d *daemonView) cachedPod(uid string) (podView, bool, error) {
	body, err := d.allPods()
	if err != nil {
		return podView{}, false, err
	}
	for _, p := range body.Pods {
		if p.UID != uid {
			continue
		}
		v := podView{Name: p.Name, Namespace: p.Namespace, Err: p.Error,
			Sandboxes: map[string]string{}, Containers: map[string]ctrView{}}
		for _, s := range p.Sandboxes {
			v.Sandboxes[s.ID] = s.State
		}
		for _, c := range p.Containers {
			v.Containers[c.ID] = ctrView{Name: c.Name, Attempt: c.Attempt, State: c.State, ExitCode: c.ExitCode}
		}
		return v, true, nil
	}
	return podView{}, false, nil
}

// healthz returns /healthz's status code and body.
func (d *daemonView) healthz(t testing.TB) (int, string) {
	t.Helper()
	code, b, err := d.get("/healthz")
	if err != nil {
		t.Fatalf("%s: /healthz: %v", d.name, err)
	}
	return code, string(b)
}

// ---------------------------------------------------------------------------
// Running harness helpers from several goroutines.

// goroutineTB lets harness helpers run on a goroutine other than the
// test's: Fatal* record the failure and end only that goroutine.
type goroutineTB struct{ testing.TB }

func (g goroutineTB) Fatalf(format string, args ...any) {
	g.TB.Helper()
	g.TB.Errorf(format, args...)
	goruntime.Goexit()
}

func (g goroutineTB) Fatal(args ...any) {
	g.TB.Helper()
	g.TB.Error(args...)
	goruntime.Goexit()
}

func (g goroutineTB) FailNow() {
	g.TB.Fail()
	goruntime.Goexit()
}

// inParallel runs fn(tb, i) for i in [0, n) on `workers` goroutines and
// fails the test (from its own goroutine) if any of them failed.
func inParallel(t testing.TB, n, workers int, fn func(tb testing.TB, i int)) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				func() {
					done := make(chan struct{})
					go func() {
						defer close(done)
						fn(goroutineTB{t}, i)
					}()
					<-done
				}()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// ms formats a duration in milliseconds with 0.1 ms precision.
func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// labelled returns the value of a counter (or the count of a histogram)
// of a library view's registry with label name=value ("" name: any).
func (v *libView) labelled(t testing.TB, metric, name, value string) float64 {
	t.Helper()
	mfs, err := v.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return labelled(byName, metric, name, value)
}

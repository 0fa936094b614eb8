package stream

// Faults, each with nothing lost, against real `pleg run` processes on the
// simulated runtime: pleg restarted under its subscribers, a subscriber
// that stops reading, 1,000 idle subscribers. (containerd restarted
// mid-stream is in test/e2e: it needs the real runtime.)

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/journal"
)

// record is what a client.Handler was given, in order.
type record struct {
	kind   string // "resync", "event", "runtime"
	cursor string
	pods   map[string]podView // resync
	ev     *lifecyclev1.PodEvent
	state  lifecyclev1.RuntimeState
}

// recorder is a client.Handler that keeps every call.
type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (r *recorder) add(rec record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) OnResync(pods []*lifecyclev1.Pod, at client.Position) {
	m := map[string]podView{}
	for _, p := range pods {
		m[p.GetUid()] = viewOfPod(p)
	}
	r.add(record{kind: "resync", cursor: at.Cursor, pods: m})
}

func (r *recorder) OnEvent(ev *lifecyclev1.PodEvent, at client.Position) {
	r.add(record{kind: "event", cursor: at.Cursor, ev: ev})
}

func (r *recorder) OnRuntimeStatus(st *lifecyclev1.RuntimeStatus, at client.Position) {
	r.add(record{kind: "runtime", cursor: at.Cursor, state: st.GetState()})
}

func (r *recorder) records() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// view is the handler's pods after its last resync and the events since,
// and how many resyncs it had.
func (r *recorder) view() (pods map[string]podView, resyncs int) {
	for _, rec := range r.records() {
		switch rec.kind {
		case "resync":
			pods = maps.Clone(rec.pods)
			resyncs++
		case "event":
			if rec.ev.GetPod().GetGone() {
				delete(pods, rec.ev.GetPod().GetUid())
			} else {
				pods[rec.ev.GetPod().GetUid()] = viewOfPod(rec.ev.GetPod())
			}
		}
	}
	return pods, resyncs
}

// runClient runs a client.Client with h until the test ends.
func runClient(t testing.TB, o client.Options, h client.Handler) *client.Client {
	t.Helper()
	o.Logger = logr.Discard()
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("client.Run: %v", err)
		}
		c.Close()
	})
	return c
}

// TestPLEGRestartedUnderSubscribers: pleg stops while a Go client (the
// client package) and the Node client watch; the node changes while it is
// down; a new pleg starts on the same socket. The new instance's epoch
// makes both cursors unresumable: each gets an explicit resync_required
// (the Go client then a fresh snapshot), and from there every transition,
// and both end with exactly the runtime's pods.
func TestPLEGRestartedUnderSubscribers(t *testing.T) {
	r := startSim(t, sim.Config{Seed: 31, Pods: 6, ContainersPerPod: 2, ChurnPerStep: 2})
	sock := filepath.Join(shortDir(t), "pleg.sock")
	a := startPleg(t, r.Endpoint(), sock)
	settle(t, r, a)
	rec := &recorder{}
	c := runClient(t, client.Options{Address: sock, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}, rec)
	churn(t, r, a, 1)
	headA := headCursor(t, sock)
	poll(t, "the Go client reaches pleg A's head", func() bool { return c.Cursor() == headA })
	oldCursor := c.Cursor()
	if code := a.stop(); code != 0 {
		t.Fatalf("pleg A exited with %d", code)
	}

	// While pleg is down: a container dies, one restarts, a pod goes, one comes.
	pods := r.Pods()
	victim := pods[0]
	for _, ct := range victim.Containers {
		if ct.State.String() == "CONTAINER_RUNNING" {
			must(t, r.ExitContainer(ct.ID, 7))
			break
		}
	}
	must(t, r.StopPod(pods[1].UID))
	must(t, r.RemovePod(pods[1].UID))
	_, err := r.AddPod(sim.PodSpec{Name: "during-outage", Namespace: "agents", Containers: []string{"app"}, Behaviour: sim.Steady})
	must(t, err)

	b := startPleg(t, r.Endpoint(), sock)
	settle(t, r, b)
	// An explicit resync_required for the old cursor, on the wire.
	w := startGoWatch(t, sock, oldCursor)
	poll(t, "resync_required for pleg A's cursor", func() bool {
		msgs, _ := w.snapshot()
		return len(msgs) > 0
	})
	msgs, _ := w.snapshot()
	if rr := msgs[0].GetResyncRequired(); rr == nil || rr.GetReason() != journal.ReasonOtherEpoch {
		t.Fatalf("pleg B answered pleg A's cursor with %v, want resync_required (%q)", msgs[0], journal.ReasonOtherEpoch)
	}
	// The Node client, from pleg A's cursor, too.
	if m := startNode(t, sock, "watch", "--cursor", oldCursor).next(); m.ResyncRequired == nil {
		t.Fatalf("the node client resuming from pleg A's cursor got %+v, want resync_required", m)
	}

	// After the restart: more changes, each seen.
	churn(t, r, b, 2)
	headB := headCursor(t, sock)
	poll(t, "the Go client reaches pleg B's head", func() bool { return c.Cursor() == headB })
	if st := c.Stats(); st.Resyncs != 1 {
		t.Errorf("the Go client was told to resync %d times, want 1 (stats %+v)", st.Resyncs, st)
	}
	view, resyncs := rec.view()
	if resyncs != 2 {
		t.Fatalf("the Go client had %d snapshots, want 2 (the first watch's and pleg B's)", resyncs)
	}
	want := cachePods(t, b.base)
	if !maps.EqualFunc(view, want, podViewEqual) || !maps.EqualFunc(want, simPods(r), podViewEqual) {
		t.Errorf("after the restart the Go client shows\n%v\npleg B's pod API\n%v\nthe runtime\n%v", view, want, simPods(r))
	}
	// From pleg B's snapshot on, every entry once: consecutive sequence
	// numbers in B's epoch.
	recs := rec.records()
	var from int
	for i, rc := range recs {
		if rc.kind == "resync" {
			from = i
		}
	}
	epochB := strings.SplitN(headB, "-", 2)[0]
	if !strings.HasPrefix(recs[from].cursor, epochB+"-") || strings.HasPrefix(oldCursor, epochB+"-") {
		t.Fatalf("pleg B's snapshot cursor %s, pleg A's %s: want B's epoch %s, A's another", recs[from].cursor, oldCursor, epochB)
	}
	next := seqOf(t, recs[from].cursor) + 1
	for _, rc := range recs[from+1:] {
		if s := seqOf(t, rc.cursor); s != next {
			t.Fatalf("after pleg B's snapshot: sequence %d, want %d", s, next)
		}
		next++
	}
	if next-1 != seqOf(t, headB) {
		for _, rc := range recs[from:] {
			t.Logf("%s %s %v %v", rc.cursor, rc.kind, rc.ev.GetTransitions(), rc.state)
		}
		t.Fatalf("the Go client ended at %d, pleg B's head is %s", next-1, headB)
	}
}

// TestStalledSubscriberResumes: a subscriber that stops reading while the
// node churns is cut (ResourceExhausted, WATCHER_NOT_READING, after the
// stall timeout) without slowing anyone; when it reads again it gets what
// was sent before the cut, resumes from the last message it read, and
// ends with every entry once, the same as a subscriber that never
// stopped.
func TestStalledSubscriberResumes(t *testing.T) {
	r := startSim(t, sim.Config{Seed: 41, Pods: 40, ContainersPerPod: 3, ChurnPerStep: 20})
	p := startPleg(t, r.Endpoint(), "", "--lifecycle-stall-timeout", "1s")
	settle(t, r, p)
	ref := startGoWatch(t, p.socket, "")

	// Small flow-control windows (no BDP growth), so that the stall shows
	// after a few hundred kilobytes.
	conn, err := grpc.NewClient("unix://"+p.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	must(t, err)
	defer conn.Close()
	api := lifecyclev1.NewLifecycleClient(conn)
	// A bound on the Recv loops below: a watch that is never cut, or a
	// resumed one that stops short of the head, fails instead of hanging
	// until go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 4*patience)
	defer cancel()
	stream, err := api.Watch(ctx, &lifecyclev1.WatchRequest{})
	must(t, err)
	var got []*lifecyclev1.WatchResponse
	for {
		m, err := stream.Recv()
		must(t, err)
		got = append(got, m)
		if m.GetSnapshotEnd() != nil {
			break
		}
	}
	snapshotEnd := seqOf(t, got[len(got)-1].GetCursor())

	// Stop reading; churn until pleg says it cut a watcher.
	deadline := time.Now().Add(patience)
	for cuts := 0.0; cuts < 1; cuts = metricValue(t, p.base, "pleg_lifecycle_watcher_cuts_total") {
		if time.Now().After(deadline) {
			t.Fatalf("a subscriber reading nothing was not cut within %v", patience)
		}
		r.Step()
		settle(t, r, p)
	}
	settle(t, r, p)
	head := headCursor(t, p.socket)

	// Read again: what was sent before the cut, then the cut.
	var endErr error
	for {
		m, err := stream.Recv()
		if err != nil {
			endErr = err
			break
		}
		got = append(got, m)
	}
	if status.Code(endErr) != codes.ResourceExhausted {
		t.Fatalf("the stalled watch ended with %v, want ResourceExhausted", endErr)
	}
	if reason, cur := client.Reason(endErr); reason != lifecyclev1.ReasonNotReading || cur == "" {
		t.Fatalf("the cut's reason %q cursor %q, want %s and a cursor", reason, cur, lifecyclev1.ReasonNotReading)
	}
	cutAt := len(got)
	resume := got[len(got)-1].GetCursor()
	stream, err = api.Watch(ctx, &lifecyclev1.WatchRequest{Cursor: resume})
	must(t, err)
	for seqOf(t, got[len(got)-1].GetCursor()) < seqOf(t, head) {
		m, err := stream.Recv()
		must(t, err)
		got = append(got, m)
	}

	next := snapshotEnd + 1
	var events []*lifecyclev1.WatchResponse
	for _, m := range got {
		if m.GetEvent() == nil && m.GetRuntimeStatus() == nil {
			continue
		}
		if s := seqOf(t, m.GetCursor()); s != next {
			t.Fatalf("sequence %d, want %d (a gap or a duplicate around the cut)", s, next)
		}
		next++
		events = append(events, m)
	}
	var refEvents []*lifecyclev1.WatchResponse
	poll(t, "the reference watcher reaches the head", func() bool {
		msgs, err := ref.snapshot()
		must(t, err)
		refEvents = refEvents[:0]
		for _, m := range msgs {
			if (m.GetEvent() != nil || m.GetRuntimeStatus() != nil) && seqOf(t, m.GetCursor()) > snapshotEnd {
				refEvents = append(refEvents, m)
			}
		}
		return len(refEvents) > 0 && seqOf(t, refEvents[len(refEvents)-1].GetCursor()) >= seqOf(t, head)
	})
	if len(refEvents) != len(events) {
		t.Fatalf("the stalled subscriber got %d events, the reference %d", len(events), len(refEvents))
	}
	for i := range events {
		if goEntryView(events[i]) != goEntryView(refEvents[i]) {
			t.Fatalf("event %d differs:\nstalled   %s\nreference %s", i, goEntryView(events[i]), goEntryView(refEvents[i]))
		}
	}
	t.Logf("stalled subscriber: cut after %d messages (%d events in all, resumed from %s)", cutAt, len(events), resume)
}

// metricValue reads one unlabelled sample (or the sum of a metric's
// samples) from pleg's /metrics.
func metricValue(t testing.TB, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != ' ' && l[len(name)] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// relistStarts returns the start times of pleg's recent relists.
func relistStarts(t testing.TB, base string) []time.Time {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/relists")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Relists []struct {
			Start string `json:"start"`
		} `json:"relists"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, r := range body.Relists {
		ts, err := time.Parse(time.RFC3339Nano, r.Start)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ts)
	}
	return out
}

// procRSS is a process's resident memory in bytes.
func procRSS(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// idleSubscribers is how many subscribers TestIdleSubscribers opens.
const idleSubscribers = 1000

// TestIdleSubscribers: 1,000 subscribers, each on its own connection,
// watching a namespace where nothing happens (they get their snapshot's
// end, then a bookmark every 10 s) while the node churns: every journal
// entry wakes each of them, to be filtered out. pleg's memory per
// subscriber is measured (resident memory before and after) and bounded,
// and the relist keeps its period.
func TestIdleSubscribers(t *testing.T) {
	const period = 100 * time.Millisecond
	r := startSim(t, sim.Config{Seed: 51, Pods: 30, ContainersPerPod: 2, ChurnPerStep: 2})
	p := startPleg(t, r.Endpoint(), "")
	settle(t, r, p)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx, 50*time.Millisecond) }()

	// intervals waits for n more relists and returns their intervals.
	// relists returns the start times of the next n+1 relists.
	relists := func(n int) []time.Time {
		t.Helper()
		start := time.Now()
		var starts []time.Time
		poll(t, fmt.Sprintf("%d relists", n), func() bool {
			starts = starts[:0]
			for _, s := range relistStarts(t, p.base) {
				if s.After(start) {
					starts = append(starts, s)
				}
			}
			return len(starts) > n
		})
		return starts
	}
	sorted := func(starts []time.Time) []time.Duration {
		var out []time.Duration
		for i := 1; i < len(starts); i++ {
			out = append(out, starts[i].Sub(starts[i-1]))
		}
		slices.Sort(out)
		return out
	}
	intervals := func(n int) []time.Duration { return sorted(relists(n)) }
	pct := func(d []time.Duration, q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }

	pid := p.cmd.Process.Pid
	cpuBase := procCPU(t, pid)
	base := intervals(30)
	cpu0 := procCPU(t, pid)
	rss0 := procRSS(t, pid)

	type sub struct {
		conn   *grpc.ClientConn
		bmarks int
	}
	subs := make([]*sub, idleSubscribers)
	var mu sync.Mutex
	bookmarks := 0
	ready := make(chan struct{}, idleSubscribers)
	failed := make(chan error, idleSubscribers)
	for i := range subs {
		conn, err := grpc.NewClient("unix://"+p.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		must(t, err)
		t.Cleanup(func() { conn.Close() })
		subs[i] = &sub{conn: conn}
		stream, err := lifecyclev1.NewLifecycleClient(conn).Watch(ctx, &lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{Namespaces: []string{"idle"}}})
		must(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := stream.Recv()
				if err != nil {
					if ctx.Err() == nil {
						failed <- err
					}
					return
				}
				switch {
				case m.GetSnapshotEnd() != nil:
					ready <- struct{}{}
				case m.GetBookmark() != nil:
					mu.Lock()
					bookmarks++
					mu.Unlock()
				case m.GetEvent() != nil:
					failed <- fmt.Errorf("an idle subscriber got an event: %v", m)
					return
				}
			}
		}()
	}
	for range idleSubscribers {
		select {
		case <-ready:
		case err := <-failed:
			t.Fatalf("a subscriber failed: %v", err)
		case <-time.After(patience):
			t.Fatal("not every subscriber got its snapshot's end")
		}
	}
	if n := metricValue(t, p.base, "pleg_lifecycle_watchers"); n != idleSubscribers {
		t.Fatalf("pleg_lifecycle_watchers = %v, want %d", n, idleSubscribers)
	}
	rss1 := procRSS(t, pid)
	cpu1 := procCPU(t, pid)
	waits := sampleRunQueueWait(t, pid, 5*time.Millisecond)
	starts := relists(30)
	waitSamples := waits()
	withSubs := sorted(starts)
	cpu2 := procCPU(t, pid)
	rss2 := procRSS(t, pid)
	select {
	case err := <-failed:
		t.Fatalf("a subscriber failed: %v", err)
	default:
	}
	mu.Lock()
	bm := bookmarks
	mu.Unlock()

	perSub := (max(rss1, rss2) - rss0) / idleSubscribers
	t.Logf("MEASURE idle_subscribers=%d rss_before=%.1fMiB rss_with=%.1fMiB per_subscriber=%.1fKiB relist_interval p50=%v p99=%v max=%v (without: p50=%v p99=%v max=%v) pleg_cpu=%v over %d relists (without subscribers: %v over the 30 before) run_queue_wait=%v bookmarks=%d",
		idleSubscribers, float64(rss0)/(1<<20), float64(max(rss1, rss2))/(1<<20), float64(perSub)/1024,
		pct(withSubs, 0.5), pct(withSubs, 0.99), withSubs[len(withSubs)-1], pct(base, 0.5), pct(base, 0.99), base[len(base)-1],
		cpu2-cpu1, len(withSubs), cpu0-cpuBase, waitSamples.between(starts[0], starts[len(starts)-1]), bm)
	// Bounds: a subscriber's connection, stream and goroutines.
	if perSub > 128<<10 {
		t.Errorf("pleg's memory per idle subscriber is %d KiB, want at most 128 KiB", perSub>>10)
	}
	// The relist keeps its period: its median interval stays within 25%
	// of the one measured just before without subscribers (the test's own
	// 1,000 clients share the machine's cores with pleg), and no relist
	// waits more than three periods or twice the longest wait without.
	// The same exoneration as for the longest one below: the median of
	// each interval less the time pleg's threads waited for a CPU in it
	// (the load harness's hog and the other suites took 25 % and more
	// from it, seen at a run-queue wait of 4.4 s over the 30 intervals).
	if m, b := pct(withSubs, 0.5), pct(base, 0.5); m > b*5/4 {
		var net []time.Duration
		for i := 1; i < len(starts); i++ {
			net = append(net, max(0, starts[i].Sub(starts[i-1])-waitSamples.between(starts[i-1], starts[i])))
		}
		slices.Sort(net)
		if n := pct(net, 0.5); n > b*5/4 {
			t.Errorf("with %d subscribers the median relist interval is %v, without %v: more than 25%% longer, and %v less the time pleg's threads waited for a CPU", idleSubscribers, m, b, n)
		} else {
			t.Logf("with %d subscribers the median relist interval is %v, without %v; less the time pleg's threads waited for a CPU in each, %v: the machine held it up", idleSubscribers, m, b, n)
		}
	}
	// A relist that waited longer is a failure unless the machine, not
	// pleg, held it up: the suites share two cores, and a process starved
	// of CPU by the others shows it as time its threads spent runnable on
	// a run queue. pleg's own blocking (a lock held while 1,000 watchers
	// are served) spends no time there, and fails.
	if m, b := withSubs[len(withSubs)-1], base[len(base)-1]; m > max(3*period, 2*b) {
		for i := 1; i < len(starts); i++ {
			d := starts[i].Sub(starts[i-1])
			if d <= max(3*period, 2*b) {
				continue
			}
			waited := waitSamples.between(starts[i-1], starts[i])
			if excess := d - b; waited < excess {
				t.Errorf("with %d subscribers a relist interval was %v: more than 3 periods and twice the longest without (%v); pleg's threads waited %v for a CPU in it, less than the %v it cannot explain",
					idleSubscribers, d, b, waited, excess)
			} else {
				t.Logf("with %d subscribers a relist interval was %v (the longest without: %v); pleg's threads waited %v for a CPU in it: the machine held it up", idleSubscribers, d, b, waited)
			}
		}
	}
}

// waitSamples are a process's run-queue waits (runQueueWait) over time.
type waitSamples []struct {
	at     time.Time
	waited time.Duration
}

// between is the wait accumulated from the last sample at or before from
// to the first at or after to: at least the wait between them.
func (w waitSamples) between(from, to time.Time) time.Duration {
	lo, hi := 0, len(w)-1
	for i, s := range w {
		if !s.at.After(from) {
			lo = i
		}
		if !s.at.Before(to) {
			hi = i
			break
		}
	}
	if len(w) == 0 || hi < lo {
		return 0
	}
	return w[hi].waited - w[lo].waited
}

// sampleRunQueueWait samples process pid's run-queue wait every period
// until the function it returns is called, which returns the samples.
func sampleRunQueueWait(t testing.TB, pid int, period time.Duration) func() waitSamples {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan waitSamples)
	go func() {
		var out waitSamples
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			out = append(out, struct {
				at     time.Time
				waited time.Duration
			}{time.Now(), runQueueWait(pid)})
			select {
			case <-stop:
				done <- out
				return
			case <-tick.C:
			}
		}
	}()
	return func() waitSamples {
		close(stop)
		return <-done
	}
}

// runQueueWait is how long the threads of process pid have spent runnable
// but waiting for a CPU (schedstat's second field, summed over threads).
// Threads that have ended are not counted.
func runQueueWait(pid int) time.Duration {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if w := strings.Fields(string(b)); len(w) >= 2 {
			ns, _ := strconv.ParseInt(w[1], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// procCPU is a process's user and system CPU time.
func procCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces): utime and stime
	// are the 14th and 15th fields of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

package stream

// A client in another language: test/clients/node/lifecycle.js, built only
// from Node's @grpc/grpc-js and @grpc/proto-loader (exact versions pinned
// in its package.json and package-lock.json) and the repository's
// api/lifecycle/v1/lifecycle.proto, against a real `pleg run` relisting the
// simulated runtime. test/clients/node's Go package (nodeclient) installs
// node and the npm packages when they are missing.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/journal"
	nodeclient "github.com/podlifecycle/pleg/test/clients/node"
)

// ensureNode returns the node binary and the node_modules directory of
// test/clients/node's locked dependencies, installing them when needed
// (nodeclient.Ensure).
func ensureNode(t testing.TB) (node, modules string) {
	t.Helper()
	node, modules, err := nodeclient.Ensure(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	return node, modules
}

// aptInstall installs Debian packages through test/apt-install.sh.
func aptInstall(root string, pkgs ...string) error { return nodeclient.AptInstall(root, pkgs...) }

// nodeMsg is one line of lifecycle.js: a WatchResponse as proto-loader
// gives it (the .proto's field names, enums as names, int64 as strings,
// "message" naming the oneof's field), or the client's own end lines.
type nodeMsg struct {
	Cursor   string   `json:"cursor"`
	Message  string   `json:"message"`
	Snapshot *nodePod `json:"snapshot"`
	Event    *struct {
		Pod         nodePod `json:"pod"`
		Transitions []struct {
			Type          string `json:"type"`
			ContainerID   string `json:"container_id"`
			ContainerName string `json:"container_name"`
			Sandbox       bool   `json:"sandbox"`
			ExitCode      int32  `json:"exit_code"`
			HasExitCode   string `json:"_exit_code"`
		} `json:"transitions"`
		Source string `json:"source"`
	} `json:"event"`
	RuntimeStatus *struct {
		State string `json:"state"`
	} `json:"runtime_status"`
	ResyncRequired *struct {
		Reason string `json:"reason"`
	} `json:"resync_required"`
	Closed *struct {
		Cursor string `json:"cursor"`
	} `json:"closed"`
	End *struct {
		Code    int    `json:"code"`
		Details string `json:"details"`
		// With --follow: the cursor it resumes from, and when.
		Resume  string `json:"resume"`
		RetryMs *int   `json:"retry_ms"`
	} `json:"end"`
	// With --follow: it watches again without a cursor.
	Resync *struct {
		Reason string `json:"reason"`
		Cursor string `json:"cursor"`
	} `json:"resync"`
}

type nodePod struct {
	UID       string `json:"uid"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Gone      bool   `json:"gone"`
	Sandboxes []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"sandboxes"`
	Containers []struct {
		ID          string `json:"id"`
		Name        string `json:"name"`
		State       string `json:"state"`
		ExitCode    int32  `json:"exit_code"`
		HasExitCode string `json:"_exit_code"`
	} `json:"containers"`
}

func (p *nodePod) view() podView {
	v := podView{Name: p.Namespace + "/" + p.Name, Items: map[string]string{}}
	for _, s := range p.Sandboxes {
		v.Items[s.ID] = "sandbox " + protoState(s.State)
	}
	for _, c := range p.Containers {
		var exit *int32
		if c.HasExitCode == "exit_code" {
			e := c.ExitCode
			exit = &e
		}
		v.Items[c.ID] = itemView(c.Name, protoState(c.State), exit)
	}
	return v
}

// entryView is a message reduced to what two clients must agree on.
func (m *nodeMsg) entryView() string {
	switch {
	case m.Event != nil:
		var ts []string
		for _, tr := range m.Event.Transitions {
			s := tr.Type + " " + tr.ContainerID
			if tr.HasExitCode == "exit_code" {
				s += fmt.Sprintf(" exit=%d", tr.ExitCode)
			}
			ts = append(ts, s)
		}
		return fmt.Sprintf("event %s gone=%v %v %v %v", m.Event.Pod.UID, m.Event.Pod.Gone, ts, m.Event.Source, m.Event.Pod.view())
	case m.RuntimeStatus != nil:
		return "runtime " + m.RuntimeStatus.State
	}
	return m.Message
}

// goEntryView is entryView of a Go client's message.
func goEntryView(m *lifecyclev1.WatchResponse) string {
	switch {
	case m.GetEvent() != nil:
		ev := m.GetEvent()
		var ts []string
		for _, tr := range ev.GetTransitions() {
			s := tr.GetType().String() + " " + tr.GetContainerId()
			if tr.ExitCode != nil {
				s += fmt.Sprintf(" exit=%d", tr.GetExitCode())
			}
			ts = append(ts, s)
		}
		return fmt.Sprintf("event %s gone=%v %v %v %v", ev.GetPod().GetUid(), ev.GetPod().GetGone(), ts, ev.GetSource().String(), viewOfPod(ev.GetPod()))
	case m.GetRuntimeStatus() != nil:
		return "runtime " + m.GetRuntimeStatus().GetState().String()
	}
	return "?"
}

// runNode runs lifecycle.js to its end and returns its output.
func runNode(t testing.TB, socket string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := nodeCommand(ctx, t, socket, args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %v: %v\n%s", args, err, errb.String())
	}
	return out
}

func nodeCommand(ctx context.Context, t testing.TB, socket string, args ...string) *exec.Cmd {
	t.Helper()
	node, modules := ensureNode(t)
	return nodeclient.Command(ctx, repoRoot(), node, modules, "unix://"+socket, args...)
}

// nodeClient is a running `node lifecycle.js`.
type nodeClient struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan nodeMsg
	done  chan struct{}
	errb  bytes.Buffer
}

func startNode(t testing.TB, socket string, args ...string) *nodeClient {
	t.Helper()
	cmd := nodeCommand(context.Background(), t, socket, args...)
	c := &nodeClient{t: t, cmd: cmd, lines: make(chan nodeMsg, 1<<16), done: make(chan struct{})}
	cmd.Stderr = &c.errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var m nodeMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = nodeMsg{Message: "unparsable: " + sc.Text()}
			}
			c.lines <- m
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(patience):
			_ = cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// next returns the next line; the test fails if none comes within patience.
func (c *nodeClient) next() nodeMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("the node client exited: %v\n%s", c.cmd.ProcessState, c.errb.String())
		}
		if len(m.Message) > 11 && m.Message[:11] == "unparsable:" {
			c.t.Fatalf("node client: %s", m.Message)
		}
		return m
	case <-time.After(patience):
		c.t.Fatalf("the node client printed nothing within %v", patience)
	}
	return nodeMsg{}
}

// disconnect closes the client's standard input: it cancels its call and
// prints the last cursor.
func (c *nodeClient) disconnect() string {
	c.t.Helper()
	c.stdin.Close()
	for {
		m := c.next()
		if m.Closed != nil {
			<-c.done
			if code := c.cmd.ProcessState.ExitCode(); code != 0 {
				c.t.Fatalf("node client exited with %d: %s", code, c.errb.String())
			}
			return m.Closed.Cursor
		}
		if m.End != nil {
			c.t.Fatalf("the watch ended before the client disconnected: %+v", *m.End)
		}
	}
}

func seqOf(t testing.TB, cursor string) uint64 {
	t.Helper()
	c, err := journal.ParseCursor(cursor)
	if err != nil {
		t.Fatal(err)
	}
	return c.Seq
}

// goWatch is a Go watcher over raw gRPC: every message it received, in order.
type goWatch struct {
	mu   sync.Mutex
	msgs []*lifecyclev1.WatchResponse
	err  error
	done chan struct{}
}

func startGoWatch(t testing.TB, socket, cursor string) *goWatch {
	t.Helper()
	conn := dialLifecycle(t, socket)
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := lifecyclev1.NewLifecycleClient(conn).Watch(ctx, &lifecyclev1.WatchRequest{Cursor: cursor})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &goWatch{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			m, err := stream.Recv()
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.msgs = append(w.msgs, m)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

func (w *goWatch) snapshot() ([]*lifecyclev1.WatchResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs), w.err
}

// headCursor is the lifecycle API's current cursor (ListPods').
func headCursor(t testing.TB, socket string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	res, err := lifecyclev1.NewLifecycleClient(dialLifecycle(t, socket)).ListPods(ctx, &lifecyclev1.ListPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return res.GetCursor()
}

// settle waits until pleg's pod API shows exactly the simulated runtime.
func settle(t testing.TB, r *sim.Runtime, p *plegProc) {
	t.Helper()
	poll(t, "pleg's pod API shows the runtime's pods", func() bool {
		return maps.EqualFunc(cachePods(t, p.base), simPods(r), podViewEqual)
	})
}

func podViewEqual(a, b podView) bool { return a.Name == b.Name && maps.Equal(a.Items, b.Items) }

// churn changes the simulated node: the workload's steps (crash loops,
// batch jobs, rolling updates) and one of each transition by hand: a
// container exits with code 3, is restarted (a new attempt), the old
// attempt is removed, a pod is stopped and removed, a pod is added. After
// each change it waits until pleg shows it (a state that lives shorter
// than a relist period may go unseen: docs/stream.md's honest limit).
func churn(t testing.TB, r *sim.Runtime, p *plegProc, round int) {
	t.Helper()
	for i := 0; i < 3; i++ {
		r.Step()
		settle(t, r, p)
	}
	var victim sim.PodInfo
	for _, p := range r.Pods() {
		if len(p.Containers) > 0 && p.Containers[len(p.Containers)-1].State.String() == "CONTAINER_RUNNING" && p.Behaviour == sim.Steady {
			victim = p
			break
		}
	}
	if victim.UID == "" {
		t.Fatal("churn: no steady pod with a running container left")
	}
	c := victim.Containers[len(victim.Containers)-1]
	must(t, r.ExitContainer(c.ID, 3))
	settle(t, r, p)
	_, err := r.RestartContainer(victim.UID, c.Name)
	must(t, err)
	settle(t, r, p)
	must(t, r.RemoveContainer(c.ID))
	settle(t, r, p)
	pods := r.Pods()
	gone := pods[len(pods)-1]
	if gone.UID == victim.UID {
		gone = pods[len(pods)-2]
	}
	must(t, r.StopPod(gone.UID))
	settle(t, r, p)
	must(t, r.RemovePod(gone.UID))
	settle(t, r, p)
	_, err = r.AddPod(sim.PodSpec{Name: fmt.Sprintf("added-%d", round), Namespace: "agents", Containers: []string{"app", "sidecar"}, Behaviour: sim.Steady})
	must(t, err)
	settle(t, r, p)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestNodeClient: the Node client takes the snapshot, watches, disconnects,
// resumes from its cursor after the node changed meanwhile, and ends with
// exactly the pods pleg's pod API shows and exactly the events a Go
// watcher connected throughout received; a cursor of another pleg instance
// gets resync_required.
func TestNodeClient(t *testing.T) {
	ensureNode(t)
	r := startSim(t, sim.Config{Seed: 20, Pods: 8, ContainersPerPod: 2, ChurnPerStep: 2})
	p := startPleg(t, r.Endpoint(), "")
	settle(t, r, p)
	gw := startGoWatch(t, p.socket, "")

	// Phase 1: snapshot, then events while the node changes.
	n1 := startNode(t, p.socket, "watch")
	view := map[string]podView{}
	var snapCursor string
	for {
		m := n1.next()
		if m.Snapshot != nil {
			view[m.Snapshot.UID] = m.Snapshot.view()
			snapCursor = m.Cursor
			continue
		}
		if m.Message != "snapshot_end" {
			t.Fatalf("before snapshot_end: %+v", m)
		}
		snapCursor = m.Cursor
		break
	}
	if !maps.EqualFunc(view, cachePods(t, p.base), podViewEqual) {
		t.Fatalf("the node client's snapshot differs from /api/v1/pods:\nnode %v\npods %v", view, cachePods(t, p.base))
	}
	var events []nodeMsg // every event and runtime status, in order
	readUntil := func(c *nodeClient, head string) {
		t.Helper()
		for want := seqOf(t, head); ; {
			m := c.next()
			if m.End != nil || m.ResyncRequired != nil {
				t.Fatalf("the watch ended: %+v %+v", m.End, m.ResyncRequired)
			}
			if m.Event != nil || m.RuntimeStatus != nil {
				events = append(events, m)
			}
			if m.Cursor != "" && seqOf(t, m.Cursor) >= want {
				return
			}
		}
	}
	churn(t, r, p, 1)
	settle(t, r, p)
	readUntil(n1, headCursor(t, p.socket))
	phase1 := len(events)
	cursor := n1.disconnect()

	// Phase 2: the node changes while the client is away; it resumes.
	churn(t, r, p, 2)
	settle(t, r, p)
	n2 := startNode(t, p.socket, "watch", "--cursor", cursor)
	head := headCursor(t, p.socket)
	if seqOf(t, head) <= seqOf(t, cursor) {
		t.Fatalf("nothing happened while the client was away (cursor %s, head %s)", cursor, head)
	}
	readUntil(n2, head)
	n2.disconnect()

	// Every entry after the snapshot, once, in order: the sequence numbers
	// are consecutive (an unfiltered watcher gets every journal entry).
	next := seqOf(t, snapCursor) + 1
	for i, m := range events {
		if s := seqOf(t, m.Cursor); s != next {
			t.Fatalf("event %d (phase %d) has sequence %d, want %d (a gap or a duplicate at the reconnection?)", i, 1+min(1, i/max(1, phase1)), s, next)
		}
		next++
		if m.Event != nil {
			if m.Event.Pod.Gone {
				delete(view, m.Event.Pod.UID)
			} else {
				view[m.Event.Pod.UID] = m.Event.Pod.view()
			}
		}
	}
	if next-1 != seqOf(t, head) {
		t.Fatalf("the node client ended at %d, the journal's head is %s", next-1, head)
	}
	// The transitions of both phases, the resumed one included.
	for phase, evs := range [][]nodeMsg{events[:phase1], events[phase1:]} {
		seen := map[string]bool{}
		for _, m := range evs {
			if m.Event == nil {
				continue
			}
			for _, tr := range m.Event.Transitions {
				seen[tr.Type] = true
				if tr.Type == "CONTAINER_DIED" && tr.HasExitCode == "exit_code" && tr.ExitCode == 3 {
					seen["exit 3"] = true
				}
			}
			if m.Event.Pod.Gone {
				seen["gone"] = true
			}
		}
		for _, want := range []string{"CONTAINER_STARTED", "CONTAINER_DIED", "exit 3", "CONTAINER_REMOVED", "gone"} {
			if !seen[want] {
				t.Errorf("phase %d: the node client saw no %s", phase+1, want)
			}
		}
	}

	// The same pods as pleg's own pod API, the runtime and a ListPods from Node.
	pods := cachePods(t, p.base)
	if !maps.EqualFunc(view, pods, podViewEqual) {
		t.Errorf("the node client's pods (snapshot + events) differ from /api/v1/pods:\nnode %v\npods %v", view, pods)
	}
	if !maps.EqualFunc(pods, simPods(r), podViewEqual) {
		t.Errorf("/api/v1/pods differs from the runtime")
	}
	var list struct {
		Cursor string    `json:"cursor"`
		Pods   []nodePod `json:"pods"`
	}
	if out := runNode(t, p.socket, "list"); json.Unmarshal(out, &list) != nil {
		t.Fatalf("node list printed %s", out)
	}
	lm := map[string]podView{}
	for _, p := range list.Pods {
		lm[p.UID] = p.view()
	}
	if !maps.EqualFunc(lm, pods, podViewEqual) {
		t.Errorf("ListPods from Node differs from /api/v1/pods:\nnode %v\npods %v", lm, pods)
	}

	// The same events as the Go watcher connected throughout.
	var goEvents []*lifecyclev1.WatchResponse
	poll(t, "the Go watcher reaches the head", func() bool {
		msgs, err := gw.snapshot()
		if err != nil {
			t.Fatalf("Go watcher: %v", err)
		}
		goEvents = goEvents[:0]
		last := uint64(0)
		for _, m := range msgs {
			if m.GetEvent() != nil || m.GetRuntimeStatus() != nil {
				last = seqOf(t, m.GetCursor())
				if last > seqOf(t, snapCursor) {
					goEvents = append(goEvents, m)
				}
			}
		}
		return last >= seqOf(t, head)
	})
	if len(goEvents) != len(events) {
		t.Fatalf("the Go watcher got %d events after the node client's snapshot, the node client %d", len(goEvents), len(events))
	}
	for i := range events {
		if goEvents[i].GetCursor() != events[i].Cursor || goEntryView(goEvents[i]) != events[i].entryView() {
			t.Fatalf("event %d differs:\nGo   %s %s\nNode %s %s", i, goEvents[i].GetCursor(), goEntryView(goEvents[i]), events[i].Cursor, events[i].entryView())
		}
	}

	// A cursor of another pleg instance: resync_required, then the stream
	// ends OK.
	rs := startNode(t, p.socket, "watch", "--cursor", "0123456789ab-5")
	if m := rs.next(); m.ResyncRequired == nil {
		t.Fatalf("a cursor of another instance: got %+v, want resync_required", m)
	}
	if m := rs.next(); m.End == nil || m.End.Code != 0 {
		t.Fatalf("after resync_required: %+v, want the end of the stream (OK)", m)
	}

	// A 30,000-character cursor, or a 40,000-character namespace:
	// INVALID_ARGUMENT, whose status (grpc-message and the
	// BadRequest detail) echoes the value bounded. Echoed whole, the
	// trailer passed Node's 64 KiB header limit: the client never saw an
	// answer (here: it printed nothing within the patience).
	for _, args := range [][]string{{"--cursor", strings.Repeat("x", 30000)}, {"--namespace", strings.Repeat("n", 40000)}} {
		bad := startNode(t, p.socket, append([]string{"watch"}, args...)...)
		if m := bad.next(); m.End == nil || m.End.Code != 3 || len(m.End.Details) > 1024 {
			t.Fatalf("a %d-character %s: got %+v, want INVALID_ARGUMENT (3) with a bounded message", len(args[1]), args[0], m)
		}
	}
	t.Logf("node client: %d snapshot pods, %d events in phase 1, %d after resuming from %s", len(view), phase1, len(events)-phase1, cursor)
}

// TestNodeClientFollow: `watch --follow`, the Node client as an agent that
// stays. pleg stopped under it: the end of the stream (UNAVAILABLE, the
// cursor it resumes from, a retry), retries while the socket is gone, then
// pleg B answers the old cursor with resync_required; the client says it
// resyncs and takes B's snapshot, which carries what changed while pleg
// was down, then B's events with consecutive sequence numbers. Closed, it
// prints its cursor; a follower started from that cursor resumes exactly
// after it.
func TestNodeClientFollow(t *testing.T) {
	ensureNode(t)
	r := startSim(t, sim.Config{Seed: 41, Pods: 6, ContainersPerPod: 2, ChurnPerStep: 2})
	sock := filepath.Join(shortDir(t), "pleg.sock")
	a := startPleg(t, r.Endpoint(), sock)
	settle(t, r, a)
	n := startNode(t, sock, "watch", "--follow", "--max-backoff-ms", "200")

	// view applies a follower's lines to its pods until the cursor reaches
	// head, checking that every entry of an epoch comes once, in order.
	view := map[string]podView{}
	next := uint64(0) // the sequence number the next event must have
	var ends, resyncs []nodeMsg
	follow := func(head string) {
		t.Helper()
		for want := seqOf(t, head); ; {
			m := n.next()
			switch {
			case m.End != nil:
				ends = append(ends, m)
				continue
			case m.Resync != nil:
				resyncs = append(resyncs, m)
				continue
			case m.Snapshot != nil:
				if next != 0 {
					view, next = map[string]podView{}, 0
				}
				view[m.Snapshot.UID] = m.Snapshot.view()
				continue
			case m.Message == "snapshot_end":
				next = seqOf(t, m.Cursor) + 1
			case m.Message == "resync_required":
				continue // its cursor is the head the watch began at, not a position
			case m.Message == "bookmark":
			case m.Event != nil || m.RuntimeStatus != nil:
				if s := seqOf(t, m.Cursor); s != next {
					t.Fatalf("sequence %d, want %d (a gap or a duplicate)", s, next)
				}
				next++
				if m.Event != nil && m.Event.Pod.Gone {
					delete(view, m.Event.Pod.UID)
				} else if m.Event != nil {
					view[m.Event.Pod.UID] = m.Event.Pod.view()
				}
			default:
				t.Fatalf("unexpected line %+v", m)
			}
			if strings.HasPrefix(m.Cursor, strings.SplitN(head, "-", 2)[0]+"-") && seqOf(t, m.Cursor) >= want {
				return
			}
		}
	}
	churn(t, r, a, 1)
	follow(headCursor(t, sock))
	if !maps.EqualFunc(view, cachePods(t, a.base), podViewEqual) {
		t.Fatalf("the follower's pods differ from pleg A's pod API")
	}
	oldCursor := headCursor(t, sock)
	if code := a.stop(); code != 0 {
		t.Fatalf("pleg A exited with %d", code)
	}
	// While pleg is down: a pod goes, one comes.
	pods := r.Pods()
	must(t, r.StopPod(pods[0].UID))
	must(t, r.RemovePod(pods[0].UID))
	_, err := r.AddPod(sim.PodSpec{Name: "during-outage", Namespace: "agents", Containers: []string{"app"}, Behaviour: sim.Steady})
	must(t, err)
	// The follower retries meanwhile.
	for len(ends) < 3 {
		m := n.next()
		if m.End == nil {
			t.Fatalf("with pleg down: %+v, want end lines (retries)", m)
		}
		ends = append(ends, m)
	}
	first := ends[0].End
	if first.Code != 14 || !strings.Contains(first.Details, "shutting down") || first.Resume != oldCursor || first.RetryMs == nil {
		t.Fatalf("pleg A stopping: %+v, want UNAVAILABLE (14), shutting down, resume from %s, a retry", *first, oldCursor)
	}
	b := startPleg(t, r.Endpoint(), sock)
	settle(t, r, b)
	churn(t, r, b, 2)
	headB := headCursor(t, sock)
	follow(headB)
	if len(resyncs) != 1 || resyncs[0].Resync.Cursor != oldCursor || resyncs[0].Resync.Reason != journal.ReasonOtherEpoch {
		t.Fatalf("resync lines %+v, want one, from %s, reason %q", resyncs, oldCursor, journal.ReasonOtherEpoch)
	}
	if !maps.EqualFunc(view, cachePods(t, b.base), podViewEqual) {
		t.Fatalf("after pleg B's snapshot and events the follower's pods differ from pleg B's pod API:\nnode %v\npods %v", view, cachePods(t, b.base))
	}
	cursor := n.disconnect()
	if cursor != headB {
		t.Fatalf("the follower closed at %s, want pleg B's head %s", cursor, headB)
	}

	// Started from that cursor: exactly what followed it.
	churn(t, r, b, 3)
	head := headCursor(t, sock)
	n = startNode(t, sock, "watch", "--follow", "--cursor", cursor)
	next = seqOf(t, cursor) + 1
	follow(head)
	if !maps.EqualFunc(view, cachePods(t, b.base), podViewEqual) {
		t.Fatalf("resumed from %s, the follower's pods differ from pleg B's pod API", cursor)
	}
	t.Logf("follower: %d end lines while pleg was down (first: code %d, %q, resume %s, retry in %d ms), resync from %s, resumed from %s to %s",
		len(ends), first.Code, first.Details, first.Resume, *first.RetryMs, oldCursor, cursor, head)
}

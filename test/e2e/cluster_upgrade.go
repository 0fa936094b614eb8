package e2e

// ClusterUpgrade: pleg's DaemonSets rolled (a restart, then an image
// change) under node agents that watch its lifecycle stream while pods
// churn on both nodes: no transition made during a rollout may be lost to
// any agent without its knowing.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/journal"
	nodeclient "github.com/podlifecycle/pleg/test/clients/node"
)

const (
	// churnNamespace holds the churned pods; churnLabel names their node.
	churnNamespace = "pleg-churn"
	churnLabel     = "pleg-e2e/churn"
	// upgradeTag is the second tag of the pleg image (the same build)
	// that rollout 2 sets.
	upgradeTag = "e2e-upgrade"
	// agentMaxBackoff bounds every agent's wait between reconnection
	// attempts, so that an agent's view of the downtime is pleg's within
	// that much.
	agentMaxBackoff = time.Second
	// streamDownBound is what the test asserts of a rollout's stream
	// downtime; the goal (5 s) is reported, not asserted.
	streamDownBound = time.Minute
)

// ClusterUpgrade: pleg installed by installPleg (a control plane, a
// kubelet on containerd 2.4.2 and one on CRI-O 1.36.3, the DaemonSets
// pleg and pleg-crio; the pleg image also preloaded under a second tag
// of the same build), then:
//
//  1. on each node two agents watch pleg's lifecycle socket (the node's
//     /run/pleg/pleg.sock, a hostPath): one through the Go client
//     (api/lifecycle/client's Run), one through the Node client
//     (test/clients/node/lifecycle.js watch --follow), each reconnecting
//     by itself (backoff up to 1 s), resuming by cursor and resyncing from
//     a snapshot when pleg cannot resume its cursor;
//  2. pods churn on both nodes throughout: every second a bare pod per
//     node (spec.nodeName, hostNetwork, restartPolicy Never) whose
//     workload container lives 2 s and exits with code i%4, created and
//     deleted through the API server; every other pod is deleted once it
//     finished and every agent of its node saw it finish (a pod created,
//     finished and removed entirely while pleg is down is one pleg never
//     observed: docs/stream.md's stated limit, which no agent could see);
//  3. rollout 1: kubectl rollout restart of both DaemonSets, kubectl
//     rollout status; every agent sees a new pleg (a new cursor epoch);
//  4. rollout 2: kubectl set image of both DaemonSets to the second tag,
//     kubectl rollout status; every agent sees a new pleg again, whose pod
//     runs the second tag;
//  5. the churn stopped and every pod finished: every churned container
//     reached each of the 4 agents in its final state (exited, with the
//     exit code the API reports), through an event or through a resync's
//     snapshot; within each pleg's epoch every agent got every journal
//     entry once, in order (consecutive sequence numbers from its
//     snapshot or the cursor it resumed from: no silent gap), and events
//     of an epoch only after that epoch's snapshot; each agent's view
//     equals the API's (kubectl get pods -o json: the container IDs, the
//     exit codes; a deleted pod is gone or as it finished);
//  6. MEASURE per node: how long its stream was down in each rollout (from
//     the last message of the old pleg to the first of the new one as each
//     agent saw it, the largest over its agents; goal 5 s, asserted under
//     1 minute), each agent's resumes by cursor and resyncs, events seen,
//     pods churned.
func ClusterUpgrade(t *testing.T) {
	img := PlegImage(t)
	second := img.ref[:strings.LastIndex(img.ref, ":")+1] + upgradeTag
	p := installPleg(t, second)
	c := p.c
	nodes := []*clusterNode{p.a, p.b}
	t.Logf("kubectl get pods -n pleg-system -o wide:\n%s", c.Kubectl(t, "get", "pods", "-n", "pleg-system", "-o", "wide"))

	// 1. The agents.
	nodeBin, modules, err := nodeclient.Ensure(baseEnv.repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string][]*upgradeAgent{}
	var all []*upgradeAgent
	for _, n := range nodes {
		sock := filepath.Join(n.plegRun(), "pleg.sock")
		agents[n.name] = []*upgradeAgent{startGoAgent(t, n.name, sock), startNodeAgent(t, n.name, sock, nodeBin, modules)}
		all = append(all, agents[n.name]...)
	}
	waitFor(t, time.Minute, "every agent's first snapshot", func() error {
		return eachAgent(all, func(a *upgradeAgent) error {
			if a.epochCount() == 0 {
				return errNotYet
			}
			return nil
		})
	})

	// 2. The churn.
	c.Kubectl(t, "create", "namespace", churnNamespace)
	waitFor(t, time.Minute, "the service account default in "+churnNamespace, func() error {
		_, err := c.kubectl("-n", churnNamespace, "get", "serviceaccount", "default")
		return err
	})
	ch, err := startChurn(c, nodes, agents)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.stop() })
	finishedSince := func(what string, since time.Time) {
		t.Helper()
		waitFor(t, 3*time.Minute, what, func() error {
			if err := ch.failed(); err != nil {
				t.Fatalf("the churn: %v", err)
			}
			for _, n := range nodes {
				if k := ch.seenFinishedSince(n.name, since); k < 3 {
					return fmt.Errorf("%d pods on %s finished after %v and seen so by its agents, want 3", k, n.name, since.Format(time.TimeOnly))
				}
			}
			return nil
		})
	}
	finishedSince("churned pods finishing on both nodes, seen by every agent", time.Now())

	// 3, 4. The rollouts.
	podsBefore := plegPodUIDs(t, c)
	r1 := rollout(t, c, all, "rollout restart", func() {
		for _, ds := range []string{"pleg", "pleg-crio"} {
			t.Logf("kubectl rollout restart daemonset/%s: %s", ds, strings.TrimSpace(c.Kubectl(t, "-n", "pleg-system", "rollout", "restart", "daemonset/"+ds)))
		}
	})
	podsAfter1 := plegPodUIDs(t, c)
	for node, uid := range podsAfter1 {
		if podsBefore[node] == uid {
			t.Fatalf("rollout restart: the pleg pod on %s is still %s", node, uid)
		}
	}
	finishedSince("churned pods finishing after rollout 1, seen by every agent", r1.end)
	r2 := rollout(t, c, all, "set image", func() {
		for _, ds := range []string{"pleg", "pleg-crio"} {
			t.Logf("kubectl set image daemonset/%s pleg=%s: %s", ds, second,
				strings.TrimSpace(c.Kubectl(t, "-n", "pleg-system", "set", "image", "daemonset/"+ds, "pleg="+second)))
		}
	})
	for node, pod := range plegPods(t, c) {
		if pod.image != second || pod.uid == podsAfter1[node] {
			t.Fatalf("after set image, the pleg pod on %s is %s running %s, want a new pod running %s", node, pod.uid, pod.image, second)
		}
	}
	finishedSince("churned pods finishing after rollout 2, seen by every agent", r2.end)

	// 5. Every churned container reached every agent of its node.
	ch.stop()
	if err := ch.failed(); err != nil {
		t.Fatalf("the churn: %v", err)
	}
	waitFor(t, 3*time.Minute, "every churned pod finished, in the API", func() error {
		if err := ch.refresh(context.Background()); err != nil {
			return err
		}
		if n := ch.unfinished(); n > 0 {
			return fmt.Errorf("%d pods not finished", n)
		}
		return nil
	})
	records := ch.records()
	for _, r := range records {
		if r.containerID == "" {
			t.Fatalf("pod %s finished (exit %d) with no container ID in the API", r.name, r.exitCode)
		}
	}
	waitFor(t, 2*time.Minute, "every churned container seen by every agent of its node in its final state", func() error {
		var missing []string
		for _, r := range records {
			for _, a := range agents[r.node] {
				if code, ok := a.sawFinal(r.containerID); !ok || code != r.exitCode {
					missing = append(missing, fmt.Sprintf("%s: %s (container %.12s exited %d; agent has %d, %v)", a, r.name, r.containerID, r.exitCode, code, ok))
				}
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d missing: %s", len(missing), strings.Join(missing[:min(len(missing), 10)], "; "))
		}
		return nil
	})
	var api k8sChurnPodList
	if err := c.getJSON(&api, "pods", "-n", churnNamespace); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "every agent's view of the churned pods equal to the API's", func() error {
		return eachAgent(all, func(a *upgradeAgent) error { return a.matches(api, records) })
	})
	for _, a := range all {
		if p := a.problemList(); len(p) > 0 {
			t.Errorf("%s broke the stream's contract %d times: %s", a, len(p), strings.Join(p[:min(len(p), 10)], "; "))
		}
		if n := a.epochCount(); n != 3 {
			t.Errorf("%s saw %d pleg instances (epochs %v), want 3: the first, one per rollout", a, n, a.epochList())
		}
	}
	for _, n := range nodes {
		if g, o := agents[n.name][0].epochList(), agents[n.name][1].epochList(); !slices.Equal(g, o) {
			t.Errorf("on %s the Go agent saw the epochs %v, the Node agent %v", n.name, g, o)
		}
	}
	if t.Failed() {
		return
	}

	// 6. MEASURE.
	for _, n := range nodes {
		var down [2]time.Duration
		var per [2][]string
		var counts []string
		for _, a := range agents[n.name] {
			for i := range down {
				d := a.downtime(i)
				if d > streamDownBound {
					t.Errorf("%s: the stream was down %v in rollout %d, over %v", a, d, i+1, streamDownBound)
				}
				down[i] = max(down[i], d)
				per[i] = append(per[i], fmt.Sprintf("%s:%v", a.kind, d.Round(10*time.Millisecond)))
			}
			s := a.stats()
			counts = append(counts, fmt.Sprintf("%s:resumes=%d,resyncs=%d,disconnects=%d,events=%d,final_via_snapshot=%d", a.kind, s.resumes, s.resyncs, s.disconnects, s.events, s.finalViaSnapshot))
		}
		churned, deleted := ch.counts(n.name)
		measureOn(t, n.k.env, "cluster_upgrade node=%s rollout_restart_stream_down=%v (%s) set_image_stream_down=%v (%s) goal=5s agents=%s pods_churned=%d pods_deleted=%d rollout_restart_took=%v set_image_took=%v",
			n.name, down[0].Round(10*time.Millisecond), strings.Join(per[0], ","), down[1].Round(10*time.Millisecond), strings.Join(per[1], ","),
			strings.Join(counts, " "), churned, deleted, r1.end.Sub(r1.start).Round(100*time.Millisecond), r2.end.Sub(r2.start).Round(100*time.Millisecond))
	}
	for _, a := range all {
		t.Logf("%s: %s", a, strings.Join(a.noteList(), "; "))
	}
}

// rolloutSpan is when a rollout began and when every agent was on the new
// pleg.
type rolloutSpan struct{ start, end time.Time }

// rollout runs do (kubectl commands that roll both DaemonSets), waits
// for kubectl rollout status of both and until every agent saw one more
// pleg instance than before.
func rollout(t *testing.T, c *cluster, agents []*upgradeAgent, what string, do func()) rolloutSpan {
	t.Helper()
	before := map[*upgradeAgent]int{}
	for _, a := range agents {
		before[a] = a.epochCount()
	}
	r := rolloutSpan{start: time.Now()}
	do()
	for _, ds := range []string{"pleg", "pleg-crio"} {
		t.Logf("%s: kubectl rollout status daemonset/%s: %s", what, ds,
			strings.TrimSpace(c.Kubectl(t, "-n", "pleg-system", "rollout", "status", "daemonset/"+ds, "--timeout=3m")))
	}
	waitFor(t, time.Minute, what+": every agent on the new pleg", func() error {
		return eachAgent(agents, func(a *upgradeAgent) error {
			if n := a.epochCount(); n != before[a]+1 {
				return fmt.Errorf("%s saw %d pleg instances, want %d", a, n, before[a]+1)
			}
			return nil
		})
	})
	r.end = time.Now()
	t.Logf("%s: every agent on the new pleg %v after it began", what, r.end.Sub(r.start).Round(100*time.Millisecond))
	return r
}

// plegPod is a pleg pod of the DaemonSets.
type plegPod struct{ uid, image string }

// plegPods is the pleg pod of each node, terminating ones left out.
func plegPods(t *testing.T, c *cluster) map[string]plegPod {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				UID               string `json:"uid"`
				DeletionTimestamp string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Spec struct {
				NodeName   string `json:"nodeName"`
				Containers []struct {
					Image string `json:"image"`
				} `json:"containers"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := c.getJSON(&pods, "pods", "-n", "pleg-system"); err != nil {
		t.Fatal(err)
	}
	out := map[string]plegPod{}
	for _, p := range pods.Items {
		if p.Metadata.DeletionTimestamp != "" {
			// The old pod of a rollout, still terminating: kubectl rollout
			// status waits for the new pods to be available, not for the
			// old ones to be gone, so it may still be listed.
			continue
		}
		if _, dup := out[p.Spec.NodeName]; dup || len(p.Spec.Containers) != 1 {
			t.Fatalf("pleg-system: more than one pleg pod on %s, or not one container", p.Spec.NodeName)
		}
		out[p.Spec.NodeName] = plegPod{p.Metadata.UID, p.Spec.Containers[0].Image}
	}
	return out
}

func plegPodUIDs(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for node, p := range plegPods(t, c) {
		out[node] = p.uid
	}
	return out
}

func eachAgent(agents []*upgradeAgent, f func(*upgradeAgent) error) error {
	var errs []error
	for _, a := range agents {
		if err := f(a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// viewPod is a pod as an agent keeps it: its containers by ID (sandboxes
// are left out).
type viewPod struct {
	name string // namespace/name
	ctrs map[string]viewCtr
	gone bool
}

type viewCtr struct {
	name, state string
	exit        *int32
}

func newViewPod(ns, name string, gone bool) viewPod {
	return viewPod{name: ns + "/" + name, gone: gone, ctrs: map[string]viewCtr{}}
}

func (p *viewPod) add(id, name, state string, exit *int32) {
	p.ctrs[id] = viewCtr{name, state, exit}
}

func goViewPod(p *lifecyclev1.Pod) viewPod {
	v := newViewPod(p.GetNamespace(), p.GetName(), p.GetGone())
	for _, c := range p.GetContainers() {
		v.add(c.GetId(), c.GetName(), c.GetState().String(), c.ExitCode)
	}
	return v
}

// upgradeAgent is one agent's view of a node's pods through pleg's
// stream, and what it saw of the stream.
type upgradeAgent struct {
	kind, node string // "go" or "node"

	mu   sync.Mutex
	pods map[string]viewPod // by UID
	// finals: each container seen exited with an exit code, the first
	// time.
	finals map[string]finalSeen
	// epochs: each pleg instance the stream came from, in order.
	epochs []epochSpan
	// viewEpoch and next: the epoch of the last snapshot and the sequence
	// number the next event must have.
	viewEpoch string
	next      uint64
	// down: the stream broke since the last message.
	down        bool
	snapshots   int
	resumes     int
	disconnects int
	events      int
	problems    []string
	notes       []string
}

type finalSeen struct {
	exit int32
	via  string // "event" or "snapshot"
}

type epochSpan struct {
	epoch       string
	first, last time.Time
}

func newUpgradeAgent(kind, node string) *upgradeAgent {
	return &upgradeAgent{kind: kind, node: node, pods: map[string]viewPod{}, finals: map[string]finalSeen{}}
}

func (a *upgradeAgent) String() string { return a.kind + " agent on " + a.node }

func (a *upgradeAgent) problem(format string, args ...any) {
	if len(a.problems) < 100 {
		a.problems = append(a.problems, fmt.Sprintf(format, args...))
	}
}

func (a *upgradeAgent) note(format string, args ...any) {
	if len(a.notes) < 40 {
		a.notes = append(a.notes, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	}
}

// mark records a message of cursor received at now: its pleg instance,
// and whether a broken stream came back.
func (a *upgradeAgent) mark(cursor string, now time.Time) (journal.Cursor, bool) {
	cur, err := journal.ParseCursor(cursor)
	if err != nil {
		a.problem("message with cursor %q: %v", cursor, err)
		return cur, false
	}
	if n := len(a.epochs); n == 0 || a.epochs[n-1].epoch != cur.Epoch {
		a.epochs = append(a.epochs, epochSpan{epoch: cur.Epoch, first: now})
		if n > 0 {
			a.note("first message of pleg %s %v after the last of %s", cur.Epoch, now.Sub(a.epochs[n-1].last).Round(time.Millisecond), a.epochs[n-1].epoch)
		}
	}
	a.epochs[len(a.epochs)-1].last = now
	return cur, true
}

// resumed counts a broken stream that came back with a message other than
// a snapshot: resumed by cursor.
func (a *upgradeAgent) resumed() {
	if a.down {
		a.down = false
		a.resumes++
		a.note("resumed by cursor")
	}
}

// sequence checks that cur is the next entry of the view's epoch.
func (a *upgradeAgent) sequence(what string, cur journal.Cursor) {
	switch {
	case a.snapshots == 0:
		a.problem("%s at %s before any snapshot", what, cur)
	case cur.Epoch != a.viewEpoch:
		a.problem("%s at %s on a view of pleg %s, with no snapshot of pleg %s", what, cur, a.viewEpoch, cur.Epoch)
	case cur.Seq != a.next:
		a.problem("%s at %s: sequence %d, want %d (a gap or a duplicate)", what, cur, cur.Seq, a.next)
	}
	a.next = cur.Seq + 1
}

func (a *upgradeAgent) final(id string, c viewCtr, via string) {
	if c.state != lifecyclev1.State_STATE_EXITED.String() || c.exit == nil {
		return
	}
	if f, ok := a.finals[id]; ok {
		if f.exit != *c.exit {
			a.problem("container %.12s exited %d, then %d", id, f.exit, *c.exit)
		}
		return
	}
	a.finals[id] = finalSeen{*c.exit, via}
}

// resync replaces the view with a snapshot that ended at cursor.
func (a *upgradeAgent) resync(pods map[string]viewPod, cursor string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, ok := a.mark(cursor, now)
	if !ok {
		return
	}
	if a.snapshots > 0 {
		a.note("resync: a snapshot of %d pods from pleg %s", len(pods), cur.Epoch)
	}
	a.snapshots++
	a.down = false
	a.pods = pods
	for _, p := range pods {
		for id, c := range p.ctrs {
			a.final(id, c, "snapshot")
		}
	}
	a.viewEpoch, a.next = cur.Epoch, cur.Seq+1
}

// event applies a pod's event.
func (a *upgradeAgent) event(uid string, p viewPod, cursor string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, ok := a.mark(cursor, now)
	if !ok {
		return
	}
	a.resumed()
	a.sequence("event", cur)
	a.events++
	for id, c := range p.ctrs {
		a.final(id, c, "event")
	}
	if p.gone {
		delete(a.pods, uid)
	} else {
		a.pods[uid] = p
	}
}

// entry is a message that takes a journal entry without changing a pod
// (a runtime status).
func (a *upgradeAgent) entry(what, cursor string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.mark(cursor, now); ok {
		a.resumed()
		a.sequence(what, cur)
	}
}

// bookmark is the Node agent's bookmark: its cursor is the last entry.
func (a *upgradeAgent) bookmark(cursor string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, ok := a.mark(cursor, now)
	if !ok {
		return
	}
	a.resumed()
	if cur.Epoch != a.viewEpoch || cur.Seq+1 != a.next {
		a.problem("bookmark at %s, after the entry %s-%d", cur, a.viewEpoch, a.next-1)
	}
}

// disconnected records that the stream broke.
func (a *upgradeAgent) disconnected(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		a.down = true
		a.disconnects++
		a.note("disconnected: %s", why)
	}
}

func (a *upgradeAgent) epochCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.epochs)
}

func (a *upgradeAgent) epochList() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, e := range a.epochs {
		out = append(out, e.epoch)
	}
	return out
}

// downtime is from the last message of pleg instance i to the first of
// instance i+1.
func (a *upgradeAgent) downtime(i int) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i+1 >= len(a.epochs) {
		return -1
	}
	return a.epochs[i+1].first.Sub(a.epochs[i].last)
}

func (a *upgradeAgent) sawFinal(id string) (int32, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.finals[id]
	return f.exit, ok
}

func (a *upgradeAgent) problemList() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.problems)
}

func (a *upgradeAgent) noteList() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.notes)
}

type agentStats struct{ resumes, resyncs, disconnects, events, finalViaSnapshot int }

func (a *upgradeAgent) stats() agentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := agentStats{resumes: a.resumes, resyncs: max(0, a.snapshots-1), disconnects: a.disconnects, events: a.events}
	for _, f := range a.finals {
		if f.via == "snapshot" {
			s.finalViaSnapshot++
		}
	}
	return s
}

// matches compares the agent's view of its node's churned pods with the
// API's: each pod the API has (and the churn did not delete) with its
// container's ID, exited with the API's code; each deleted pod gone, or
// as it finished.
func (a *upgradeAgent) matches(api k8sChurnPodList, records []churnRecord) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	deleted := map[string]churnRecord{}
	for _, r := range records {
		if r.deleted {
			deleted[r.uid] = r
		}
	}
	var bad []string
	want := map[string]bool{}
	for _, p := range api.Items {
		if p.Spec.NodeName != a.node {
			continue
		}
		if _, ok := deleted[p.Metadata.UID]; ok {
			continue
		}
		want[p.Metadata.UID] = true
		id, code, err := p.final()
		if err != nil {
			return err
		}
		v, ok := a.pods[p.Metadata.UID]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: missing", p.Metadata.Name))
			continue
		}
		c, ok := v.ctrs[id]
		if len(v.ctrs) != 1 || !ok || c.state != lifecyclev1.State_STATE_EXITED.String() || c.exit == nil || *c.exit != code {
			bad = append(bad, fmt.Sprintf("%s: %v, want container %.12s exited %d", p.Metadata.Name, v.ctrs, id, code))
		}
	}
	for uid, v := range a.pods {
		if !strings.HasPrefix(v.name, churnNamespace+"/") || want[uid] {
			continue
		}
		r, ok := deleted[uid]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: a pod the API does not have", v.name))
			continue
		}
		if c, ok := v.ctrs[r.containerID]; !ok || len(v.ctrs) != 1 || c.exit == nil || *c.exit != r.exitCode {
			bad = append(bad, fmt.Sprintf("%s (deleted): %v, want gone or container %.12s exited %d", v.name, v.ctrs, r.containerID, r.exitCode))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("%s: %d pods differ from the API: %s", a, len(bad), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	return nil
}

// startGoAgent runs an agent through the Go client until t ends.
func startGoAgent(t *testing.T, node, sock string) *upgradeAgent {
	t.Helper()
	a := newUpgradeAgent("go", node)
	c, err := client.New(client.Options{Address: sock, InitialBackoff: 100 * time.Millisecond, MaxBackoff: agentMaxBackoff,
		Logger: logr.New(agentLogSink{a})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, client.HandlerFuncs{
			Resync: func(pods []*lifecyclev1.Pod, at client.Position) {
				view := map[string]viewPod{}
				for _, p := range pods {
					view[p.GetUid()] = goViewPod(p)
				}
				a.resync(view, at.Cursor, time.Now())
			},
			Event: func(ev *lifecyclev1.PodEvent, at client.Position) {
				a.event(ev.GetPod().GetUid(), goViewPod(ev.GetPod()), at.Cursor, time.Now())
			},
			RuntimeStatus: func(st *lifecyclev1.RuntimeStatus, at client.Position) {
				a.entry("runtime status "+st.GetState().String(), at.Cursor, time.Now())
			},
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", a, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: Run did not return within 30s of its context's end", a)
		}
		c.Close()
		s := c.Stats()
		t.Logf("%s: client stats %+v", a, s)
		if as := a.stats(); s.Resyncs != as.resyncs {
			t.Errorf("%s: pleg answered resync_required %d times, the agent had %d snapshots after its first", a, s.Resyncs, as.resyncs)
		}
	})
	return a
}

// agentLogSink tells the agent when the Go client's watch ended (the
// client logs it before it watches again).
type agentLogSink struct{ a *upgradeAgent }

func (agentLogSink) Init(logr.RuntimeInfo)            {}
func (agentLogSink) Enabled(int) bool                 { return true }
func (s agentLogSink) WithValues(...any) logr.LogSink { return s }
func (s agentLogSink) WithName(string) logr.LogSink   { return s }
func (s agentLogSink) Error(err error, msg string, _ ...any) {
	s.a.disconnected(msg + ": " + err.Error())
}
func (s agentLogSink) Info(_ int, msg string, kv ...any) {
	if !strings.HasPrefix(msg, "Lifecycle watch ended") {
		return
	}
	why := msg
	for i := 0; i+1 < len(kv); i += 2 {
		if k, _ := kv[i].(string); k == "code" || k == "message" {
			why += fmt.Sprintf(" %s=%v", k, kv[i+1])
		}
	}
	s.a.disconnected(why)
}

// nodeLine is a line of lifecycle.js watch --follow: a WatchResponse as
// proto-loader gives it, or the client's own lines.
type nodeLine struct {
	Cursor   string       `json:"cursor"`
	Message  string       `json:"message"`
	Snapshot *nodeLinePod `json:"snapshot"`
	Event    *struct {
		Pod nodeLinePod `json:"pod"`
	} `json:"event"`
	RuntimeStatus *struct {
		State string `json:"state"`
	} `json:"runtime_status"`
	Resync *struct {
		Reason string `json:"reason"`
		Cursor string `json:"cursor"`
	} `json:"resync"`
	End *struct {
		Code    int    `json:"code"`
		Details string `json:"details"`
		Resume  string `json:"resume"`
		RetryMs *int   `json:"retry_ms"`
	} `json:"end"`
	Closed *struct {
		Cursor string `json:"cursor"`
	} `json:"closed"`
}

type nodeLinePod struct {
	UID        string `json:"uid"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	Gone       bool   `json:"gone"`
	Containers []struct {
		ID          string `json:"id"`
		Name        string `json:"name"`
		State       string `json:"state"`
		ExitCode    int32  `json:"exit_code"`
		HasExitCode string `json:"_exit_code"`
	} `json:"containers"`
}

func (p *nodeLinePod) view() viewPod {
	v := newViewPod(p.Namespace, p.Name, p.Gone)
	for _, c := range p.Containers {
		var exit *int32
		if c.HasExitCode == "exit_code" {
			e := c.ExitCode
			exit = &e
		}
		v.add(c.ID, c.Name, c.State, exit)
	}
	return v
}

// startNodeAgent runs an agent through the Node client (watch --follow)
// until t ends: then its standard input is closed and it must exit 0
// within 30 s.
func startNodeAgent(t *testing.T, node, sock, nodeBin, modules string) *upgradeAgent {
	t.Helper()
	a := newUpgradeAgent("node", node)
	cmd := nodeclient.Command(context.Background(), baseEnv.repoRoot, nodeBin, modules, "unix://"+sock,
		"watch", "--follow", "--max-backoff-ms", strconv.Itoa(int(agentMaxBackoff/time.Millisecond)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var closed string // the closed line's cursor
	go func() {
		closed = a.readNode(stdout)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v; stderr:\n%s", a, err, stderr.String())
			} else if closed == "" {
				t.Errorf("%s: exited without its closed line; stderr:\n%s", a, stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			err := <-done
			t.Errorf("%s: still running 30s after its standard input closed (killed: %v); stderr:\n%s", a, err, stderr.String())
		}
	})
	return a
}

// readNode applies the Node client's lines to the agent until its output
// ends, and returns the cursor of its closed line.
func (a *upgradeAgent) readNode(r io.Reader) (closed string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var snapshot map[string]viewPod
	for sc.Scan() {
		now := time.Now()
		var m nodeLine
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			a.mu.Lock()
			a.problem("unparsable line %.200s", sc.Text())
			a.mu.Unlock()
			continue
		}
		switch {
		case m.Snapshot != nil:
			if snapshot == nil {
				snapshot = map[string]viewPod{}
			}
			snapshot[m.Snapshot.UID] = m.Snapshot.view()
		case m.Message == "snapshot_end":
			if snapshot == nil {
				snapshot = map[string]viewPod{}
			}
			a.resync(snapshot, m.Cursor, now)
			snapshot = nil
		case m.Event != nil:
			a.event(m.Event.Pod.UID, m.Event.Pod.view(), m.Cursor, now)
		case m.RuntimeStatus != nil:
			a.entry("runtime status "+m.RuntimeStatus.State, m.Cursor, now)
		case m.Message == "bookmark":
			a.bookmark(m.Cursor, now)
		case m.Message == "resync_required":
		case m.Resync != nil:
			a.mu.Lock()
			a.note("resync marker: %s (cursor %s)", m.Resync.Reason, m.Resync.Cursor)
			a.mu.Unlock()
		case m.End != nil:
			snapshot = nil // a snapshot cut short starts again
			a.disconnected(fmt.Sprintf("code %d: %s", m.End.Code, m.End.Details))
		case m.Closed != nil:
			closed = m.Closed.Cursor
		default:
			a.mu.Lock()
			a.problem("unexpected line %.200s", sc.Text())
			a.mu.Unlock()
		}
	}
	return closed
}

// k8sChurnPodList is the part of a list of churned pods the test reads.
type k8sChurnPodList struct {
	Items []k8sChurnPod `json:"items"`
}

type k8sChurnPod struct {
	Metadata struct {
		Name              string     `json:"name"`
		UID               string     `json:"uid"`
		DeletionTimestamp *time.Time `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase             string `json:"phase"`
		ContainerStatuses []struct {
			Name        string `json:"name"`
			ContainerID string `json:"containerID"`
			State       struct {
				Terminated *struct {
					ExitCode   int32     `json:"exitCode"`
					FinishedAt time.Time `json:"finishedAt"`
				} `json:"terminated"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

// final is the pod's container's ID (without the runtime's scheme) and
// exit code, once the pod finished; errNotYet before.
func (p *k8sChurnPod) final() (id string, code int32, err error) {
	if p.Status.Phase != "Succeeded" && p.Status.Phase != "Failed" {
		return "", 0, errNotYet
	}
	if n := len(p.Status.ContainerStatuses); n != 1 {
		return "", 0, fmt.Errorf("pod %s %s with %d container statuses", p.Metadata.Name, p.Status.Phase, n)
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.State.Terminated == nil {
		return "", 0, fmt.Errorf("pod %s %s, its container not terminated", p.Metadata.Name, p.Status.Phase)
	}
	_, id, _ = strings.Cut(cs.ContainerID, "://")
	return id, cs.State.Terminated.ExitCode, nil
}

// churn creates a short-lived pod on each node every second and deletes
// every other one once it finished and every agent of its node saw it
// so, through the API server (the admin's client).
type churn struct {
	c      *cluster
	http   *http.Client
	nodes  []*clusterNode
	agents map[string][]*upgradeAgent
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu   sync.Mutex
	pods map[string]*churnRecord // by name
	err  error                   // the first failure
}

// churnRecord is a churned pod as the API reported it.
type churnRecord struct {
	name, node, uid string
	index           int
	finished        bool
	containerID     string
	exitCode        int32
	finishedAt      time.Time
	seenAt          time.Time // when every agent of its node had seen it finish
	deleted         bool
}

func startChurn(c *cluster, nodes []*clusterNode, agents map[string][]*upgradeAgent) (*churn, error) {
	hc, err := c.client("admin")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := &churn{c: c, http: hc, nodes: nodes, agents: agents, cancel: cancel, done: make(chan struct{}), pods: map[string]*churnRecord{}}
	go ch.run(ctx)
	return ch, nil
}

// stop ends the churn and waits for it.
func (ch *churn) stop() {
	ch.once.Do(func() {
		ch.cancel()
		<-ch.done
		ch.http.CloseIdleConnections()
	})
}

func (ch *churn) failed() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.err
}

func (ch *churn) fail(err error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.err == nil {
		ch.err = err
	}
}

func (ch *churn) run(ctx context.Context) {
	defer close(ch.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		for _, n := range ch.nodes {
			if err := ch.create(ctx, n.name, i); err != nil && ctx.Err() == nil {
				ch.fail(err)
			}
		}
		if err := ch.refresh(ctx); err != nil && ctx.Err() == nil {
			ch.fail(err)
		}
		if err := ch.deleteSeen(ctx); err != nil && ctx.Err() == nil {
			ch.fail(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// api makes one request to the API server; 2xx or an error.
func (ch *churn) api(ctx context.Context, method, path string, body any, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, ch.c.server+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ch.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// create makes churned pod i of node: the workload runs 2 s and exits
// with i%4.
func (ch *churn) create(ctx context.Context, node string, i int) error {
	name := fmt.Sprintf("churn-%s-%d", strings.TrimPrefix(node, "node-"), i)
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": map[string]string{churnLabel: node}},
		"spec": map[string]any{
			"nodeName": node, "hostNetwork": true, "restartPolicy": "Never",
			"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
			"tolerations": []map[string]string{{"operator": "Exists"}},
			"containers": []map[string]any{{
				"name": "main", "image": workloadImage, "imagePullPolicy": "IfNotPresent",
				"args": []string{"exit", strconv.Itoa(i % 4), "2s"},
			}},
		},
	}
	var created struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := ch.api(ctx, http.MethodPost, "/api/v1/namespaces/"+churnNamespace+"/pods", pod, &created); err != nil {
		return err
	}
	ch.mu.Lock()
	ch.pods[name] = &churnRecord{name: name, node: node, uid: created.Metadata.UID, index: i}
	ch.mu.Unlock()
	return nil
}

// refresh reads the churned pods from the API and records those that
// finished.
func (ch *churn) refresh(ctx context.Context) error {
	var list k8sChurnPodList
	if err := ch.api(ctx, http.MethodGet, "/api/v1/namespaces/"+churnNamespace+"/pods", nil, &list); err != nil {
		return err
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i := range list.Items {
		p := &list.Items[i]
		r, ok := ch.pods[p.Metadata.Name]
		if !ok || r.finished {
			continue
		}
		id, code, err := p.final()
		if errors.Is(err, errNotYet) {
			continue
		}
		if err != nil {
			return err
		}
		r.finished, r.containerID, r.exitCode = true, id, code
		r.finishedAt = p.Status.ContainerStatuses[0].State.Terminated.FinishedAt
	}
	return nil
}

// deleteSeen deletes every other finished pod that every agent of its
// node saw finish, and notes when the agents had seen each.
func (ch *churn) deleteSeen(ctx context.Context) error {
	ch.mu.Lock()
	var del []*churnRecord
	for _, r := range ch.pods {
		if !r.finished || !r.seenAt.IsZero() {
			continue
		}
		seen := true
		for _, a := range ch.agents[r.node] {
			code, ok := a.sawFinal(r.containerID)
			seen = seen && ok && code == r.exitCode
		}
		if !seen {
			continue
		}
		r.seenAt = time.Now()
		if r.index%2 == 0 {
			del = append(del, r)
		}
	}
	ch.mu.Unlock()
	for _, r := range del {
		if err := ch.api(ctx, http.MethodDelete, "/api/v1/namespaces/"+churnNamespace+"/pods/"+r.name, nil, nil); err != nil {
			return err
		}
		ch.mu.Lock()
		r.deleted = true
		ch.mu.Unlock()
	}
	return nil
}

// seenFinishedSince counts node's pods that finished after since and
// that every agent of the node saw so.
func (ch *churn) seenFinishedSince(node string, since time.Time) int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	n := 0
	for _, r := range ch.pods {
		if r.node == node && !r.seenAt.IsZero() && r.finishedAt.After(since) {
			n++
		}
	}
	return n
}

func (ch *churn) unfinished() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	n := 0
	for _, r := range ch.pods {
		if !r.finished {
			n++
		}
	}
	return n
}

func (ch *churn) records() []churnRecord {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var out []churnRecord
	for _, r := range ch.pods {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].node < out[j].node || out[i].node == out[j].node && out[i].index < out[j].index
	})
	return out
}

func (ch *churn) counts(node string) (churned, deleted int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for _, r := range ch.pods {
		if r.node == node {
			churned++
			if r.deleted {
				deleted++
			}
		}
	}
	return churned, deleted
}

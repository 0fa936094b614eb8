package pleg

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/podcache"
	"k8s.io/apimachinery/pkg/types"
)

var update = flag.Bool("update", false, "rewrite the expected output of testdata scripts")

// TestScripts runs the scenarios in testdata/core against the real core
// (core*.go), stepping it exactly as the loop does: the script plays the
// runtime (it answers the calls the core makes, when the script says) and
// the clock. Cache operations go to a real podcache. Each file is a
// sequence of blocks:
//
//	command [args]
//	input lines
//	----
//	expected output
//
// ending at a blank line. Listings are one pod a line, "UID id=state ..."
// ("s:id=state" for a sandbox; "id=exited:3" for an exit code); a listing
// given to a command becomes what the runtime lists from then on.
//
// Whole relists, the runtime answering every call at once:
//
//	relist [fail=A,B] [hang=C]
//	                    a global relist with the complete listing as input,
//	                    one second after the last command. fail: those pods'
//	                    status calls fail; hang: their status calls hang
//	                    until they time out (the clock moves to the
//	                    deadline) and stay out until "release". Output:
//	                    "status: UIDs" (pods whose status was asked for, or
//	                    -), the events delivered, then what else happened.
//	relist-fails        a global relist whose list call fails.
//	podrelist UID [fail] [hang]
//	                    a hint for UID and the single-pod relist it makes
//	                    (input: the pod's listing; none: the runtime has
//	                    nothing for it), one second after the last command.
//
// Step by step, the runtime answering when told:
//
//	hint UID [at=DUR] [event=TYPE:ID]
//	                    a hint (a runtime event when event is set, e.g.
//	                    event=stopped:c1) made DUR from now (default +0s).
//	reinspect UID       RequestReinspect(UID).
//	start-relist        a global relist starts (Generator.Relist).
//	tick DUR            the clock moves by DUR and the core is ticked.
//	return CALL [fail]  a call returns, answered from the runtime's listing
//	                    (fail: with an error): CALL is "list" (the global
//	                    list call) or a pod's UID (its call out). A list
//	                    call's input, if any, is the listing it returns.
//	release UID         the hung call of UID returns.
//	auto                global relists start on their own once due (as in a
//	                    started generator); before, only relist and
//	                    start-relist start them.
//	identity on|off     whether a watcher wants containers' identities.
//	adaptive max=DUR    the adaptive relist on, up to period DUR; global
//	                    relists start on their own once due, as with auto.
//	stream connected|lost
//	                    the runtime's event stream connected or was lost.
//	taken [waiters=N]   the loop took its inbox now (everything before was
//	                    stepped), with N readers of the cache waiting
//	                    (default 1).
//	inbox-lost          the loop's inbox dropped hints.
//	due                 output: when the next global relist starts.
//	wake                output: when the loop next wakes for time.
//	cache-time          output: the cache's global timestamp, since the
//	                    clock's start.
//	budget rate=R burst=B spacing=DUR early=DUR queue=N slots=N
//	                    the hint budget and the call slots (defaults: none).
//	calls               output: the calls out.
//	cache               output: every cache entry.
//	get UID             output: Get(UID) for one pod, present or not.
//	ips UID [ip...]     the IPs the runtime reports for UID from now on.
//	moves ID=STATE...   the runtime's statuses show these items in these
//	                    states from now on, whatever their listing says
//	                    (they moved on between the list and status calls).
//
// Step-by-step commands output what the core did: "call N: KIND UID
// [items]" for each call it made, "cache: ..." for each cache operation,
// the events it delivered, and its notes (skip, defer, drop, timeout,
// failed, early relist, relist done).
//
// Run with -update to rewrite the expected output.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/core/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
}

// scriptTimeout is the pod inspection timeout in scripts.
const scriptTimeout = 10 * time.Second

// harness plays the runtime and the clock for the core.
type harness struct {
	t     *testing.T
	c     *core
	cache *podcache.Cache
	now   time.Time
	start time.Time                   // the clock's start, for cache-time
	pods  map[types.UID]*cruntime.Pod // what the runtime lists
	ips   map[types.UID][]string
	exit  map[string]int32 // container ID -> exit code in statuses
	out   map[callID]callReq
	hung  map[types.UID]callID      // calls the runtime holds
	moved map[string]cruntime.State // items whose status shows another state than their listing
	// abandoned: Ready.Abandoned after the last step (scripts print a
	// change of it).
	abandoned int
}

type block struct {
	notes  []string // comment lines before the block
	cmd    string
	input  []string
	want   []string
	lineNo int
}

func parseScript(t *testing.T, file string) (blocks []block, preamble []string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	i := 0
	// The preamble is the leading comment paragraph (up to a blank line).
	for i < len(lines) && strings.HasPrefix(lines[i], "#") {
		preamble = append(preamble, lines[i])
		i++
	}
	if len(preamble) > 0 {
		preamble = append(preamble, "")
	}
	var notes []string
	for i < len(lines) {
		if strings.TrimSpace(lines[i]) == "" {
			i++
			continue
		}
		if strings.HasPrefix(lines[i], "#") {
			notes = append(notes, lines[i])
			i++
			continue
		}
		b := block{notes: notes, cmd: lines[i], lineNo: i + 1}
		notes = nil
		i++
		for i < len(lines) && lines[i] != "----" {
			if strings.TrimSpace(lines[i]) == "" {
				t.Fatalf("%s:%d: block %q has no ---- line", file, b.lineNo, b.cmd)
			}
			b.input = append(b.input, lines[i])
			i++
		}
		i++ // ----
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			b.want = append(b.want, lines[i])
			i++
		}
		blocks = append(blocks, b)
	}
	return blocks, preamble
}

func newHarness(t *testing.T) *harness {
	cfg := coreConfig{period: time.Second, trust: AdaptiveTrust, manual: true, slots: 16, timeout: scriptTimeout, statusTimeout: scriptTimeout,
		budget: hintBudget{queue: 4096}, check: true}
	start := time.Unix(1_700_000_000, 0)
	return &harness{t: t, c: newCore(cfg), cache: podcache.New(), now: start, start: start,
		pods: map[types.UID]*cruntime.Pod{}, ips: map[types.UID][]string{}, exit: map[string]int32{},
		out: map[callID]callReq{}, hung: map[types.UID]callID{}, moved: map[string]cruntime.State{}}
}

func runScript(t *testing.T, file string) {
	blocks, preamble := parseScript(t, file)
	h := newHarness(t)
	var out strings.Builder
	for _, l := range preamble {
		out.WriteString(l + "\n")
	}
	for n, b := range blocks {
		got := h.exec(b)
		if !*update && strings.Join(got, "\n") != strings.Join(b.want, "\n") {
			t.Errorf("%s:%d: %s\n got:\n\t%s\nwant:\n\t%s", file, b.lineNo, b.cmd,
				strings.Join(got, "\n\t"), strings.Join(b.want, "\n\t"))
		}
		if n > 0 {
			out.WriteString("\n")
		}
		for _, l := range b.notes {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.cmd + "\n")
		for _, l := range b.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
	}
	if *update {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// listing parses listing lines, noting exit codes ("c1=exited:3").
func (h *harness) listing(lines []string) []*cruntime.Pod {
	var pods []*cruntime.Pod
	for _, l := range lines {
		f := strings.Fields(l)
		items := f[1:]
		for i, it := range items {
			prefix, rest := "", it
			if r, ok := strings.CutPrefix(it, "s:"); ok {
				prefix, rest = "s:", r
			}
			id, st, _ := strings.Cut(rest, "=")
			st, code, ok := strings.Cut(st, ":")
			if !ok {
				continue
			}
			n, err := strconv.Atoi(code)
			if err != nil {
				h.t.Fatalf("bad exit code in %s", it)
			}
			h.exit[id] = int32(n)
			items[i] = prefix + id + "=" + st
		}
		pods = append(pods, pod(f[0], items...))
	}
	return pods
}

// setListing makes pods what the runtime lists: all of it (whole) or the
// pods given.
func (h *harness) setListing(pods []*cruntime.Pod, whole bool) {
	if whole {
		clear(h.pods)
	}
	for _, p := range pods {
		h.pods[p.UID] = p
	}
}

// runtimeListing is what ListPods returns now, in UID order.
func (h *harness) runtimeListing() []*cruntime.Pod {
	var pods []*cruntime.Pod
	for _, p := range h.pods {
		pods = append(pods, p)
	}
	slices.SortFunc(pods, func(a, b *cruntime.Pod) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return pods
}

// answer is the runtime's answer to call req (fail: an error).
func (h *harness) answer(req callReq, fail bool) input {
	switch req.Kind {
	case callList:
		if fail {
			return listed{call: req.ID, err: errList}
		}
		return listed{call: req.ID, pods: h.runtimeListing()}
	case callListPod:
		if fail {
			return podListed{call: req.ID, err: errList}
		}
		return podListed{call: req.ID, pod: h.pods[req.UID]}
	case callIdentity:
		if fail {
			return identitiesFetched{call: req.ID, err: errStatus}
		}
		ids := make([]*cruntime.Identity, len(req.Containers))
		for i, c := range req.Containers {
			ids[i] = &cruntime.Identity{PID: int64(100 + i), CgroupPath: "/pods/" + c.ID}
		}
		return identitiesFetched{call: req.ID, ids: ids}
	}
	if fail {
		return statusFetched{call: req.ID, err: errStatus}
	}
	sbs, cts := req.Sandboxes, req.Containers
	if !req.Delta {
		sbs, cts = req.Pod.Sandboxes, req.Pod.Containers
	}
	state := func(c *cruntime.Container) cruntime.State {
		if st, ok := h.moved[c.ID]; ok {
			return st
		}
		return c.State
	}
	var sbOut []*cruntime.SandboxStatus
	for _, sb := range sbs {
		sbOut = append(sbOut, &cruntime.SandboxStatus{ID: sb.ID, State: state(sb), IPs: slices.Clone(h.ips[req.UID])})
	}
	var ctOut []*cruntime.ContainerStatus
	for _, c := range cts {
		ctOut = append(ctOut, &cruntime.ContainerStatus{ID: c.ID, Name: c.Name, State: state(c), ExitCode: h.exit[c.ID]})
	}
	if req.Delta {
		return statusFetched{call: req.ID, sandboxes: sbOut, containers: ctOut}
	}
	return statusFetched{call: req.ID, status: cruntime.NewPodStatus(req.Pod, sbOut, ctOut)}
}

// stepped is what one Step did, for the output.
type stepped struct {
	calls  []callReq
	lines  []string // cache operations and notes
	events []Event
	relist *RelistStat
}

// step steps the core with in, applies its cache operations to the cache
// and returns what it did.
func (h *harness) step(in input) stepped {
	rd := h.c.Step(h.now, in)
	if rd.Broken != nil {
		h.t.Fatalf("the core broke an invariant: %v", rd.Broken)
	}
	var s stepped
	for _, req := range rd.Calls {
		h.out[req.ID] = req
		s.calls = append(s.calls, req)
	}
	for _, op := range rd.Cache {
		switch op.kind {
		case cacheSet:
			h.cache.Set(op.uid, op.status, op.err, op.at)
			line := "cache: set " + string(op.uid)
			if op.err != nil {
				line += " (error)"
			}
			s.lines = append(s.lines, line)
		case cacheDelete:
			h.cache.Delete(op.uid)
			s.lines = append(s.lines, "cache: delete "+string(op.uid))
		case cacheObserved:
			h.cache.MarkObserved(op.uid, op.at)
			s.lines = append(s.lines, "cache: observed "+string(op.uid))
		case cacheTime:
			h.cache.UpdateTime(op.at, op.held...)
			line := "cache: time"
			if len(op.held) > 0 {
				held := make([]string, len(op.held))
				for i, uid := range op.held {
					held[i] = string(uid)
				}
				line += " (held: " + strings.Join(held, " ") + ")"
			}
			s.lines = append(s.lines, line)
		}
	}
	for _, p := range rd.Publish {
		s.events = append(s.events, p.events...)
	}
	for _, n := range rd.Notes {
		if l := noteLine(n); l != "" {
			s.lines = append(s.lines, l)
		}
	}
	s.lines = append(s.lines, h.readyLines(rd)...)
	s.relist = rd.Relist
	h.checkInvariants()
	return s
}

// readyLines renders the rest of a Ready, so that a script shows every
// effect of a step: the publications (their events are shown grouped by
// pod at the end), the relist's start, health, the runtime's status and
// a change of the abandoned calls out.
func (h *harness) readyLines(rd Ready) []string {
	var out []string
	for _, p := range rd.Publish {
		line := "publish " + string(p.uid)
		if p.relist {
			line += " (relist)"
		} else {
			line += " (hint)"
		}
		if p.update {
			line += " update"
		}
		if p.pod == nil {
			line += " gone"
		}
		if len(p.identities) > 0 {
			ids := slices.Sorted(maps.Keys(p.identities))
			line += " identities: " + strings.Join(ids, " ")
		}
		out = append(out, line)
	}
	if !rd.RelistStarted.IsZero() {
		out = append(out, "relist started")
	}
	if !rd.Healthy.IsZero() {
		out = append(out, "healthy")
	}
	if r := rd.Runtime; r != nil {
		line := "runtime: " + map[journal.RuntimeState]string{journal.RuntimeReachable: "reachable", journal.RuntimeUnreachable: "unreachable",
			journal.RuntimeEventStreamLost: "event stream lost", journal.RuntimeEventStreamConnected: "event stream connected"}[r.State]
		if r.Message != "" {
			line += " (" + r.Message + ")"
		}
		out = append(out, line)
	}
	if rd.Abandoned != h.abandoned {
		out = append(out, fmt.Sprintf("abandoned calls out: %d", rd.Abandoned))
		h.abandoned = rd.Abandoned
	}
	return out
}

// checkInvariants fails the test when the core breaks a rule that holds
// after every step (core_invariants.go: one call out per pod, at most
// slots active, a hint waits for a call only while one is out, and the
// rest). Step checks them too when cfg.check is set; this covers a
// harness whose core does not.
func (h *harness) checkInvariants() {
	h.t.Helper()
	if err := h.c.invariants(); err != nil {
		h.t.Fatalf("the core broke an invariant: %v", err)
	}
}

// noteLine renders the notes scripts show.
func noteLine(n note) string {
	switch n.kind {
	case noteEarlyRelist:
		return "early relist"
	case noteListFailed:
		return "list failed"
	case noteInspectionFailed:
		return "failed: " + string(n.uid)
	case noteTimeout:
		return "timeout: " + string(n.uid) + " " + callName(n.op)
	case noteAbandonedReturned:
		return "abandoned call returned: " + string(n.uid)
	case notePodRelistFailed:
		return "pod relist failed: " + string(n.uid)
	case noteHintSkipped:
		return "skip " + string(n.uid) + ": " + n.reason
	case noteHintDropped:
		return "drop " + string(n.uid)
	case noteHintDeferred:
		return "defer " + string(n.uid) + ": " + n.reason
	case noteIdentityFailed:
		return "identity failed: " + string(n.uid)
	case noteRelistInterval:
		return "relist interval " + n.d.String()
	case noteGauges:
		return fmt.Sprintf("gauges: %d running pods, containers by state %v", n.n, n.byState)
	case notePodRelistDone:
		return "pod relist done in " + n.d.String()
	case noteStatusItems:
		return fmt.Sprintf("status items: %d fetched, %d reused", n.n, n.reused)
	case noteHintLatency:
		return "hint latency " + n.d.String()
	case noteUnannounced:
		return "unannounced " + string(n.uid) + ": " + n.reason
	}
	return ""
}

func callLine(req callReq) string {
	switch req.Kind {
	case callList:
		return fmt.Sprintf("call %d: list", req.ID)
	case callListPod:
		return fmt.Sprintf("call %d: list-pod %s", req.ID, req.UID)
	case callIdentity:
		var ids []string
		for _, c := range req.Containers {
			ids = append(ids, c.ID)
		}
		return fmt.Sprintf("call %d: identity %s (%s)", req.ID, req.UID, strings.Join(ids, " "))
	}
	line := fmt.Sprintf("call %d: status %s", req.ID, req.UID)
	if req.Delta {
		var ids []string
		for _, c := range req.Sandboxes {
			ids = append(ids, "s:"+c.ID)
		}
		for _, c := range req.Containers {
			ids = append(ids, c.ID)
		}
		line += " (delta: " + strings.Join(ids, " ") + ")"
	}
	return line
}

// render turns steps into output lines: calls, cache operations and
// notes, then the events grouped by pod.
func render(steps ...stepped) []string {
	var out []string
	var events []Event
	for _, s := range steps {
		for _, req := range s.calls {
			out = append(out, callLine(req))
		}
		out = append(out, s.lines...)
		events = append(events, s.events...)
		if s.relist != nil {
			out = append(out, fmt.Sprintf("relist done: %d inspected, %d failed", s.relist.Inspected, s.relist.Failed))
		}
	}
	return append(out, formatEvents(events)...)
}

// tick moves the clock to t and ticks the core, the hung calls waiting on
// their first item's status call.
func (h *harness) tick(t time.Time) stepped {
	h.now = t
	waiting := map[callID]trackedCall{}
	for id, req := range h.out {
		switch req.Kind {
		case callList:
			waiting[id] = trackedCall{op: "list_podsandbox"}
		case callListPod:
			waiting[id] = trackedCall{op: "list_containers"}
		default:
			op, cid := "container_status", ""
			cts, sbs := req.Containers, req.Sandboxes
			if !req.Delta {
				cts, sbs = req.Pod.Containers, req.Pod.Sandboxes
			}
			switch {
			case len(cts) > 0:
				cid = cts[0].ID
			case len(sbs) > 0:
				op, cid = "podsandbox_status", sbs[0].ID
			}
			waiting[id] = trackedCall{op: op, id: cid}
		}
	}
	return h.step(tick{waiting: waiting})
}

// callOf returns the call out that name designates: "list" the global
// list call, otherwise the call of the pod with that UID (0: none).
func (h *harness) callOf(name string) callID {
	for id, k := range h.c.calls {
		if name == "list" && k.kind == callList || name != "list" && k.kind != callList && string(k.uid) == name {
			if _, out := h.out[id]; out {
				return id
			}
		}
	}
	return 0
}

// returnCall returns call id with the runtime's answer (fail: an error).
func (h *harness) returnCall(id callID, fail bool) stepped {
	req, ok := h.out[id]
	if !ok {
		h.t.Fatalf("call %d is not out", id)
	}
	delete(h.out, id)
	if req.Kind != callList {
		if h.hung[req.UID] == id {
			delete(h.hung, req.UID)
		}
	}
	return h.step(h.answer(req, fail))
}

// relist runs a whole global relist: the runtime answers every call of it
// at once; fail and hang name the pods whose status calls fail or hang.
func (h *harness) relist(fail, hang map[types.UID]bool, listFails bool) []string {
	h.now = h.now.Add(time.Second)
	steps := []stepped{h.step(relistNow{})}
	var list callID
	for _, req := range steps[0].calls {
		if req.Kind == callList {
			list = req.ID
		}
	}
	if list == 0 {
		h.t.Fatalf("the relist made no list call (one still running?)")
	}
	steps = append(steps, h.returnCall(list, listFails))
	var statusOf []string
	// Answer the relist's status calls as they come, until it ends.
	for pending := steps[1].calls; ; {
		if steps[len(steps)-1].relist != nil || h.c.relist.phase == relistIdle {
			break
		}
		var next []callReq
		for _, req := range pending {
			if req.Kind != callStatus {
				continue
			}
			statusOf = append(statusOf, string(req.UID))
			if hang[req.UID] {
				h.hung[req.UID] = req.ID
				continue
			}
			s := h.returnCall(req.ID, fail[req.UID])
			steps = append(steps, s)
			next = append(next, s.calls...)
		}
		if len(next) == 0 {
			if h.c.relist.phase == relistIdle {
				break
			}
			// Only hung calls are left: time runs to their deadline.
			s := h.tick(h.now.Add(scriptTimeout))
			steps = append(steps, s)
			next = s.calls
		}
		pending = next
	}
	sort.Strings(statusOf)
	status := "status: -"
	if len(statusOf) > 0 {
		status = "status: " + strings.Join(statusOf, " ")
	}
	out := render(steps...)
	// The status calls are in the status line; the rest stays.
	var rest []string
	for _, l := range out {
		if strings.HasPrefix(l, "call ") && strings.Contains(l, ": status ") || strings.HasSuffix(l, ": list") ||
			strings.HasPrefix(l, "cache: set ") && !strings.HasSuffix(l, "(error)") || l == "cache: time" || strings.HasPrefix(l, "relist done") ||
			strings.HasPrefix(l, "failed: ") {
			continue
		}
		rest = append(rest, l)
	}
	return append([]string{status}, rest...)
}

// podRelist runs a hint for uid and the single-pod relist it makes, the
// runtime answering every call at once.
func (h *harness) podRelist(uid types.UID, fail, hang bool) []string {
	h.now = h.now.Add(time.Second)
	steps := []stepped{h.step(hintIn{uid: uid, at: h.now})}
	return render(append(steps, h.answerPodCalls(uid, steps[0].calls, fail, hang)...)...)
}

// answerPod answers the calls for uid among started, and those they lead
// to, until none is left.
func (h *harness) answerPod(uid types.UID, started []callReq) []stepped {
	return h.answerPodCalls(uid, started, false, false)
}

func (h *harness) answerPodCalls(uid types.UID, pending []callReq, fail, hang bool) []stepped {
	var steps []stepped
	for len(pending) > 0 {
		var next []callReq
		for _, req := range pending {
			if req.UID != uid {
				continue
			}
			if hang && req.Kind == callStatus {
				h.hung[uid] = req.ID
				steps = append(steps, h.tick(h.now.Add(scriptTimeout)))
				continue
			}
			s := h.returnCall(req.ID, fail && req.Kind == callStatus)
			steps = append(steps, s)
			next = append(next, s.calls...)
		}
		pending = next
	}
	return steps
}

func (h *harness) exec(b block) []string {
	t := h.t
	fields := strings.Fields(b.cmd)
	args := map[string]string{}
	for _, a := range fields[1:] {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	set := func(v string) map[types.UID]bool {
		m := map[types.UID]bool{}
		for _, uid := range strings.Split(v, ",") {
			if uid != "" {
				m[types.UID(uid)] = true
			}
		}
		return m
	}
	_, fail := args["fail"]
	switch fields[0] {
	case "relist":
		h.setListing(h.listing(b.input), true)
		return h.relist(set(args["fail"]), set(args["hang"]), false)
	case "relist-fails":
		return h.relist(nil, nil, true)
	case "podrelist":
		uid := types.UID(fields[1])
		delete(h.pods, uid)
		h.setListing(h.listing(b.input), false)
		_, hang := args["hang"]
		return h.podRelist(uid, fail, hang)
	case "hint":
		at := h.now
		if v, ok := args["at"]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("line %d: %v", b.lineNo, err)
			}
			at = at.Add(d)
		}
		in := hintIn{uid: types.UID(fields[1]), at: at}
		if v, ok := args["event"]; ok {
			typ, id, _ := strings.Cut(v, ":")
			in.event, in.container = true, id
			in.eventType = map[string]cruntime.EventType{"created": cruntime.EventCreated, "started": cruntime.EventStarted,
				"stopped": cruntime.EventStopped, "deleted": cruntime.EventDeleted}[typ]
		}
		return render(h.step(in))
	case "reinspect":
		return render(h.step(reinspectIn{uid: types.UID(fields[1])}))
	case "start-relist":
		return render(h.step(relistNow{}))
	case "tick":
		d, err := time.ParseDuration(fields[1])
		if err != nil {
			t.Fatalf("line %d: %v", b.lineNo, err)
		}
		return render(h.tick(h.now.Add(d)))
	case "return":
		n := h.callOf(fields[1])
		if n == 0 {
			return []string{"no call out for " + fields[1]}
		}
		if len(b.input) > 0 {
			pods := h.listing(b.input)
			if req := h.out[callID(n)]; req.Kind == callListPod {
				delete(h.pods, req.UID)
			}
			h.setListing(pods, h.out[callID(n)].Kind == callList)
		}
		return render(h.returnCall(callID(n), fail))
	case "release":
		uid := types.UID(fields[1])
		id, ok := h.hung[uid]
		if !ok {
			t.Fatalf("line %d: no hung call for %s", b.lineNo, uid)
		}
		steps := []stepped{h.returnCall(id, false)}
		return render(append(steps, h.answerPod(uid, steps[0].calls)...)...)
	case "auto":
		h.c.cfg.manual = false
		return nil
	case "identity":
		return render(h.step(identityIn{wanted: fields[1] == "on"}))
	case "adaptive":
		d, err := time.ParseDuration(args["max"])
		if err != nil {
			t.Fatalf("line %d: %v", b.lineNo, err)
		}
		h.c.cfg.maxPeriod, h.c.cfg.manual = d, false
		if v, ok := args["trust"]; ok {
			// trust=off: no bound by the stream's clean time, for
			// scripts of the other rules.
			n, err := strconv.Atoi(v)
			if v == "off" {
				n, err = 0, nil
			}
			if err != nil {
				t.Fatalf("line %d: trust: %v", b.lineNo, err)
			}
			h.c.cfg.trust = n
		}
		return nil
	case "stream":
		st := map[string]journal.RuntimeState{"connected": journal.RuntimeEventStreamConnected, "lost": journal.RuntimeEventStreamLost}[fields[1]]
		return render(h.step(streamChanged{status: journal.RuntimeStatus{State: st}}))
	case "taken":
		// A take with a reader of the cache waiting, unless waiters=N.
		waiters := 1
		if v, ok := args["waiters"]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("line %d: waiters: %v", b.lineNo, err)
			}
			waiters = n
		}
		return render(h.step(taken{at: h.now, waiters: waiters}))
	case "inbox-lost":
		return render(h.step(hintsLost{}))
	case "doubt":
		return render(h.step(runtimeDoubted{}))
	case "wake":
		// When the loop next wakes for time (core.Wake).
		w := h.c.Wake()
		if w.IsZero() {
			return []string{"no wake"}
		}
		return []string{"wake in " + w.Sub(h.now).String()}
	case "due":
		if h.c.relist.phase != relistIdle {
			return []string{"relist running"}
		}
		return []string{"next relist in " + h.c.relist.due.Sub(h.now).String()}
	case "cache-time":
		return []string{"cache time: " + h.cache.Timestamp().Sub(h.start).String()}
	case "budget":
		bu := &h.c.cfg.budget
		for k, v := range args {
			var err error
			switch k {
			case "rate":
				bu.rate, err = strconv.ParseFloat(v, 64)
			case "burst":
				bu.burst, err = strconv.Atoi(v)
			case "queue":
				bu.queue, err = strconv.Atoi(v)
			case "slots":
				h.c.cfg.slots, err = strconv.Atoi(v)
			case "spacing":
				bu.spacing, err = time.ParseDuration(v)
			case "early":
				bu.early, err = time.ParseDuration(v)
			default:
				err = fmt.Errorf("unknown budget argument %q", k)
			}
			if err != nil {
				t.Fatalf("line %d: %v", b.lineNo, err)
			}
		}
		return nil
	case "calls":
		var ids []int
		for id := range h.out {
			ids = append(ids, int(id))
		}
		sort.Ints(ids)
		var out []string
		for _, id := range ids {
			line := callLine(h.out[callID(id)])
			if k := h.c.calls[callID(id)]; k != nil && k.abandoned {
				line += " (abandoned)"
			}
			out = append(out, line)
		}
		return out
	case "ips":
		h.ips[types.UID(fields[1])] = fields[2:]
		return nil
	case "moves":
		// The runtime's statuses show these items in these states from
		// now on, whatever their listing says (they moved on since).
		for _, a := range fields[1:] {
			id, st, _ := strings.Cut(a, "=")
			st, code, hasCode := strings.Cut(st, ":")
			if hasCode {
				n, _ := strconv.Atoi(code)
				h.exit[id] = int32(n)
			}
			h.moved[id] = parseState(st)
		}
		return nil
	case "cache":
		var out []string
		for _, e := range h.cache.List() {
			out = append(out, formatEntry(e.Status, e.Err))
		}
		return out
	case "get":
		s, err := h.cache.Get(types.UID(fields[1]))
		return []string{formatEntry(s, err)}
	}
	t.Fatalf("line %d: unknown command %q", b.lineNo, b.cmd)
	return nil
}

func formatEntry(s *cruntime.PodStatus, err error) string {
	var b strings.Builder
	b.WriteString(string(s.UID))
	for _, c := range s.SandboxStatuses {
		fmt.Fprintf(&b, " s:%s=%s", c.ID, c.State)
	}
	for _, c := range s.ContainerStatuses {
		fmt.Fprintf(&b, " %s=%s", c.ID, c.State)
	}
	if len(s.IPs) > 0 {
		fmt.Fprintf(&b, " ips=%s", strings.Join(s.IPs, ","))
	}
	if err != nil {
		fmt.Fprintf(&b, " err=%q", err)
	}
	return b.String()
}

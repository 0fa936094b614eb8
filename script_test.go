package pleg

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/podcache"
	"k8s.io/apimachinery/pkg/types"
)

var update = flag.Bool("update", false, "rewrite the expected output of testdata scripts")

// TestScripts runs the scenarios in testdata/core against the pure core
// (core.go), with a small harness in place of the shell: it answers the
// core's inspections from the listing, applies cache writes to a real
// podcache and prints the events. Each file is a sequence of blocks:
//
//	command [args]
//	input lines
//	----
//	expected output
//
// ending at a blank line. Listings are one pod a line, "UID id=state ..."
// ("s:id=state" for a sandbox; "id=exited:3" for an exit code). The clock
// moves one second before every relist and podrelist. Commands:
//
//	relist [fail=A,B] [timeout=C]
//	                    a global relist with the complete listing as input
//	                    (fail: those pods' status fetches fail; timeout:
//	                    they exceed the pod inspection timeout). Output:
//	                    "status: UIDs" (the pods whose status was fetched,
//	                    or -), then the events delivered, grouped by pod.
//	relist-fails        a global relist whose listing failed: the core is
//	                    not stepped. Output: the events (none).
//	podrelist UID [fail] [timeout] [stale]
//	                    a single-pod relist with the pod's listing as input
//	                    (no line: the runtime has nothing for it; stale: the
//	                    listing predates the last global relist). Output:
//	                    "stale", "observed", or "status: UID|-" and events.
//	podlist-timeout UID a single-pod relist's list call timed out. Output:
//	                    "cached" (the error is cached) or "-".
//	hint UID at=DUR     a hint made DUR (e.g. -2s, +0s) from now. Output:
//	                    "covered" (no call) or "call".
//	reinspect UID       RequestReinspect(UID). No output.
//	ips UID [ip...]     the IPs the runtime reports for UID from now on.
//	cache               output: every cache entry.
//	get UID             output: Get(UID) for one pod, present or not.
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

// harness is the scripts' stand-in for the shell.
type harness struct {
	c         *core
	cache     *podcache.Cache
	now       time.Time
	ips       map[types.UID][]string
	exit      map[string]int32 // container ID -> exit code in statuses
	requested map[types.UID]struct{}
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

func runScript(t *testing.T, file string) {
	blocks, preamble := parseScript(t, file)
	h := &harness{c: newCore(false), cache: podcache.New(), now: time.Unix(1_700_000_000, 0),
		ips: map[types.UID][]string{}, exit: map[string]int32{}, requested: map[types.UID]struct{}{}}
	var out strings.Builder
	for _, l := range preamble {
		out.WriteString(l + "\n")
	}
	for n, b := range blocks {
		got := h.exec(t, b)
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
				panic("bad exit code in " + it)
			}
			h.exit[id] = int32(n)
			items[i] = prefix + id + "=" + st
		}
		pods = append(pods, pod(f[0], items...))
	}
	return pods
}

// status answers an inspection from the listing, as the fake runtime does.
func (h *harness) status(p *cruntime.Pod) *cruntime.PodStatus {
	s := &cruntime.PodStatus{UID: p.UID, Name: p.Name, Namespace: p.Namespace, IPs: slices.Clone(h.ips[p.UID])}
	for _, c := range p.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, &cruntime.ContainerStatus{ID: c.ID, Name: c.Name, State: c.State, ExitCode: h.exit[c.ID]})
	}
	for _, sb := range p.Sandboxes {
		s.SandboxStatuses = append(s.SandboxStatuses, &cruntime.SandboxStatus{ID: sb.ID, State: sb.State})
	}
	return s
}

// inspect answers w (fail and timeout name the pods whose inspection
// fails), steps the core and applies the outcome; it returns the events.
func (h *harness) inspect(w work, fail, timeout map[types.UID]bool) []Event {
	var status *cruntime.PodStatus
	var err error
	switch {
	case w.pod == nil:
	case fail[w.uid]:
		err = errStatus
	case timeout[w.uid]:
		err = &InspectionTimeoutError{Pod: podRef(w.pod), UID: w.uid, Operation: "container_status", Waited: 10 * time.Second}
	default:
		status = h.status(w.pod)
	}
	o := h.c.inspected(w, status, err, h.now)
	switch {
	case o.Stale:
		return nil
	case o.Delete:
		h.cache.Delete(w.uid)
	default:
		h.cache.Set(w.uid, o.Status, o.Err, o.At)
	}
	return o.Events
}

func (h *harness) exec(t *testing.T, b block) []string {
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
	statusLine := func(uids []string) string {
		sort.Strings(uids)
		if len(uids) == 0 {
			return "status: -"
		}
		return "status: " + strings.Join(uids, " ")
	}
	switch fields[0] {
	case "relist":
		for k := range args {
			if k != "fail" && k != "timeout" {
				t.Fatalf("line %d: unknown relist argument %q", b.lineNo, k)
			}
		}
		h.now = h.now.Add(time.Second)
		var requested []types.UID
		for uid := range h.requested {
			requested = append(requested, uid)
		}
		clear(h.requested)
		todo := h.c.listed(h.now, h.listing(b.input), requested)
		fail, timeout := set(args["fail"]), set(args["timeout"])
		var called []string
		var events []Event
		for _, w := range todo {
			if w.pod != nil {
				called = append(called, string(w.uid))
			}
			events = append(events, h.inspect(w, fail, timeout)...)
		}
		h.cache.UpdateTime(h.now)
		return append([]string{statusLine(called)}, formatEvents(events)...)
	case "relist-fails":
		h.now = h.now.Add(time.Second)
		return nil
	case "podrelist":
		h.now = h.now.Add(time.Second)
		uid := types.UID(fields[1])
		var p *cruntime.Pod
		if pods := h.listing(b.input); len(pods) == 1 {
			p = pods[0]
		}
		gen := h.c.gen
		if _, ok := args["stale"]; ok {
			gen--
		}
		_, req := h.requested[uid]
		requested := !h.c.flagged(uid) && req
		if requested {
			delete(h.requested, uid)
		}
		w, ok, stale := h.c.podListed(uid, p, gen, requested)
		switch {
		case stale:
			return []string{"stale"}
		case !ok:
			h.cache.MarkObserved(uid, h.now)
			return []string{"observed"}
		}
		fail, timeout := map[types.UID]bool{}, map[types.UID]bool{}
		if _, ok := args["fail"]; ok {
			fail[uid] = true
		}
		if _, ok := args["timeout"]; ok {
			timeout[uid] = true
		}
		var called []string
		if w.pod != nil {
			called = []string{string(uid)}
		}
		return append([]string{statusLine(called)}, formatEvents(h.inspect(w, fail, timeout))...)
	case "podlist-timeout":
		uid := types.UID(fields[1])
		if !h.c.listTimedOut(uid, h.c.gen) {
			return []string{"-"}
		}
		st, _ := h.cache.Get(uid)
		h.cache.Set(uid, st, &InspectionTimeoutError{Pod: "ns/name-" + string(uid), UID: uid, Operation: "list_containers", Waited: 10 * time.Second}, h.now)
		return []string{"cached"}
	case "hint":
		d, err := time.ParseDuration(args["at"])
		if err != nil {
			t.Fatalf("line %d: %v", b.lineNo, err)
		}
		if covered(h.now.Add(d), h.c.lastRelist) {
			return []string{"covered"}
		}
		return []string{"call"}
	case "reinspect":
		h.requested[types.UID(fields[1])] = struct{}{}
		return nil
	case "ips":
		h.ips[types.UID(fields[1])] = fields[2:]
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

package pleg

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/runtime"
	"k8s.io/apimachinery/pkg/types"
	testclock "k8s.io/utils/clock/testing"
)

var update = flag.Bool("update", false, "rewrite the expected output of testdata scripts")

// TestScripts runs the relist scenarios in testdata/relist. Each file is a
// sequence of blocks:
//
//	command [args]
//	input lines
//	----
//	expected output
//
// ending at a blank line. Commands:
//
//	relist [fail=A,B]   input: the complete listing, one pod a line:
//	                    "UID id=state ..." ("s:id=state" for a sandbox).
//	                    Output: "status: UIDs" (pods whose status was
//	                    fetched, or -), then the events delivered, grouped
//	                    by pod in delivery order.
//	reinspect UID       RequestReinspect(UID). No output.
//	ips UID [ip...]     the IPs the runtime reports for UID from now on.
//	cache               output: every cache entry.
//	get UID             output: Get(UID) for one pod, present or not.
//
// Run with -update to rewrite the expected output.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/relist/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
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
	rt := newFakeRuntime()
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	g, err := New(Options{Runtime: rt, Clock: clk, MaxParallelInspections: 1})
	if err != nil {
		t.Fatal(err)
	}
	ch := g.Watch()
	ctx := context.Background()
	var out strings.Builder
	for _, l := range preamble {
		out.WriteString(l + "\n")
	}
	for n, b := range blocks {
		got := execBlock(t, g, rt, clk, ch, ctx, b)
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

func execBlock(t *testing.T, g *Generator, rt *fakeRuntime, clk *testclock.FakeClock, ch <-chan *Event, ctx context.Context, b block) []string {
	fields := strings.Fields(b.cmd)
	switch fields[0] {
	case "relist":
		var pods []*runtime.Pod
		for _, l := range b.input {
			f := strings.Fields(l)
			pods = append(pods, pod(f[0], f[1:]...))
		}
		rt.setPods(pods...)
		rt.mu.Lock()
		clear(rt.fail)
		for _, arg := range fields[1:] {
			k, v, _ := strings.Cut(arg, "=")
			if k != "fail" {
				t.Fatalf("line %d: unknown relist argument %q", b.lineNo, arg)
			}
			for _, uid := range strings.Split(v, ",") {
				rt.fail[types.UID(uid)] = errStatus
			}
		}
		rt.statusOf = nil
		rt.mu.Unlock()
		clk.Step(time.Second)
		g.relist(ctx)
		rt.mu.Lock()
		calls := make([]string, len(rt.statusOf))
		for i, u := range rt.statusOf {
			calls[i] = string(u)
		}
		rt.mu.Unlock()
		sort.Strings(calls)
		line := "status: -"
		if len(calls) > 0 {
			line = "status: " + strings.Join(calls, " ")
		}
		return append([]string{line}, formatEvents(drain(ch))...)
	case "reinspect":
		g.RequestReinspect(types.UID(fields[1]))
		return nil
	case "ips":
		rt.mu.Lock()
		rt.ips[types.UID(fields[1])] = fields[2:]
		rt.mu.Unlock()
		return nil
	case "cache":
		var out []string
		for _, e := range g.Cache().List() {
			out = append(out, formatEntry(e.Status, e.Err))
		}
		return out
	case "get":
		s, err := g.Cache().Get(types.UID(fields[1]))
		return []string{formatEntry(s, err)}
	}
	t.Fatalf("line %d: unknown command %q", b.lineNo, b.cmd)
	return nil
}

func formatEntry(s *runtime.PodStatus, err error) string {
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

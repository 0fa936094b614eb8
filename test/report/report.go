package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (see `go doc cmd/test2json`).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	ImportPath  string
	FailedBuild string
}

// pkgResult is how one package's tests ended.
type pkgResult struct {
	name    string
	outcome string // ok, FAIL, skip (no test files)
	elapsed time.Duration
}

type reporter struct {
	w io.Writer

	// output of each running test, and of each package outside its
	// tests, keyed by package then test ("" for the package).
	out map[string]map[string][]string

	passed, failed, skipped int
	skips                   []string // "pkg Test: reason"
	pkgs                    []pkgResult
	tests                   []testResult // top-level tests that passed or failed
	buildFailed             []string
}

// testResult is how long one top-level test took.
type testResult struct {
	pkg, name, outcome string
	elapsed            time.Duration
}

// slowestTests is how many tests the summary lists by time.
const slowestTests = 10

func newReporter(w io.Writer) *reporter {
	return &reporter{w: w, out: map[string]map[string][]string{}}
}

func (r *reporter) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			// Not an event: go itself printed it (a build error
			// before -json took over, say). Show it as is.
			fmt.Fprintln(r.w, string(line))
			continue
		}
		r.step(e)
	}
	return sc.Err()
}

func (r *reporter) lines(pkg, test string) []string { return r.out[pkg][test] }

func (r *reporter) step(e event) {
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.w, e.Output)
		return
	case "build-fail":
		r.buildFailed = append(r.buildFailed, e.ImportPath)
		return
	}
	if r.out[e.Package] == nil {
		r.out[e.Package] = map[string][]string{}
	}
	switch e.Action {
	case "output":
		r.out[e.Package][e.Test] = append(r.out[e.Package][e.Test], e.Output)
	case "pass", "fail", "skip":
		if e.Test != "" {
			r.testDone(e)
		} else {
			r.pkgDone(e)
		}
	}
}

func (r *reporter) testDone(e event) {
	out := r.lines(e.Package, e.Test)
	delete(r.out[e.Package], e.Test)
	if e.Action != "skip" && !strings.Contains(e.Test, "/") {
		r.tests = append(r.tests, testResult{pkg: e.Package, name: e.Test, outcome: e.Action,
			elapsed: time.Duration(e.Elapsed * float64(time.Second)).Round(10 * time.Millisecond)})
	}
	switch e.Action {
	case "pass":
		r.passed++
		// A passing test's figures (the e2e suite's MEASURE lines) are
		// shown: a run under the load harness reports them.
		for _, l := range out {
			if strings.HasPrefix(l, "MEASURE ") {
				fmt.Fprint(r.w, l)
			}
		}
	case "fail":
		r.failed++
		for _, l := range out {
			fmt.Fprint(r.w, l)
		}
	case "skip":
		r.skipped++
		s := fmt.Sprintf("%s %s: %s", e.Package, e.Test, skipReason(out))
		r.skips = append(r.skips, s)
		fmt.Fprintln(r.w, "SKIP", s)
	}
}

// skipReason is the message t.Skip printed: the test's indented log
// lines.
func skipReason(out []string) string {
	var msg []string
	for _, l := range out {
		if !strings.HasPrefix(l, "    ") {
			continue // "=== RUN", "--- SKIP"
		}
		msg = append(msg, strings.TrimSpace(l))
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " ")
}

// goTestLine matches the lines go test prints itself at a package's end,
// which the report prints in its own words.
func goTestLine(l string) bool {
	l = strings.TrimRight(l, "\n")
	return l == "PASS" || l == "FAIL" || strings.HasPrefix(l, "ok  \t") || strings.HasPrefix(l, "FAIL\t")
}

func (r *reporter) pkgDone(e event) {
	out := r.lines(e.Package, "")
	// Tests still running when the package ended: a binary killed by
	// its -timeout (whose panic names them) or one that exited in a
	// test. Their output is what tells why.
	var unfinished []string
	for test := range r.out[e.Package] {
		if test != "" && len(r.out[e.Package][test]) > 0 {
			unfinished = append(unfinished, test)
		}
	}
	slices.Sort(unfinished)
	for _, test := range unfinished {
		fmt.Fprintf(r.w, "--- output of %s %s, which never finished:\n", e.Package, test)
		for _, l := range r.out[e.Package][test] {
			fmt.Fprint(r.w, l)
		}
	}
	delete(r.out, e.Package)
	d := time.Duration(e.Elapsed * float64(time.Second)).Round(10 * time.Millisecond)
	res := pkgResult{name: e.Package, elapsed: d}
	switch e.Action {
	case "pass":
		res.outcome = "ok"
		// A passing package's own lines are shown only when they
		// announce a skip (a TestMain that skipped the suite).
		for _, l := range out {
			if strings.HasPrefix(strings.TrimSpace(l), "SKIP") {
				fmt.Fprint(r.w, l)
				r.skips = append(r.skips, e.Package+": "+strings.TrimSpace(l))
			}
		}
		fmt.Fprintf(r.w, "ok  \t%s\t%.3fs\n", e.Package, d.Seconds())
	case "fail":
		res.outcome = "FAIL"
		for _, l := range out {
			if !goTestLine(l) {
				fmt.Fprint(r.w, l)
			}
		}
		fmt.Fprintf(r.w, "FAIL\t%s\t%.3fs\n", e.Package, d.Seconds())
	case "skip":
		res.outcome = "skip"
		fmt.Fprintf(r.w, "?   \t%s\t[no test files]\n", e.Package)
	}
	r.pkgs = append(r.pkgs, res)
}

// summary prints the skips, the packages by time and the closing count,
// and reports whether everything passed.
func (r *reporter) summary() bool {
	// Output of tests that never ended (a binary killed by its timeout
	// prints its panic outside any test, but be safe).
	for pkg, tests := range r.out {
		for test, out := range tests {
			if len(out) > 0 {
				fmt.Fprintf(r.w, "--- output of %s %s, which never finished:\n", pkg, test)
				for _, l := range out {
					fmt.Fprint(r.w, l)
				}
			}
		}
	}
	if len(r.skips) > 0 {
		fmt.Fprintf(r.w, "\nskipped (%d):\n", len(r.skips))
		for _, s := range r.skips {
			fmt.Fprintln(r.w, "  "+s)
		}
	}
	ran := slices.DeleteFunc(slices.Clone(r.pkgs), func(p pkgResult) bool { return p.outcome == "skip" })
	slices.SortFunc(ran, func(a, b pkgResult) int { return int(b.elapsed - a.elapsed) })
	if len(ran) > 0 {
		fmt.Fprintln(r.w, "\ntime per package (test binary run time, slowest first):")
		for _, p := range ran {
			fmt.Fprintf(r.w, "  %8.1fs  %-4s %s\n", p.elapsed.Seconds(), p.outcome, p.name)
		}
	}
	if len(r.tests) > 0 {
		tests := slices.Clone(r.tests)
		slices.SortStableFunc(tests, func(a, b testResult) int { return int(b.elapsed - a.elapsed) })
		fmt.Fprintf(r.w, "\nslowest tests (top-level, of %d):\n", len(tests))
		for _, t := range tests[:min(slowestTests, len(tests))] {
			fmt.Fprintf(r.w, "  %8.1fs  %-4s %s %s\n", t.elapsed.Seconds(), t.outcome, t.pkg, t.name)
		}
	}
	ok := r.failed == 0 && len(r.buildFailed) == 0
	for _, p := range r.pkgs {
		if p.outcome == "FAIL" {
			ok = false
		}
	}
	if len(r.pkgs) == 0 {
		fmt.Fprintln(r.w, "report: no package results in the input")
		ok = false
	}
	for _, b := range r.buildFailed {
		fmt.Fprintln(r.w, "build failed:", b)
	}
	fmt.Fprintln(r.w)
	fmt.Fprintf(r.w, "%d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped)
	return ok
}

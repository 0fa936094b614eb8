package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportOfRealGoTest runs the real `go test -json` on a small module
// with a passing, a failing and a skipped test and a package whose
// TestMain skips everything, and checks what a reader of the report sees.
func TestReportOfRealGoTest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("a/a_test.go", `package a

import (
	"fmt"
	"testing"
)

func TestGood(t *testing.T) { t.Log("quiet when passing"); fmt.Println("MEASURE good=1") }
func TestBad(t *testing.T)  { t.Error("broken on purpose") }
func TestSkipped(t *testing.T) { t.Skip("needs a unicorn") }
`)
	write("b/b_test.go", `package b

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	fmt.Println("SKIP: the whole suite, because B_SKIP=1")
	os.Exit(0)
}

func TestNever(t *testing.T) {}
`)
	write("c/c.go", "package c\n")
	write("d/d_test.go", `package d

import (
	"testing"
	"time"
)

func TestHangs(t *testing.T) {
	t.Log("waiting for something that never comes")
	time.Sleep(time.Hour)
}
`)

	cmd := exec.Command("go", "test", "-count=1", "-json", "-timeout=3s", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	js, err := cmd.Output()
	if err == nil {
		t.Fatal("go test passed although a test fails")
	}
	var out bytes.Buffer
	r := newReporter(&out)
	if err := r.read(bytes.NewReader(js)); err != nil {
		t.Fatal(err)
	}
	if r.summary() {
		t.Error("summary says all passed")
	}
	got := out.String()
	for _, want := range []string{
		"broken on purpose",
		"SKIP example.com/m/a TestSkipped: a_test.go:10: needs a unicorn",
		"MEASURE good=1\n",
		"SKIP: the whole suite, because B_SKIP=1",
		"FAIL\texample.com/m/a\t",
		"ok  \texample.com/m/b\t",
		"?   \texample.com/m/c\t[no test files]",
		"--- output of example.com/m/d TestHangs, which never finished:",
		"waiting for something that never comes",
		"FAIL\texample.com/m/d\t",
		"time per package",
		"slowest tests (top-level, of 2):",
		"pass example.com/m/a TestGood",
		"fail example.com/m/a TestBad",
		"\n1 passed, 1 failed, 1 skipped\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet when passing") {
		t.Errorf("report shows a passing test's log:\n%s", got)
	}
}

func TestReportWithNoResultsFails(t *testing.T) {
	var out bytes.Buffer
	r := newReporter(&out)
	if err := r.read(strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if r.summary() {
		t.Errorf("empty input passed:\n%s", out.String())
	}
}

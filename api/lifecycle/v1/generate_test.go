package lifecyclev1_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGeneratedCodeIsCurrent re-runs the pinned generator (tools/protogen)
// into a temporary directory and fails on any difference from the
// checked-in code. It is safe beside other test binaries: it writes only
// under its own temporary directory, and the Go module and build caches
// it shares with them take their own locks.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute) // a fresh machine downloads and builds the tools
	defer cancel()
	cmd := exec.CommandContext(ctx, goCommand(t), "run", ".", "-root", "../..", "-out", out, "api/lifecycle/v1/lifecycle.proto")
	cmd.Dir = filepath.Join("..", "..", "..", "tools", "protogen")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tools/protogen: %v\n%s", err, stderr.String())
	}
	generated, err := filepath.Glob(filepath.Join(out, "api", "lifecycle", "v1", "*.go"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("tools/protogen generated nothing (%v)", err)
	}
	checkedIn, _ := filepath.Glob("*.pb.go")
	if len(checkedIn) != len(generated) {
		t.Errorf("checked in %v, generated %d files: run go generate ./api/...", checkedIn, len(generated))
	}
	for _, g := range generated {
		name := filepath.Base(g)
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("%s is generated but not checked in: run go generate ./api/...", name)
			continue
		}
		if line, ok := firstDifference(got, want); ok {
			t.Errorf("%s differs from what tools/protogen generates (run go generate ./api/...); first difference at line %d:\nchecked in: %q\ngenerated:  %q",
				name, line.n, line.got, line.want)
		}
	}
}

type difference struct {
	n         int
	got, want string
}

// firstDifference returns the first line where got and want differ.
func firstDifference(got, want []byte) (difference, bool) {
	if bytes.Equal(got, want) {
		return difference{}, false
	}
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; ; i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return difference{n: i + 1, got: gl, want: wl}, true
		}
	}
}

// goCommand returns the go command that runs the tests: GOROOT's, else the
// one on PATH.
func goCommand(t *testing.T) string {
	if r := os.Getenv("GOROOT"); r != "" {
		if p := filepath.Join(r, "bin", "go"); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to run tools/protogen: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

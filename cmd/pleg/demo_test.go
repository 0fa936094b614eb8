package main

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The demo runs on a fresh machine with nothing but the binary, ends on
// its own with --duration, and in the hung-pod scenario names the slow pod
// while health stays ok.
func TestDemoProcess(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--scenario", "idle", "--duration", "2s"}, []string{`scenario=idle health="ok"`, "pods=0"}},
		{[]string{"--scenario", "hung-pod", "--duration", "4s", "--pod-inspection-timeout", "500ms"},
			[]string{`scenario=hung-pod health="ok"`, "pods=10", "slow=1"}},
	} {
		t.Run(tc.args[1], func(t *testing.T) {
			cmd := exec.Command(plegBinary, append([]string{"demo", "--listen-address", "127.0.0.1:0"}, tc.args...)...)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("demo did not end on its own")
			}
			if err != nil {
				t.Fatalf("demo failed: %v\n%s", err, out)
			}
			last := lastLine(string(out))
			for _, w := range tc.want {
				if !strings.Contains(last, w) {
					t.Errorf("final line %q lacks %q", last, w)
				}
			}
			if !regexp.MustCompile(`relists=[1-9]`).MatchString(last) {
				t.Errorf("no relist in %q", last)
			}
			if strings.Contains(string(out), "E1") || strings.Contains(string(out), "I1") {
				t.Errorf("log lines leaked onto the terminal:\n%s", out)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

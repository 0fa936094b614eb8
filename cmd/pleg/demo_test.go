package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg"
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
			if leaked := logLineRE.FindAllString(string(out), -1); len(leaked) > 0 {
				t.Errorf("log lines leaked onto the terminal: %q\n%s", leaked, out)
			}
		})
	}
}

// logLineRE matches the start of a log line: klog's header
// "Lmmdd hh:mm:ss.uuuuuu pid file:line] msg" of any severity (Info, Warning,
// Error, Fatal) and any date, or the standard library log's
// "yyyy/mm/dd hh:mm:ss" (gRPC's default logger, for one). The demo's own
// lines (events start "hh:mm:ss.mmm", the rest with a word) match neither.
var logLineRE = regexp.MustCompile(`(?m)^(?:[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}|\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2})`)

// TestLogLineRE pins logLineRE on lines of every severity in every month,
// so that TestDemoProcess cannot pass only because of the date.
func TestLogLineRE(t *testing.T) {
	for month := 1; month <= 12; month++ {
		for _, sev := range "IWEF" {
			line := fmt.Sprintf("%c%02d07 09:04:05.123456   12345 relist.go:42] \"GenericPLEG: Unable to retrieve pods\" err=\"boom\"", sev, month)
			if !logLineRE.MatchString("demo: started\n" + line + "\n") {
				t.Errorf("logLineRE does not match %q", line)
			}
		}
	}
	for _, line := range []string{
		"2026/03/04 05:06:07 WARNING: [core] grpc: addrConn.createTransport failed",
		"2026/11/04 05:06:07.123456 INFO: something",
	} {
		if !logLineRE.MatchString(line) {
			t.Errorf("logLineRE does not match %q", line)
		}
	}
	at := time.Date(2026, 10, 4, 5, 6, 7, 891_000_000, time.UTC)
	three := int32(3)
	for _, line := range []string{
		eventLine(pleg.Event{Time: at, Type: pleg.ContainerDied, PodName: "api", PodNamespace: "default",
			ContainerID: "fedcba9876543210", ContainerName: "server", ExitCode: &three}),
		"status: health=\"ok\" relists=3 p50=1ms p99=2ms pods=10 events=21 slow=1",
		"demo finished: scenario=idle health=\"ok\" relists=2 p50=1ms p99=1ms pods=0 events=0 slow=0",
		"pleg demo: scenario idle (a node with no pods)",
		"http    http://127.0.0.1:40000/  logs /tmp/pleg-demo-1/pleg.log",
		"E1 is not a header; I1 neither",
	} {
		if logLineRE.MatchString(line) {
			t.Errorf("logLineRE matches the demo's own line %q", line)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

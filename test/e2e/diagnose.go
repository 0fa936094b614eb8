package e2e

// `pleg diagnose` run the way the tests that check it run it (TestDiagnose,
// TestDiagnoseHungShim), and its JSON report.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// diagReport is what the test reads of `pleg diagnose --output json`.
type diagReport struct {
	TookSeconds float64 `json:"tookSeconds"`
	List        struct {
		Calls []diagCall `json:"calls"`
		Error string     `json:"error"`
	} `json:"list"`
	Pods []struct {
		UID         string    `json:"podUID"`
		Name        string    `json:"podName"`
		Namespace   string    `json:"podNamespace"`
		Result      string    `json:"result"`
		Error       string    `json:"error"`
		SlowestCall *diagCall `json:"slowestCall"`
	} `json:"pods"`
	Estimate struct {
		RelistSeconds    float64 `json:"relistSeconds"`
		HungCalls        int     `json:"hungCalls"`
		ExceedsThreshold bool    `json:"exceedsThreshold"`
		ListFails        bool    `json:"listFails"`
	} `json:"estimate"`
	Healthy   bool `json:"healthy"`
	ShimProbe *struct {
		Reason    string `json:"reason"`
		Sandboxes int    `json:"sandboxes"`
		Answered  int    `json:"answered"`
		Stuck     int    `json:"stuck"`
		Skipped   int    `json:"skipped"`
		Error     string `json:"error"`
	} `json:"shimProbe"`
	StuckShims []struct {
		Pod       string  `json:"pod"`
		PodUID    string  `json:"podUID"`
		SandboxID string  `json:"sandboxID"`
		Seconds   float64 `json:"seconds"`
	} `json:"stuckShims"`
	Cause *struct {
		Pod            string  `json:"pod"`
		PodUID         string  `json:"podUID"`
		Call           string  `json:"call"`
		ID             string  `json:"id"`
		Hung           bool    `json:"hung"`
		Error          string  `json:"error"`
		KubeletSeconds float64 `json:"kubeletSeconds"`
	} `json:"cause"`
	Verdict string `json:"verdict"`
}

type diagCall struct {
	Call    string  `json:"call"`
	ID      string  `json:"id"`
	Seconds float64 `json:"seconds"`
	Hung    bool    `json:"hung"`
	Error   string  `json:"error"`
}

// runDiagnose runs `pleg diagnose --probe-timeout 1s
// --runtime-request-timeout 30s` with --output json and then with the text
// output, checks that both exit with wantCode, and returns the report, the
// text and how long the JSON run took.
func runDiagnose(t testing.TB, wantCode int) (diagReport, string, time.Duration) {
	t.Helper()
	run := func(format string) (string, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, PlegBinary(t), "diagnose", "-r", CRIEndpoint(), "-o", format,
			"--probe-timeout", "1s", "--runtime-request-timeout", "30s")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		s := time.Now()
		err := cmd.Run()
		took := time.Since(s)
		code := 0
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("pleg diagnose -o %s: %v\nstderr: %s", format, err, stderr.String())
		}
		if code != wantCode {
			t.Fatalf("pleg diagnose -o %s: exit code %d, want %d\nstdout: %s\nstderr: %s", format, code, wantCode, stdout.String(), stderr.String())
		}
		return stdout.String(), took
	}
	out, took := run("json")
	var rep diagReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("pleg diagnose -o json: %v: %s", err, out)
	}
	text, _ := run("text")
	return rep, text, took
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

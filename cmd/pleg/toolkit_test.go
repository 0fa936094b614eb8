package main

// Tests of the operator's toolkit: pleg check, pleg pods and pleg diagnose,
// run as processes (the binary built by TestMain) against a simulated
// runtime and a real `pleg run`, or against fake HTTP servers.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/diagnose"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
)

// runTool runs pleg to completion and returns its stdout, stderr and exit
// code.
func runTool(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(plegBinary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * patience):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("pleg %s did not exit within %v", strings.Join(args, " "), 2*patience)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// refusedAddr returns "127.0.0.1:port" of a port that refuses connections
// and that no other process can take until the test ends: a socket is
// bound to it, and does not listen. (A port listened on and closed again
// may be taken by a test binary running beside this one.)
func refusedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// startDaemon starts `pleg run` against endpoint and returns its base URL.
func startDaemon(t *testing.T, endpoint string, extra ...string) string {
	t.Helper()
	args := append([]string{"run", "-r", endpoint, "--listen-address", "127.0.0.1:0",
		"--relist-period", "100ms", "--node-name", "node-a"}, extra...)
	base, _ := startPleg(t, args...).waitListening()
	return base
}

// checkLine asserts that `pleg check` printed exactly one stdout line.
func checkLine(t *testing.T, stdout string) string {
	t.Helper()
	if !strings.HasSuffix(stdout, "\n") || strings.Count(stdout, "\n") != 1 {
		t.Errorf("check printed %q, want exactly one line", stdout)
	}
	return strings.TrimSuffix(stdout, "\n")
}

func TestCheckAgainstFakeDaemons(t *testing.T) {
	serve := func(code int, ctype, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ctype != "" {
				w.Header().Set("Content-Type", ctype)
			}
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	dead := "http://" + refusedAddr(t) + "/readyz"

	unhealthy := "PLEG is not healthy: pleg was last seen active 3m12.45s ago; threshold is 3m0s"
	for _, c := range []struct {
		name     string
		url      string
		wantCode int
		wantLine string
	}{
		{"ready", serve(200, "application/json", `{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status"}`) + "/readyz",
			0, "kubelet is posting ready status"},
		{"not ready", serve(503, "application/json", `{"type":"Ready","status":"False","reason":"KubeletNotReady","message":"`+unhealthy+`","errors":["`+unhealthy+`"]}`) + "/readyz",
			1, unhealthy},
		{"several errors", serve(503, "application/json", `{"type":"Ready","status":"False","message":"[container runtime is down, `+unhealthy+`]"}`),
			1, "[container runtime is down, " + unhealthy + "]"},
		{"healthz ok", serve(200, "text/plain; charset=utf-8", "ok") + "/healthz", 0, "ok"},
		{"healthz failing", serve(500, "text/plain; charset=utf-8", "PLEG is not healthy: pleg has yet to be successful") + "/healthz",
			1, "PLEG is not healthy: pleg has yet to be successful"},
		{"unreachable", dead, 2, "cannot reach pleg at " + dead + ": connection refused"},
		{"not found", serve(404, "text/plain; charset=utf-8", "404 page not found") + "/readyz", 2, ""},
		{"not a condition", serve(200, "application/json", `[1,2]`) + "/readyz", 2, ""},
		{"odd status", serve(200, "application/json", `{"status":"Maybe","message":"hm"}`) + "/readyz", 2, ""},
		{"html", serve(200, "text/html", "<p>hi</p>") + "/readyz", 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr, code := runTool(t, "check", "--url", c.url, "--timeout", patience.String())
			line := checkLine(t, stdout)
			if code != c.wantCode {
				t.Errorf("exit code %d, want %d (stdout %q, stderr %q)", code, c.wantCode, stdout, stderr)
			}
			if c.wantLine != "" && line != c.wantLine {
				t.Errorf("line = %q, want %q", line, c.wantLine)
			}
			if c.wantCode == 2 && c.wantLine == "" && !strings.HasPrefix(line, "unexpected answer from pleg at ") {
				t.Errorf("line = %q", line)
			}
			if strings.Contains(stderr, line) && line != "" {
				t.Errorf("stderr repeats the line: %q", stderr)
			}
		})
	}
}

// check --forecast reads /readyz's forecast whatever pleg's own status:
// at risk is a problem (1) even on a 200, not at risk is fine (0) even on a
// 503, and no forecast cannot tell (2).
func TestCheckForecast(t *testing.T) {
	serve := func(code int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/readyz"
	}
	atRisk := "the kubelet's PLEG will report not healthy in ~2m50s: ContainerStatus for pod default/db-0 hangs (2m0s request timeout, once per relist), and 1 more pod hangs: default/db-1; relist ~4m0s, threshold 3m0s"
	calm := "the kubelet's PLEG is not at risk: its relist would take ~35ms (threshold 3m0s)"
	ready := `"type":"Ready","status":"True","message":"kubelet is posting ready status"`
	for _, c := range []struct {
		name     string
		url      string
		wantCode int
		wantLine string
	}{
		{"at risk, pleg healthy", serve(200, `{`+ready+`,"forecast":{"atRisk":true,"message":"`+atRisk+`"}}`), 1, atRisk},
		{"not at risk, pleg unhealthy", serve(503, `{"type":"Ready","status":"False","message":"PLEG is not healthy: x","forecast":{"atRisk":false,"message":"`+calm+`"}}`), 0, calm},
		{"no forecast", serve(200, `{`+ready+`}`), 2, ""},
		{"not JSON", serve(200, `nope`), 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr, code := runTool(t, "check", "--forecast", "--url", c.url, "--timeout", patience.String())
			line := checkLine(t, stdout)
			if code != c.wantCode {
				t.Errorf("exit code %d, want %d (stdout %q, stderr %q)", code, c.wantCode, stdout, stderr)
			}
			if c.wantLine != "" && line != c.wantLine {
				t.Errorf("line = %q, want %q", line, c.wantLine)
			}
			if c.wantCode == 2 && !strings.HasPrefix(line, "unexpected answer from pleg at ") {
				t.Errorf("line = %q", line)
			}
		})
	}
	if _, stderr, code := runTool(t, "check", "--forecast", "--runtime"); code != 2 || !strings.Contains(stderr, "exclude each other") {
		t.Errorf("--forecast --runtime: exit code %d, stderr %q", code, stderr)
	}
}

func TestCheckBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"check", "--url", "ftp://x/readyz"},
		{"check", "--timeout", "0s"},
		{"check", "--runtime", "-r", "tcp://1.2.3.4:5"},
		{"pods", "--url", "nonsense"},
		{"diagnose", "--probe-timeout", "0s"},
		{"diagnose", "--pods", "0"},
	} {
		if _, stderr, code := runTool(t, args...); code != 2 {
			t.Errorf("pleg %s: exit code %d, want 2 (stderr %q)", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestToolkitAgainstDaemon runs check and pods against a real `pleg run`.
func TestToolkitAgainstDaemon(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 11, Pods: 3, ContainersPerPod: 2})
	added, err := r.AddPod(sim.PodSpec{Name: "web-0", Namespace: "shop", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	base := startDaemon(t, r.Endpoint())

	poll(t, patience, "pleg check to pass", func() bool {
		_, _, code := runTool(t, "check", "--url", base)
		return code == 0
	})
	stdout, _, code := runTool(t, "check", "--url", base+"/readyz")
	if line := checkLine(t, stdout); code != 0 || line != "kubelet is posting ready status" {
		t.Errorf("check: %q, exit code %d", line, code)
	}
	stdout, _, code = runTool(t, "check", "--forecast", "--url", base+"/readyz")
	if line := checkLine(t, stdout); code != 0 || !strings.HasPrefix(line, "the kubelet's PLEG is not at risk: its relist would take ~") {
		t.Errorf("check --forecast: %q, exit code %d", line, code)
	}

	// The table. Ready says the daemon has listed the pods, not that it
	// has inspected them all yet.
	poll(t, patience, "the 4 pods in /api/v1/pods", func() bool {
		var body httpapi.PodsBody
		_, b := httpGet(t, base+"/api/v1/pods")
		return json.Unmarshal([]byte(b), &body) == nil && len(body.Pods) == 4
	})
	stdout, stderr, code := runTool(t, "pods", "--url", base)
	if code != 0 {
		t.Fatalf("pods: exit code %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("pods printed %d lines, want a header and 4 pods:\n%s", len(lines), stdout)
	}
	header := regexp.MustCompile(`^POD ID +CREATED +STATE +NAME +NAMESPACE +ATTEMPT$`)
	if !header.MatchString(lines[0]) {
		t.Errorf("header = %q", lines[0])
	}
	sandboxID := added.SandboxID()
	// Created when the test started: seconds ago, or on a very slow
	// machine minutes.
	row := regexp.MustCompile(`^` + sandboxID[:13] + ` +(Less than a second ago|[0-9]+ seconds? ago|About a minute ago|[0-9]+ minutes ago) +Ready +web-0 +shop +0$`)
	found := false
	for _, l := range lines[1:] {
		found = found || row.MatchString(l)
		if f := strings.Fields(l); len(f[0]) != 13 {
			t.Errorf("ID %q is not cut to 13 characters", f[0])
		}
	}
	if !found {
		t.Errorf("no line matches %v:\n%s", row, stdout)
	}
	// The columns line up.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l[col:], "Ready") {
			t.Errorf("STATE column misaligned in %q", l)
		}
	}

	stdout, _, _ = runTool(t, "pods", "--url", base+"/api/v1/pods", "--no-trunc")
	if !strings.Contains(stdout, sandboxID+" ") {
		t.Errorf("--no-trunc does not show %s:\n%s", sandboxID, stdout)
	}
	stdout, _, _ = runTool(t, "pods", "--url", base, "-q")
	if ids := strings.Fields(stdout); len(ids) != 4 || !strings.Contains(stdout, sandboxID+"\n") {
		t.Errorf("-q printed %q", stdout)
	}

	// JSON passes through, indented.
	stdout, _, code = runTool(t, "pods", "--url", base, "-o", "json")
	var body httpapi.PodsBody
	if err := json.Unmarshal([]byte(stdout), &body); err != nil || code != 0 {
		t.Fatalf("pods -o json: %v (exit code %d)\n%s", err, code, stdout)
	}
	if len(body.Pods) != 4 || !strings.Contains(stdout, "\n  \"pods\": [") {
		t.Errorf("pods -o json: %d pods, or not indented:\n%s", len(body.Pods), stdout)
	}

	// The runtime directly.
	stdout, stderr, code = runTool(t, "check", "--runtime", "-r", r.Endpoint(), "--timeout", patience.String())
	// The listing's time, to the millisecond: "0s" on a fast machine,
	// seconds on a slow one.
	want := regexp.MustCompile(`^container runtime pleg-sim 0\.1\.0 is ready; listed 4 pods in (0s|[0-9]+ms|[0-9]+(\.[0-9]+)?s)$`)
	if line := checkLine(t, stdout); code != 0 || !want.MatchString(line) {
		t.Errorf("check --runtime: %q (exit code %d, stderr %q)", line, code, stderr)
	}
	r.SetRuntimeReady(false, "ShimDown", "the shim is gone")
	stdout, _, code = runTool(t, "check", "--runtime", "-r", r.Endpoint())
	if line := checkLine(t, stdout); code != 1 ||
		line != "container runtime not ready: RuntimeReady=false reason:ShimDown message:the shim is gone" {
		t.Errorf("check --runtime on a runtime not ready: %q (exit code %d)", line, code)
	}
}

func TestCheckRuntimeDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	stdout, _, code := runTool(t, "check", "--runtime", "-r", "unix://"+sock, "--timeout", "2s")
	line := checkLine(t, stdout)
	if code != 1 || !strings.HasPrefix(line, "container runtime is down: cannot reach the container runtime at unix://"+sock) {
		t.Errorf("check --runtime without a runtime: %q (exit code %d)", line, code)
	}
}

func TestPodsDaemonDown(t *testing.T) {
	url := "http://" + refusedAddr(t) + "/api/v1/pods"
	_, stderr, code := runTool(t, "pods", "--url", url)
	if code != 1 || !strings.Contains(stderr, "cannot reach pleg at "+url) {
		t.Errorf("exit code %d, stderr %q", code, stderr)
	}
}

func TestPodTable(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	pods := []httpapi.Pod{
		{Name: "db-0", Namespace: "default", Error: "inspection of pod \"default/db-0\" exceeded the pod inspection timeout of 10s"},
		{Name: "web-1", Namespace: "shop", Sandboxes: []httpapi.Sandbox{
			{ID: "0123456789abcdef0123", State: "exited", Attempt: 0, CreatedAt: now.Add(-2 * time.Hour).Format(time.RFC3339Nano)},
			{ID: "fedcba9876543210fedc", State: "running", Attempt: 1, CreatedAt: now.Add(-5 * time.Minute).Format(time.RFC3339Nano)},
		}},
	}
	var b bytes.Buffer
	if err := writePodTable(&b, podRows(pods), now, false); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"POD ID          CREATED         STATE      NAME    NAMESPACE   ATTEMPT\n" +
		"fedcba9876543   5 minutes ago   Ready      web-1   shop        1\n" +
		"0123456789abc   2 hours ago     NotReady   web-1   shop        0\n" +
		"-               -               Unknown    db-0    default     0\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestHumanAgo(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{300 * time.Millisecond, "Less than a second ago"},
		{time.Second, "1 second ago"},
		{59 * time.Second, "59 seconds ago"},
		{90 * time.Second, "About a minute ago"},
		{5*time.Minute + 30*time.Second, "5 minutes ago"},
		{65 * time.Minute, "About an hour ago"},
		{3 * time.Hour, "3 hours ago"},
		{50 * time.Hour, "2 days ago"},
		{15 * 24 * time.Hour, "2 weeks ago"},
		{90 * 24 * time.Hour, "3 months ago"},
		{800 * 24 * time.Hour, "2 years ago"},
	} {
		if got := humanAgo(c.d); got != c.want {
			t.Errorf("humanAgo(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

func TestDiagnoseCommand(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 12, Pods: 4, ContainersPerPod: 2})
	// The probe timeout tells a hung call from one that answers: it leaves
	// the calls that answer room on a busy machine.
	stdout, stderr, code := runTool(t, "diagnose", "-r", r.Endpoint(), "--probe-timeout", "10s")
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	last := lines[len(lines)-1]
	if code != 0 || !regexp.MustCompile(`^relist would take ~[0-9.]+(µs|ms|s) \(threshold 3m0s\): healthy$`).MatchString(last) {
		t.Errorf("healthy node: exit code %d, last line %q\n%s%s", code, last, stdout, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr: %q", stderr)
	}

	// Two hung pods (the kubelet v1.37 waits its 2m request timeout for
	// each once a relist: 4m): named, with the call, in bounded time.
	hungUID := r.Pods()[2].UID
	r.SetHung(hungUID, true)
	r.SetHung(r.Pods()[3].UID, true)
	hung, _ := r.Pod(hungUID)
	other, _ := r.Pod(r.Pods()[3].UID)
	start := time.Now()
	stdout, stderr, code = runTool(t, "diagnose", "-r", r.Endpoint(), "--probe-timeout", "2s", "-o", "json")
	// About the probe timeout; the hung call alone never ends.
	if took := time.Since(start); took > patience {
		t.Errorf("diagnose took %v with a hung pod", took)
	}
	if code != 1 || !strings.Contains(stderr, "PLEG would not be healthy") {
		t.Errorf("hung pod: exit code %d, stderr %q", code, stderr)
	}
	if strings.Count(stdout, "\n") != 1 {
		t.Errorf("--output json printed %d lines, want 1", strings.Count(stdout, "\n"))
	}
	var rep diagnose.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	// Both cost the same; the first in namespace/name order is blamed.
	ref, ref2 := hung.Namespace+"/"+hung.Name, other.Namespace+"/"+other.Name
	if ref2 < ref {
		ref, ref2 = ref2, ref
	}
	if rep.Healthy || rep.Cause == nil || rep.Cause.Pod != ref || rep.Cause.Call != "PodSandboxStatus" || !rep.Cause.Hung {
		t.Errorf("report: healthy %v, cause %+v; want PodSandboxStatus of %s", rep.Healthy, rep.Cause, ref)
	}
	if !strings.Contains(rep.Verdict, "because PodSandboxStatus for pod "+ref+" hangs") || !strings.HasSuffix(rep.Verdict, "; 1 more pod hangs: "+ref2) ||
		rep.Endpoint != r.Endpoint() {
		t.Errorf("verdict = %q", rep.Verdict)
	}

	// The kubelet's request timeout decides.
	stdout, _, code = runTool(t, "diagnose", "-r", r.Endpoint(), "--probe-timeout", "2s", "--runtime-request-timeout", "30s")
	if code != 0 || !strings.Contains(stdout, "(threshold 3m0s): healthy, but PodSandboxStatus for pod ") {
		t.Errorf("short request timeout: exit code %d:\n%s", code, stdout)
	}
}

func TestDiagnoseUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	stdout, _, code := runTool(t, "diagnose", "-r", "unix://"+sock, "--probe-timeout", "1s")
	if code != 1 || !strings.Contains(stdout, "relist fails: ListPodSandbox") {
		t.Errorf("exit code %d:\n%s", code, stdout)
	}
}

// TestDeployArgsAreRealFlags: the commands the deploy files run parse with
// the real command line.
func TestDeployArgsAreRealFlags(t *testing.T) {
	parse := func(where string, args []string) {
		t.Helper()
		root := newRootCmd()
		cmd, rest, err := root.Find(args)
		if err != nil || cmd == root {
			t.Errorf("%s: no command in %v: %v", where, args, err)
			return
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: pleg %s: %v", where, strings.Join(args, " "), err)
		}
		if extra := cmd.Flags().Args(); len(extra) > 0 {
			t.Errorf("%s: stray arguments %v", where, extra)
		}
	}

	b, err := os.ReadFile("../../deploy/kubernetes/pleg.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	found := false
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind == "DaemonSet" {
			found = true
			parse("the DaemonSet", doc.Spec.Template.Spec.Containers[0].Args)
		}
	}
	if !found {
		t.Fatal("no DaemonSet in deploy/kubernetes/pleg.yaml")
	}

	b, err = os.ReadFile("../../deploy/npd/pleg-plugin-monitor.json")
	if err != nil {
		t.Fatal(err)
	}
	var npd struct {
		Rules []struct {
			Path string   `json:"path"`
			Args []string `json:"args"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &npd); err != nil {
		t.Fatal(err)
	}
	for _, r := range npd.Rules {
		// /bin/sh -c <script> <pleg binary> <pleg's args> (deploy/deploy_test.go
		// checks the script).
		if r.Path != "/bin/sh" || len(r.Args) < 5 || r.Args[0] != "-c" {
			t.Errorf("the NPD plugin runs %s %q, want /bin/sh -c <script> <pleg binary> check ...", r.Path, r.Args)
			continue
		}
		args := r.Args[3:]
		parse("the NPD plugin", args)
		urls := 0
		for _, a := range args {
			if u, ok := strings.CutPrefix(a, "--url="); ok {
				urls++
				if u != defaultDaemonURL("/readyz") {
					t.Errorf("the NPD plugin checks %q, want the daemon's default %s", a, defaultDaemonURL("/readyz"))
				}
			}
		}
		if urls != 1 {
			t.Errorf("the NPD plugin's args %q: %d --url flags, want 1", args, urls)
		}
	}
}

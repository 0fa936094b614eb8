package main

// Process tests: the pleg binary, built once in TestMain, run as a user
// runs it, against a simulated CRI runtime served from the test process.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/dockerfile"
)

// plegBinary is the path of the binary built by TestMain.
var plegBinary string

// patience is how long a test waits for what should come at once (a line,
// an exit, a state polled for): long enough for a machine however busy
// (go test -race ./... on 2 cores beside a build); a test that passes
// does not wait it out.
const patience = 30 * time.Second

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "pleg-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	plegBinary = filepath.Join(dir, "pleg")
	if err := dockerfile.Build(context.Background(), "../..", plegBinary); err != nil {
		fmt.Fprintln(os.Stderr, "building pleg:", err)
		return 1
	}
	return m.Run()
}

// proc is a running pleg process; its stdout and stderr are collected
// line by line.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  chan string // stdout lines
	done chan struct{}

	mu     sync.Mutex
	errBuf []string
	errCh  chan string // stderr lines, also kept in errBuf
}

func startPleg(t *testing.T, args ...string) *proc {
	t.Helper()
	// pleg run serves the lifecycle API on /run/pleg/pleg.sock by default:
	// tests use a socket of their own.
	if len(args) > 0 && args[0] == "run" && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--lifecycle-socket") }) {
		args = append(args, "--lifecycle-socket="+filepath.Join(t.TempDir(), "pleg.sock"))
	}
	cmd := exec.Command(plegBinary, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, out: make(chan string, 1000), errCh: make(chan string, 1000), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		defer close(p.out)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.out <- sc.Text()
		}
	}()
	go func() {
		defer readers.Done()
		defer close(p.errCh)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.errBuf = append(p.errBuf, sc.Text())
			p.mu.Unlock()
			select {
			case p.errCh <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		readers.Wait()
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("pleg %s stderr:\n%s", strings.Join(args, " "), p.stderr())
		}
	})
	return p
}

// waitListening reads the stderr of `pleg run` until its startup line and
// returns the base URL and the line.
func (p *proc) waitListening() (base, line string) {
	p.t.Helper()
	deadline := time.After(patience)
	for {
		select {
		case l, ok := <-p.errCh:
			if !ok {
				p.t.Fatal("pleg exited before listening")
			}
			if m := listenRE.FindStringSubmatch(l); m != nil {
				return m[1], l
			}
		case <-deadline:
			p.t.Fatalf("no `listening on http://` line within %v", patience)
		}
	}
}

func (p *proc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.errBuf, "\n")
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("pleg did not exit within %v", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop() int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	return p.wait(patience)
}

// nextLine returns the next stdout line.
func (p *proc) nextLine(timeout time.Duration) string {
	p.t.Helper()
	select {
	case l, ok := <-p.out:
		if !ok {
			p.t.Fatalf("stdout closed; pleg exited")
		}
		return l
	case <-time.After(timeout):
		p.t.Fatalf("no output line within %v", timeout)
	}
	return ""
}

// serveSim serves a simulated runtime on a socket in a temporary directory.
func serveSim(t *testing.T, cfg sim.Config) *sim.Runtime {
	t.Helper()
	r := sim.New(cfg)
	// Unix socket paths are short: t.TempDir() can be too long.
	dir, err := os.MkdirTemp("", "pleg-sim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := r.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// jsonEvent is one line of `pleg watch --output json`.
type jsonEvent struct {
	keys          []string
	Time          string `json:"time"`
	Type          string `json:"type"`
	PodUID        string `json:"podUID"`
	PodName       string `json:"podName"`
	PodNamespace  string `json:"podNamespace"`
	ContainerID   string `json:"containerID"`
	ContainerName string `json:"containerName"`
	ExitCode      *int32 `json:"exitCode"`
}

func parseJSONEvent(t *testing.T, line string) jsonEvent {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &raw); err != nil {
		t.Fatalf("stdout line %q is not a JSON object: %v", line, err)
	}
	var e jsonEvent
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		t.Fatal(err)
	}
	e.keys = slices.Sorted(maps.Keys(raw))
	if _, err := time.Parse(time.RFC3339Nano, e.Time); err != nil {
		t.Errorf("time %q: %v", e.Time, err)
	}
	return e
}

func TestWatchJSON(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7})
	p := startPleg(t, "watch", "--output", "json", "--container-runtime-endpoint", r.Endpoint(),
		"--relist-period", "100ms")

	pod, err := r.AddPod(sim.PodSpec{Name: "web-0", Namespace: "shop", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	app, _ := pod.Container("app")
	started := map[string]jsonEvent{}
	for len(started) < 2 {
		e := parseJSONEvent(t, p.nextLine(patience))
		if e.Type != "ContainerStarted" {
			t.Fatalf("event %+v before both starts", e)
		}
		started[e.ContainerID] = e
	}
	startKeys := []string{"containerID", "containerName", "podName", "podNamespace", "podUID", "time", "type"}
	for _, id := range []string{pod.SandboxID(), app.ID} {
		e, ok := started[id]
		if !ok {
			t.Fatalf("no ContainerStarted for %s; got %v", id, started)
		}
		if !reflect.DeepEqual(e.keys, startKeys) {
			t.Errorf("ContainerStarted keys = %v, want %v", e.keys, startKeys)
		}
		if e.PodUID != pod.UID || e.PodName != "web-0" || e.PodNamespace != "shop" {
			t.Errorf("event %+v: wrong pod", e)
		}
	}
	if name := started[app.ID].ContainerName; name != "app" {
		t.Errorf("container name = %q, want app", name)
	}

	if err := r.ExitContainer(app.ID, 3); err != nil {
		t.Fatal(err)
	}
	e := parseJSONEvent(t, p.nextLine(patience))
	dieKeys := []string{"containerID", "containerName", "exitCode", "podName", "podNamespace", "podUID", "time", "type"}
	if e.Type != "ContainerDied" || e.ContainerID != app.ID || e.ExitCode == nil || *e.ExitCode != 3 || !reflect.DeepEqual(e.keys, dieKeys) {
		t.Errorf("event = %+v (keys %v), want ContainerDied of %s with exit code 3 and keys %v", e, e.keys, app.ID, dieKeys)
	}

	if code := p.stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	for l := range p.out { // stdout carries events only
		parseJSONEvent(t, l)
	}
}

func TestWatchUnreachableRuntime(t *testing.T) {
	endpoint := "unix://" + filepath.Join(t.TempDir(), "missing.sock")
	p := startPleg(t, "watch", "-r", endpoint)
	if code := p.wait(patience); code != 1 {
		t.Errorf("exit code = %d, want 1", code)
	}
	stderr := p.stderr()
	want := "pleg: cannot reach the container runtime at " + endpoint + ": "
	if strings.Count(stderr, "\n") != 0 || !strings.HasPrefix(stderr, want) || !strings.HasSuffix(stderr, "no such file or directory") {
		t.Errorf("stderr = %q, want one line %q...no such file or directory", stderr, want)
	}
	if l, ok := <-p.out; ok {
		t.Errorf("stdout = %q, want nothing", l)
	}
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"watch", "--relist-period=-1s"}, `pleg: invalid argument "-1s" for "--relist-period" flag: must be from 10ms to 10m`},
		{[]string{"watch", "--relist-period=1ns"}, `pleg: invalid argument "1ns" for "--relist-period" flag: must be from 10ms to 10m`},
		{[]string{"run", "--max-relist-period=2m"}, `pleg: invalid argument "2m" for "--max-relist-period" flag: must be 0 (off) or from 10ms to 1m`},
		{[]string{"run", "--relist-period=2s", "--max-relist-period=1s"}, `pleg: invalid --max-relist-period "1s": must be at least --relist-period (2s) and below half --relist-threshold (3m0s)`},
		{[]string{"watch", "--relist-threshold=1m", "--max-relist-period=30s"}, `pleg: invalid --max-relist-period "30s": must be at least --relist-period (1s) and below half --relist-threshold (1m0s)`},
		{[]string{"run", "--relist-threshold=0s"}, `pleg: invalid argument "0s" for "--relist-threshold" flag: must be from 1s to 1h`},
		{[]string{"run", "--relist-period=1m", "--relist-threshold=90s"}, `pleg: invalid --relist-threshold "1m30s": must be at least twice --relist-period (1m0s), or a healthy node's relists report PLEG unhealthy`},
		{[]string{"watch", "--runtime-request-timeout=-5s"}, `pleg: invalid argument "-5s" for "--runtime-request-timeout" flag: must be from 100ms to 1h`},
		{[]string{"watch", "--pod-inspection-timeout=-1s"}, `pleg: invalid argument "-1s" for "--pod-inspection-timeout" flag: must be 0 (no limit) or from 10ms to 1h`},
		{[]string{"watch", "--max-parallel-inspections=0"}, `pleg: invalid argument "0" for "--max-parallel-inspections" flag: must be from 1 to 256`},
		{[]string{"run", "--max-parallel-inspections=1099511627776"}, `pleg: invalid argument "1099511627776" for "--max-parallel-inspections" flag: must be from 1 to 256`},
		{[]string{"run", "--max-connections=0"}, `pleg: invalid argument "0" for "--max-connections" flag: must be from 8 to 10000`},
		{[]string{"run", "--allowed-hosts=node-a,evil.example:80"}, `pleg: invalid --allowed-hosts: "evil.example:80" has a port: give the host alone (any port is accepted)`},
		{[]string{"run", "-v=-1"}, `pleg: invalid argument "-1" for "-v, --v" flag: must be from 0 to 10`},
		{[]string{"simulate", "--listen", "/tmp/x.sock", "--pods", "1000000000000"}, `pleg: invalid argument "1000000000000" for "--pods" flag: must be from 0 to 100000`},
		{[]string{"watch", "--output", "yaml"}, `pleg: invalid argument "yaml" for "-o, --output" flag: must be one of text, json`},
		{[]string{"run", "--events", "maybe"}, `pleg: invalid argument "maybe" for "--events" flag: must be one of auto, on, off`},
		{[]string{"run", "--list-streaming", "sometimes"}, `pleg: invalid argument "sometimes" for "--list-streaming" flag: must be one of auto, on, off`},
		{[]string{"watch", "--relist-period", "soon"}, `pleg: invalid argument "soon" for "--relist-period" flag: not a duration (e.g. 500ms, 2m): must be from 10ms to 10m`},
		{[]string{"watch", "-r", "tcp://127.0.0.1:1234"}, `pleg: invalid --container-runtime-endpoint "tcp://127.0.0.1:1234": unsupported scheme "tcp", only unix sockets are supported; want unix:///absolute/path/to/socket`},
		{[]string{"run", "--runtime-endpoint", "run/x.sock"}, `pleg: invalid --container-runtime-endpoint "run/x.sock": socket path "run/x.sock" is not absolute; want unix:///absolute/path/to/socket`},
		{[]string{"run", "--listen-address", "10265"}, `pleg: invalid --listen-address "10265": address 10265: missing port in address`},
		{[]string{"run", "--listen-address", "127.0.0.1:http"}, `pleg: invalid --listen-address "127.0.0.1:http": port must be a number from 0 to 65535`},
		{[]string{"run", "--metrics-address", "0.0.0.0"}, `pleg: invalid --metrics-address "0.0.0.0": address 0.0.0.0: missing port in address`},
		{[]string{"watch", "extra"}, `pleg: unknown command "extra" for "pleg watch"`},
		{[]string{"run", "--lifecycle-tcp-address", "0.0.0.0:10267"}, `pleg: invalid --lifecycle-tcp-address "0.0.0.0:10267": must be on loopback (127.0.0.1, ::1 or localhost): TCP has no access control`},
		{[]string{"run", "--lifecycle-tcp-address", "127.0.0.1:0", "--lifecycle-allowed-uids", "0"}, `pleg: --lifecycle-tcp-address cannot be combined with --lifecycle-allowed-uids/gids: TCP peers carry no credentials to check`},
		{[]string{"run", "--lifecycle-socket-mode", "0999"}, `pleg: invalid --lifecycle-socket-mode "0999": want octal permissions such as 0660`},
		{[]string{"run", "--lifecycle-socket-group", "no-such-group-here"}, `pleg: invalid --lifecycle-socket-group "no-such-group-here": group: unknown group no-such-group-here`},
		{[]string{"run", "--journal-size", "0"}, `pleg: invalid argument "0" for "--journal-size" flag: must be from 1 to 1048576`},
		{[]string{"run", "--lifecycle-stall-timeout", "10ms"}, `pleg: invalid argument "10ms" for "--lifecycle-stall-timeout" flag: must be from 1s to 1h`},
		{[]string{"run", "--cri-socket-mode", "0999"}, `pleg: invalid --cri-socket-mode "0999": want octal permissions such as 0660`},
		{[]string{"run", "--cri-pod-socket-mode", "rw"}, `pleg: invalid --cri-pod-socket-mode "rw": want octal permissions such as 0660`},
		{[]string{"run", "--cri-socket-group", "no-such-group-here"}, `pleg: invalid --cri-socket-group "no-such-group-here": group: unknown group no-such-group-here`},
		{[]string{"run", "--cri-socket", "/tmp/x.sock", "--cri-pod-socket", "/tmp/x.sock"}, `pleg: --cri-socket and --cri-pod-socket are the same path "/tmp/x.sock": give each its own`},
		{[]string{"run", "--cri-max-in-flight", "0"}, `pleg: invalid argument "0" for "--cri-max-in-flight" flag: must be from 1 to 256`},
		{[]string{"run", "--cri-pass-through-rate", "0"}, `pleg: invalid argument "0" for "--cri-pass-through-rate" flag: must be a number from 0.1 to 10000`},
		{[]string{"run", "--cri-pass-through-burst", "1099511627776"}, `pleg: invalid argument "1099511627776" for "--cri-pass-through-burst" flag: must be from 1 to 100000`},
		{[]string{"run", "--cri-max-event-streams", "-1"}, `pleg: invalid argument "-1" for "--cri-max-event-streams" flag: must be from 1 to 65536`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			p := startPleg(t, tc.args...)
			if code := p.wait(patience); code != 2 {
				t.Errorf("exit code = %d, want 2", code)
			}
			if got := p.stderr(); got != tc.want {
				t.Errorf("stderr = %q\nwant     %q", got, tc.want)
			}
		})
	}
}

var listenRE = regexp.MustCompile(`"listening on (http://[^"]+)"`)

// httpGet returns the status code and body of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: patience}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// poll calls f every 50ms until it returns true or timeout passes.
func poll(t *testing.T, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRun(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7})
	pod, err := r.AddPod(sim.PodSpec{Name: "api-0", Namespace: "prod", Containers: []string{"server", "sidecar"}})
	if err != nil {
		t.Fatal(err)
	}
	server, _ := pod.Container("server")

	p := startPleg(t, "run", "-v=2", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0",
		"--relist-period", "100ms", "--relist-threshold", "2s", "--node-name", "node-a")
	base, line := p.waitListening()
	if !strings.Contains(line, `endpoint="`+r.Endpoint()+`"`) {
		t.Errorf("startup line %q does not name the endpoint", line)
	}

	poll(t, patience, "/healthz 200", func() bool {
		code, body := httpGet(t, base+"/healthz")
		return code == 200 && body == "ok"
	})
	poll(t, patience, "/readyz True", func() bool {
		code, body := httpGet(t, base+"/readyz")
		var c struct{ Status, Reason string }
		_ = json.Unmarshal([]byte(body), &c)
		return code == 200 && c.Status == "True" && c.Reason == "KubeletReady"
	})

	code, body := httpGet(t, base+"/metrics")
	for _, want := range []string{
		"kubelet_pleg_relist_duration_seconds_bucket",
		"kubelet_running_pods 1",
		`kubelet_runtime_operations_total{operation_type="list_podsandbox"}`,
		`kubelet_node_name{node="node-a"} 1`,
		"go_goroutines",
		"process_start_time_seconds",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}

	// The pod status cache.
	var pods struct {
		Pods []struct {
			PodUID, PodName, PodNamespace string
			Sandboxes                     []struct{ ID, State string }
			Containers                    []struct{ ID, Name, State string }
		}
	}
	poll(t, patience, "the pod in /api/v1/pods", func() bool {
		_, body := httpGet(t, base+"/api/v1/pods")
		_ = json.Unmarshal([]byte(body), &pods)
		return len(pods.Pods) == 1
	})
	got := pods.Pods[0]
	if got.PodUID != pod.UID || got.PodName != "api-0" || got.PodNamespace != "prod" ||
		len(got.Sandboxes) != 1 || got.Sandboxes[0].ID != pod.SandboxID() || got.Sandboxes[0].State != "running" ||
		len(got.Containers) != 2 || got.Containers[0].Name != "server" || got.Containers[0].ID != server.ID ||
		got.Containers[0].State != "running" || got.Containers[1].Name != "sidecar" {
		t.Errorf("/api/v1/pods = %+v", pods)
	}

	// The event stream: the snapshot (the pod, once a relist that listed
	// it has ended without a failure: the cache above is set before the
	// pod's events are delivered), its end, then the exit of the server
	// container.
	poll(t, patience, "a relist of the pod to end", func() bool {
		_, body := httpGet(t, base+"/api/v1/relists")
		var relists struct {
			Relists []struct {
				Pods, Failed int
				Error        string
			}
		}
		_ = json.Unmarshal([]byte(body), &relists)
		for _, r := range relists.Relists {
			if r.Pods == 1 && r.Failed == 0 && r.Error == "" {
				return true
			}
		}
		return false
	})
	resp, err := http.Get(base + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sse := bufio.NewReader(resp.Body)
	readMessage := func() (event, data string) {
		t.Helper()
		for {
			line, err := sse.ReadString('\n')
			if err != nil {
				t.Fatalf("event stream: %v", err)
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "" && event != "":
				return event, data
			case strings.HasPrefix(line, "event: "):
				event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				data = line[len("data: "):]
			}
		}
	}
	ev, data := readMessage()
	if ev != "snapshot" || !strings.Contains(data, `"uid":"`+pod.UID+`"`) {
		t.Fatalf("first message = %s %s, want the pod's snapshot", ev, data)
	}
	if ev, data = readMessage(); ev != "snapshot-end" {
		t.Fatalf("second message = %s %s, want snapshot-end", ev, data)
	}
	if err := r.ExitContainer(server.ID, 3); err != nil {
		t.Fatal(err)
	}
	for ev, data = readMessage(); ev != "event"; ev, data = readMessage() {
	}
	var msg lifecyclev1.WatchResponse
	if err := protojson.Unmarshal([]byte(data), &msg); err != nil {
		t.Fatal(err)
	}
	if trs := msg.GetEvent().GetTransitions(); len(trs) != 1 || trs[0].GetType() != lifecyclev1.EventType_CONTAINER_DIED ||
		trs[0].GetContainerId() != server.ID || trs[0].GetExitCode() != 3 {
		t.Errorf("message = %s %s, want ContainerDied of the server with exit code 3", ev, data)
	}
	// Logged before the event is delivered, but read from stderr by
	// another goroutine: polled for.
	poll(t, patience, "the kubelet's event line (-v=2)", func() bool {
		return strings.Contains(p.stderr(), `"SyncLoop (PLEG): event for pod" pod="prod/api-0"`)
	})

	// The runtime goes away: health fails after the threshold, and pleg
	// keeps running.
	r.GoAway()
	poll(t, patience, "/healthz 500", func() bool {
		code, body := httpGet(t, base+"/healthz")
		if code != 500 {
			return false
		}
		if !strings.HasPrefix(body, "PLEG is not healthy: pleg was last seen active ") || !strings.HasSuffix(body, "; threshold is 2s") {
			t.Errorf("unhealthy body = %q", body)
		}
		return true
	})
	if code, body := httpGet(t, base+"/readyz"); code != 503 || !strings.Contains(body, "PLEG is not healthy: pleg was last seen active") {
		t.Errorf("/readyz while the runtime is away = %d %s", code, body)
	}
	if p.exited() {
		t.Fatal("pleg exited while the runtime was away")
	}

	// It comes back: healthy again.
	if err := r.ComeBack(); err != nil {
		t.Fatal(err)
	}
	poll(t, patience, "/healthz 200 after the runtime came back", func() bool {
		code, body := httpGet(t, base+"/healthz")
		return code == 200 && body == "ok"
	})

	// SIGTERM with the event stream still open: a clean, prompt exit. A
	// shutdown that waited for the stream would end only after the HTTP
	// shutdown timeout, counted from after the signal: the most generous
	// bound that still tells the two apart.
	start := time.Now()
	if code := p.stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	if d := time.Since(start); d >= httpapi.DefaultShutdownTimeout {
		t.Errorf("shutdown took %v, as long as the HTTP shutdown timeout (%v): it waited for the event stream", d, httpapi.DefaultShutdownTimeout)
	} else {
		t.Logf("shutdown took %v", d)
	}
}

func TestRunWaitsForRuntime(t *testing.T) {
	dir, err := os.MkdirTemp("", "pleg-late-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cri.sock")

	p := startPleg(t, "run", "-r", "unix://"+sock, "--listen-address", "127.0.0.1:0", "--relist-period", "100ms")
	base, _ := p.waitListening()
	if code, body := httpGet(t, base+"/healthz"); code != 500 || body != "PLEG is not healthy: pleg has yet to be successful" {
		t.Errorf("/healthz without a runtime = %d %q", code, body)
	}
	if code, body := httpGet(t, base+"/readyz"); code != 503 || !strings.Contains(body, `"reason": "KubeletNotReady"`) {
		t.Errorf("/readyz without a runtime = %d %s", code, body)
	}

	// The runtime appears later: pleg picks it up without a restart.
	r := sim.New(sim.Config{})
	if err := r.Serve(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	poll(t, patience, "/healthz 200 once the runtime is up", func() bool {
		code, _ := httpGet(t, base+"/healthz")
		return code == 200
	})
	if code := p.stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
}

var publicRE = regexp.MustCompile(`"serving /healthz, /readyz and /metrics on (http://[^"]+)"`)

// --metrics-address serves what probes and Prometheus need and no pod data;
// the full API stays on --listen-address.
func TestRunMetricsAddress(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7, Pods: 2})
	p := startPleg(t, "run", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0",
		"--metrics-address", "127.0.0.1:0", "--relist-period", "100ms")
	base, _ := p.waitListening()
	var public string
	poll(t, patience, "the --metrics-address line", func() bool {
		for _, l := range strings.Split(p.stderr(), "\n") {
			if m := publicRE.FindStringSubmatch(l); m != nil {
				public = m[1]
				return true
			}
		}
		return false
	})
	poll(t, patience, "/healthz 200 on --metrics-address", func() bool {
		code, body := httpGet(t, public+"/healthz")
		return code == 200 && body == "ok"
	})
	if code, body := httpGet(t, public+"/metrics"); code != 200 || !strings.Contains(body, "kubelet_pleg_relist_duration_seconds_bucket") {
		t.Errorf("GET /metrics on --metrics-address = %d", code)
	}
	for _, path := range []string{"/api/v1/pods", "/api/v1/events", "/api/v1/relists", "/"} {
		if code, _ := httpGet(t, public+path); code != 404 {
			t.Errorf("GET %s on --metrics-address = %d, want 404", path, code)
		}
	}
	if code, _ := httpGet(t, base+"/api/v1/pods"); code != 200 {
		t.Errorf("GET /api/v1/pods on --listen-address = %d, want 200", code)
	}
	if strings.Contains(p.stderr(), "WARNING") {
		t.Errorf("a loopback --listen-address was warned about:\n%s", p.stderr())
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

package stream

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/dockerfile"
)

// patience bounds every wait for something pleg or a client must do.
const patience = 30 * time.Second

var plegBinary string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "pleg-stream-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	plegBinary = filepath.Join(dir, "pleg")
	if err := dockerfile.Build(context.Background(), repoRoot(), plegBinary); err != nil {
		fmt.Fprintln(os.Stderr, "building pleg:", err)
		return 1
	}
	return m.Run()
}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// shortDir is a temporary directory with a short path (unix socket paths
// are limited to 108 bytes; t.TempDir() can be longer).
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pleg-stream-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startSim serves a simulated runtime on a socket of its own.
func startSim(t testing.TB, cfg sim.Config) *sim.Runtime {
	t.Helper()
	r := sim.New(cfg)
	if err := r.Serve(filepath.Join(shortDir(t), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// plegProc is a running `pleg run`.
type plegProc struct {
	t      testing.TB
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	socket string // the lifecycle socket
	done   chan struct{}

	mu     sync.Mutex
	stderr []string
}

var listenRE = regexp.MustCompile(`"listening on (http://[^"]+)"`)

// startPleg runs `pleg run` against endpoint with its lifecycle API on
// socket (a new one when empty), relisting every 100 ms, plus args, and
// waits until both its HTTP API and its lifecycle API answer. A cleanup
// stops it (SIGTERM) and fails the test if it does not exit 0.
func startPleg(t testing.TB, endpoint, socket string, args ...string) *plegProc {
	t.Helper()
	if socket == "" {
		socket = filepath.Join(shortDir(t), "pleg.sock")
	}
	all := append([]string{"run", "-r", endpoint, "--listen-address", "127.0.0.1:0",
		"--lifecycle-socket", socket, "--relist-period", "100ms"}, args...)
	cmd := exec.Command(plegBinary, all...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &plegProc{t: t, cmd: cmd, socket: socket, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			p.mu.Lock()
			p.stderr = append(p.stderr, l)
			p.mu.Unlock()
			if m := listenRE.FindStringSubmatch(l); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			if code := p.stop(); code != 0 {
				t.Errorf("pleg exited with %d on SIGTERM", code)
			}
		}
		if t.Failed() {
			t.Logf("pleg %s stderr (end):\n%s", strings.Join(all, " "), p.stderrTail(40))
		}
	})
	select {
	case p.base = <-listening:
	case <-p.done:
		t.Fatalf("pleg exited before listening:\n%s", p.stderrTail(40))
	case <-time.After(patience):
		t.Fatalf("pleg: no `listening on` line within %v:\n%s", patience, p.stderrTail(40))
	}
	p.waitLifecycle()
	return p
}

// waitLifecycle waits until the lifecycle socket answers gRPC health.
func (p *plegProc) waitLifecycle() {
	p.t.Helper()
	conn := dialLifecycle(p.t, p.socket)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		p.t.Fatalf("the lifecycle API on %s does not answer: %v\n%s", p.socket, err, p.stderrTail(40))
	}
}

func (p *plegProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *plegProc) stop() int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(patience):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("pleg did not exit within %v of SIGTERM", patience)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *plegProc) stderrTail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.stderr
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// dialLifecycle connects to a lifecycle socket; the connection is closed
// by a cleanup.
func dialLifecycle(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// cachePods is pleg's own pod API (/api/v1/pods), reduced to what a
// lifecycle client's view is compared on.
func cachePods(t testing.TB, base string) map[string]podView {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body httpapi.PodsBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/api/v1/pods: %v", err)
	}
	out := map[string]podView{}
	for _, p := range body.Pods {
		v := podView{Name: p.Namespace + "/" + p.Name, Items: map[string]string{}}
		for _, s := range p.Sandboxes {
			v.Items[s.ID] = "sandbox " + strings.ToLower(s.State)
		}
		for _, c := range p.Containers {
			v.Items[c.ID] = itemView(c.Name, strings.ToLower(c.State), c.ExitCode)
		}
		out[p.UID] = v
	}
	return out
}

// podView is a pod as the proofs compare it: its name and, per container
// or sandbox ID, its name, state and exit code.
type podView struct {
	Name  string
	Items map[string]string
}

func itemView(name, state string, exit *int32) string {
	s := name + " " + state
	if exit != nil && state == "exited" {
		s += fmt.Sprintf(" exit=%d", *exit)
	}
	return s
}

// protoState is a lifecycle State's name as the pod API spells it.
func protoState(s string) string {
	return strings.ToLower(strings.TrimPrefix(s, "STATE_"))
}

// viewOfPod reduces a lifecycle Pod message.
func viewOfPod(p *lifecyclev1.Pod) podView {
	v := podView{Name: p.GetNamespace() + "/" + p.GetName(), Items: map[string]string{}}
	for _, s := range p.GetSandboxes() {
		v.Items[s.GetId()] = "sandbox " + protoState(s.GetState().String())
	}
	for _, c := range p.GetContainers() {
		var exit *int32
		if c.ExitCode != nil {
			e := c.GetExitCode()
			exit = &e
		}
		v.Items[c.GetId()] = itemView(c.GetName(), protoState(c.GetState().String()), exit)
	}
	return v
}

// poll waits until cond holds, checking every 20 ms, at most patience.
func poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// simPods is the simulated runtime's state as pleg must end up showing
// it (pods that still have a sandbox or a container).
func simPods(r *sim.Runtime) map[string]podView {
	out := map[string]podView{}
	for _, p := range r.Pods() {
		if len(p.Sandboxes) == 0 && len(p.Containers) == 0 {
			continue
		}
		v := podView{Name: p.Namespace + "/" + p.Name, Items: map[string]string{}}
		for _, s := range p.Sandboxes {
			st := "exited"
			if s.State == runtimeapi.PodSandboxState_SANDBOX_READY {
				st = "running"
			}
			v.Items[s.ID] = "sandbox " + st
		}
		for _, c := range p.Containers {
			st := strings.ToLower(strings.TrimPrefix(c.State.String(), "CONTAINER_"))
			var exit *int32
			if st == "exited" {
				e := c.ExitCode
				exit = &e
			}
			v.Items[c.ID] = itemView(c.Name, st, exit)
		}
		out[p.UID] = v
	}
	return out
}

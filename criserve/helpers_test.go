package criserve

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/leakcheck"
	"github.com/podlifecycle/pleg/internal/unixgrpc"
	"github.com/podlifecycle/pleg/journal"
)

// patience bounds how long a test waits for what should come soon; a test
// that passes does not wait it out.
const patience = 30 * time.Second

func TestMain(m *testing.M) {
	leakcheck.Main(m, patience, "pleg/criserve.", "google.golang.org/grpc")
}

// waitFor polls cond until it holds, failing the test after patience with
// cond's last explanation.
func waitFor(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, patience, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rig is a simulated runtime, a generator relisting it, and pleg's CRI
// endpoint of the generator's journal, with a CRI client of each.
type rig struct {
	sim    *sim.Runtime
	client *cri.Client
	gen    *pleg.Generator
	ready  *pleg.Readiness
	srv    *Server
	sock   string
	direct runtimeapi.RuntimeServiceClient // straight to the simulator
	pleg   runtimeapi.RuntimeServiceClient // through pleg
	conn   *grpc.ClientConn                // to pleg
	images runtimeapi.ImageServiceClient   // through pleg

	stopGen   func()
	stopServe func()
}

// newRig starts everything; cfg's Journal, Runtime, Images and Conditions
// are set here. pleg relists, and checks the runtime's status, every 20 ms.
func newRig(t testing.TB, sc sim.Config, cfg Config) *rig {
	t.Helper()
	return newRigPeriod(t, sc, cfg, 20*time.Millisecond)
}

// newRigPeriod is newRig with pleg relisting, and checking the runtime's
// status, every period.
func newRigPeriod(t testing.TB, sc sim.Config, cfg Config, period time.Duration) *rig {
	t.Helper()
	r := &rig{sim: sim.New(sc)}
	dir := t.TempDir()
	if err := r.sim.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.sim.Stop)
	var copts []cri.Option
	if cfg.Verbose != nil {
		// As pleg run does with a CRI endpoint: the relist's status
		// calls are verbose and kept.
		copts = append(copts, cri.WithVerboseStatuses(cfg.Verbose))
	}
	client, err := cri.Dial(r.sim.Endpoint(), copts...)
	if err != nil {
		t.Fatal(err)
	}
	r.client = client
	t.Cleanup(func() { client.Close() })
	r.gen, err = pleg.New(pleg.Options{Runtime: client, RelistPeriod: period})
	if err != nil {
		t.Fatal(err)
	}
	r.ready = pleg.NewReadiness(r.gen, pleg.ReadinessOptions{Runtime: client, Interval: period})
	rctx, rcancel := context.WithCancel(context.Background())
	r.gen.Start()
	readyDone := make(chan struct{})
	go func() {
		defer close(readyDone)
		r.ready.Run(rctx)
	}()
	stopped := false
	r.stopGen = func() {
		if stopped {
			return
		}
		stopped = true
		rcancel()
		<-readyDone
		r.gen.Stop()
	}
	t.Cleanup(r.stopGen)

	cfg.Journal, cfg.Runtime, cfg.Images, cfg.Conditions = r.gen.Journal(), client.RuntimeService(), client.ImageService(), r.ready
	r.srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.sock = filepath.Join(dir, "pleg-cri.sock")
	r.stopServe = serve(t, r.srv, r.sock)

	direct := dialCRI(t, r.sim.Endpoint())
	r.direct = runtimeapi.NewRuntimeServiceClient(direct)
	r.conn = dialCRI(t, "unix://"+r.sock)
	r.pleg = runtimeapi.NewRuntimeServiceClient(r.conn)
	r.images = runtimeapi.NewImageServiceClient(r.conn)
	return r
}

// serve serves srv on a unix socket at sock until the returned function
// (also run when the test ends) stops it.
func serve(t testing.TB, srv *Server, sock string) func() {
	t.Helper()
	ln, err := unixgrpc.Listen(sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, ln) }()
	done := false
	stop := func() {
		if done {
			return
		}
		done = true
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(patience):
			t.Error("Serve did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

func dialCRI(t testing.TB, target string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// synced waits until pleg's listing has what the simulator's has (the
// same IDs and states).
func (r *rig) synced(t testing.TB) {
	t.Helper()
	waitFor(t, "pleg's listing to match the simulator's", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		want, err := r.direct.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return false, err.Error()
		}
		got, err := r.pleg.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return false, err.Error()
		}
		wsb, err := r.direct.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			return false, err.Error()
		}
		gsb, err := r.pleg.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			return false, err.Error()
		}
		a, b := states(want.GetContainers(), wsb.GetItems()), states(got.GetContainers(), gsb.GetItems())
		return a == b, fmt.Sprintf("runtime %s, pleg %s", a, b)
	})
}

// states summarizes listings: every item's ID and state, in ID order.
func states(cs []*runtimeapi.Container, sbs []*runtimeapi.PodSandbox) string {
	cs = append([]*runtimeapi.Container(nil), cs...)
	sbs = append([]*runtimeapi.PodSandbox(nil), sbs...)
	sortByID(cs, (*runtimeapi.Container).GetId)
	sortByID(sbs, (*runtimeapi.PodSandbox).GetId)
	s := ""
	for _, c := range cs {
		s += c.GetId()[:8] + "=" + c.GetState().String() + " "
	}
	for _, sb := range sbs {
		s += sb.GetId()[:8] + "=" + sb.GetState().String() + " "
	}
	return s
}

// writeFile writes a file, creating its directory.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// bareJournal serves a journal the test appends to by hand.
func bareServer(t *testing.T, cfg Config) (*Server, *journal.Journal, runtimeapi.RuntimeServiceClient) {
	t.Helper()
	j := journal.New(journal.Options{Epoch: "e1"})
	cfg.Journal = j
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "cri.sock")
	serve(t, srv, sock)
	return srv, j, runtimeapi.NewRuntimeServiceClient(dialCRI(t, "unix://"+sock))
}

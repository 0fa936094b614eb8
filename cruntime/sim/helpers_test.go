package sim

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/podlifecycle/pleg/internal/leakcheck"
)

// patience is how long a test waits for what should come at once: long
// enough for a machine however busy; a test that passes does not wait it
// out.
const patience = 30 * time.Second

// TestMain fails the run when goroutines of this package outlive the tests.
func TestMain(m *testing.M) {
	leakcheck.Main(m, patience, "pleg/cruntime/sim.(*Runtime)", "pleg/cruntime/sim.(*service)")
}

var epoch = time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC)

func fakeClock() *clocktesting.FakeClock { return clocktesting.NewFakeClock(epoch) }

// serve starts r on a socket in a temporary directory and returns a CRI
// client for it. Both are closed when the test ends.
func serve(t *testing.T, r *Runtime) runtimeapi.RuntimeServiceClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	if err := r.Serve(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return dial(t, r.Endpoint())
}

func dial(t *testing.T, endpoint string) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 50 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

func newSim(t *testing.T, cfg Config) (*Runtime, runtimeapi.RuntimeServiceClient) {
	t.Helper()
	r := New(cfg)
	return r, serve(t, r)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, want ...codes.Code) {
	t.Helper()
	got := status.Code(err)
	for _, w := range want {
		if got == w {
			return
		}
	}
	t.Fatalf("error %v: code %v, want one of %v", err, got, want)
}

func mustAdd(t *testing.T, r *Runtime, spec PodSpec) PodInfo {
	t.Helper()
	p, err := r.AddPod(spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

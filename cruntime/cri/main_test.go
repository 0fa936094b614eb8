package cri

import (
	"testing"
	"time"

	"github.com/podlifecycle/pleg/internal/leakcheck"
)

// TestMain fails the run when gRPC or client goroutines outlive the tests:
// every test must stop its server and close its client.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 30*time.Second, "google.golang.org/grpc", "pleg/cruntime/cri.", "pleg/cruntime/cri/directlist.")
}

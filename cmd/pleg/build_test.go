package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/dockerfile"
)

// The binary deploy/Dockerfile builds leaves out gRPC's request tracing
// and the template engine it brings (golang.org/x/net/trace registers
// /debug/requests pages built with html/template): 5 MB of binary and 2.3
// MiB of resident pages that pleg never uses. The test reads the
// Dockerfile's build flags and lists what that build links, so a new
// import that brings either back fails here, not in a memory benchmark.
func TestShippedBuildLeavesOutTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	r, err := dockerfile.Parse("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, f := range r.GoFlags {
		if strings.HasPrefix(f, "-tags=") {
			flags = append(flags, f)
		}
	}
	if len(flags) == 0 {
		t.Fatal("deploy/Dockerfile's go build sets no build tags: it links gRPC's request tracing")
	}
	out, err := exec.Command("go", append(append([]string{"list", "-deps"}, flags...), ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %v: %v\n%s", flags, err, out)
	}
	deps := strings.Fields(string(out))
	for _, unwanted := range []string{"golang.org/x/net/trace", "html/template"} {
		if slices.Contains(deps, unwanted) {
			t.Errorf("pleg built with %v links %s", flags, unwanted)
		}
	}
	if !slices.Contains(deps, "google.golang.org/grpc") {
		t.Fatalf("go list -deps %v does not list gRPC: %s", flags, out)
	}
}

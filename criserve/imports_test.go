package criserve_test

import (
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/testkit"
)

// The CRI endpoint shares the unix socket's helpers with the lifecycle
// API through internal/unixgrpc: it does not depend on the lifecycle
// server.
func TestImportsNoLifecycleServer(t *testing.T) {
	imports, err := testkit.Imports(".")
	if err != nil {
		t.Fatal(err)
	}
	for f, paths := range imports {
		for _, p := range paths {
			if strings.HasPrefix(p, "github.com/podlifecycle/pleg/api/lifecycle/server") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}

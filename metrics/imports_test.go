package metrics_test

import (
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/testkit"
)

// metrics is a leaf for the runtime's packages: the runtime client reports
// to it, so it imports none of them (the operation names are internal/op's).
func TestImportsNoRuntime(t *testing.T) {
	imports, err := testkit.Imports(".")
	if err != nil {
		t.Fatal(err)
	}
	for f, paths := range imports {
		for _, p := range paths {
			if p == "github.com/podlifecycle/pleg/cruntime" || strings.HasPrefix(p, "github.com/podlifecycle/pleg/cruntime/") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}

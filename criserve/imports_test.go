package criserve

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The CRI endpoint shares the unix socket's helpers with the lifecycle
// API through internal/unixgrpc: it does not depend on the lifecycle
// server.
func TestImportsNoLifecycleServer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/podlifecycle/pleg/api/lifecycle/server") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}

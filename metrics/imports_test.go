package metrics

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// metrics is a leaf for the runtime's packages: the runtime client reports
// to it, so it imports none of them (the operation names are internal/op's).
func TestImportsNoRuntime(t *testing.T) {
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
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "github.com/podlifecycle/pleg/cruntime" || strings.HasPrefix(p, "github.com/podlifecycle/pleg/cruntime/") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}

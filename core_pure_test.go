package pleg

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// The core is pure: its files import nothing that reads a clock, locks,
// does I/O or logs, start no goroutine, and call no time.Now or
// time.Since. What it needs of the world comes in as inputs.
func TestCoreIsPure(t *testing.T) {
	files, err := filepath.Glob("core*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string]bool{"context": true, "sync": true, "sync/atomic": true, "os": true, "net": true,
		"log": true, "log/slog": true, "github.com/go-logr/logr": true, "k8s.io/utils/clock": true,
		"github.com/podlifecycle/pleg/metrics": true, "github.com/podlifecycle/pleg/podcache": true, "math/rand/v2": true}
	n := 0
	for _, f := range files {
		if filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" {
			continue
		}
		n++
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[path] {
				t.Errorf("%s imports %s", f, path)
			}
		}
		ast.Inspect(file, func(node ast.Node) bool {
			switch x := node.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement at %v", f, fset.Position(x.Pos()))
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "time" && (x.Sel.Name == "Now" || x.Sel.Name == "Since" || x.Sel.Name == "Sleep" || x.Sel.Name == "After" || x.Sel.Name == "NewTimer") {
					t.Errorf("%s: time.%s at %v", f, x.Sel.Name, fset.Position(x.Pos()))
				}
			case *ast.ChanType:
				t.Errorf("%s: a channel at %v", f, fset.Position(x.Pos()))
			}
			return true
		})
	}
	if n < 6 {
		t.Fatalf("only %d core files checked", n)
	}
}

// The core's invariants catch a broken state: each corruption below is
// reported (the check can fail).
func TestInvariantsCatchBreaks(t *testing.T) {
	for name, corrupt := range map[string]func(c *core){
		"active count":    func(c *core) { c.active++ },
		"abandoned count": func(c *core) { c.abandoned++ },
		"hint again without a call": func(c *core) {
			c.record("x").hint.again = true
		},
		"queued hint not in the queue": func(c *core) { c.record("x").hint.queued = true },
		"queue entry not queued": func(c *core) {
			c.record("x")
			c.hints.order = append(c.hints.order, "x")
		},
		"call not held by its record": func(c *core) {
			c.record("x")
			c.calls[99] = &call{id: 99, kind: callListPod, uid: "x"}
			c.active++
		},
	} {
		c := newCore(coreConfig{slots: 2, budget: hintBudget{queue: 4}, check: true})
		if err := c.invariants(); err != nil {
			t.Fatalf("%s: a new core breaks an invariant: %v", name, err)
		}
		corrupt(c)
		if err := c.invariants(); err == nil {
			t.Errorf("%s: not caught", name)
		}
	}
}

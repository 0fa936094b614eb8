package pleg

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// impureImports are the packages the core may not import: they read a
// clock, lock, do I/O, log or draw random numbers. A path ending in "/..."
// forbids the packages under it too.
var impureImports = []string{"context", "sync/...", "os/...", "net/...", "syscall", "io/fs",
	"log/...", "github.com/go-logr/logr", "k8s.io/utils/clock/...",
	"math/rand/...", "crypto/rand", "runtime",
	"github.com/podlifecycle/pleg/metrics", "github.com/podlifecycle/pleg/podcache"}

// impureTime are package time's functions that read the clock or wait.
var impureTime = map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true,
	"After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true}

func impureImport(p string) bool {
	for _, f := range impureImports {
		if p == f || strings.HasSuffix(f, "/...") && (p == strings.TrimSuffix(f, "/...") || strings.HasPrefix(p, strings.TrimSuffix(f, "..."))) {
			return true
		}
	}
	return false
}

// importName is the name a file refers to an import by: its own, or the
// package's (the last element of its path, a major version skipped).
func importName(imp *ast.ImportSpec, p string) string {
	if imp.Name != nil {
		return imp.Name.Name
	}
	base := path.Base(p)
	if len(base) > 1 && base[0] == 'v' && strings.Trim(base[1:], "0123456789") == "" {
		base = path.Base(path.Dir(p))
	}
	return base
}

// impurities returns what makes a file impure: a forbidden import, a dot
// import (it hides what a call calls), a go statement, a channel, or one
// of time's clock functions, however time was imported (the identifier
// resolved through the file's imports, not by its spelling).
func impurities(fset *token.FileSet, file *ast.File) []string {
	var found []string
	report := func(pos token.Pos, format string, args ...any) {
		found = append(found, fset.Position(pos).String()+": "+fmt.Sprintf(format, args...))
	}
	names := map[string]string{} // local name: import path
	for _, imp := range file.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := importName(imp, p)
		switch {
		case impureImport(p):
			report(imp.Pos(), "imports %s", p)
		case name == ".":
			report(imp.Pos(), "dot-imports %s", p)
		}
		names[name] = p
	}
	ast.Inspect(file, func(node ast.Node) bool {
		switch x := node.(type) {
		case *ast.GoStmt:
			report(x.Pos(), "a go statement")
		case *ast.ChanType:
			report(x.Pos(), "a channel")
		case *ast.SelectorExpr:
			// An identifier the parser did not resolve to a local
			// object names a package, when an import has its name.
			if id, ok := x.X.(*ast.Ident); ok && id.Obj == nil && names[id.Name] == "time" && impureTime[x.Sel.Name] {
				report(x.Pos(), "time.%s (as %s.%s)", x.Sel.Name, id.Name, x.Sel.Name)
			}
		}
		return true
	})
	return found
}

// The core is pure: its files import nothing that reads a clock, locks,
// does I/O or logs, start no goroutine, use no channel and call none of
// time's clock functions. What it needs of the world comes in as inputs.
func TestCoreIsPure(t *testing.T) {
	files, err := filepath.Glob("core*.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		n++
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range impurities(fset, file) {
			t.Error(e)
		}
	}
	if n < 6 {
		t.Fatalf("only %d core files checked", n)
	}
}

// The purity check catches each way of reaching the world below, and
// passes what is pure (time's types and arithmetic, a local named time).
func TestPurityCheckCatches(t *testing.T) {
	for name, src := range map[string]string{
		"time.Now":       `import "time"; var _ = time.Now()`,
		"time.Since":     `import "time"; var _ = time.Since(time.Time{})`,
		"time.Until":     `import "time"; var _ = time.Until(time.Time{})`,
		"time.Tick":      `import "time"; var _ = time.Tick(1)`,
		"time.AfterFunc": `import "time"; var _ = time.AfterFunc(1, nil)`,
		"time.NewTicker": `import "time"; var _ = time.NewTicker(1)`,
		"time.Sleep":     `import "time"; func f() { time.Sleep(1) }`,
		"time.Now value": `import "time"; var now = time.Now`,
		"aliased time":   `import t2 "time"; var _ = t2.Now()`,
		"aliased Until":  `import t2 "time"; var _ = t2.Until(t2.Time{})`,
		"dot time":       `import . "time"; var _ = Now()`,
		"go statement":   `func f() { go f() }`,
		"channel":        `var c chan int`,
		"sync":           `import "sync"; var mu sync.Mutex`,
		"sync/atomic":    `import "sync/atomic"; var n atomic.Int64`,
		"aliased sync":   `import s "sync"; var mu s.Mutex`,
		"os":             `import "os"; var _ = os.Getpid()`,
		"os/exec":        `import "os/exec"; var _ = exec.Command`,
		"net":            `import "net"; var _ net.Conn`,
		"net/http":       `import "net/http"; var _ = http.Get`,
		"math/rand":      `import "math/rand"; var _ = rand.Int()`,
		"math/rand/v2":   `import "math/rand/v2"; var _ = rand.Int()`,
		"crypto/rand":    `import "crypto/rand"; var _ = rand.Reader`,
		"context":        `import "context"; var _ = context.Background()`,
		"logr":           `import "github.com/go-logr/logr"; var _ logr.Logger`,
		"clock":          `import "k8s.io/utils/clock"; var _ clock.Clock`,
	} {
		if found := checkSource(t, src); len(found) == 0 {
			t.Errorf("%s: not caught in %q", name, src)
		}
	}
	for name, src := range map[string]string{
		"time's types":  `import "time"; var d time.Duration; var _ = time.Unix(0, 0).Add(d)`,
		"a local time":  `type clock struct{}; func (clock) Now() int { return 0 }; func f() { var time clock; _ = time.Now() }`,
		"other package": `import "strings"; var _ = strings.TrimSpace("")`,
	} {
		if found := checkSource(t, src); len(found) != 0 {
			t.Errorf("%s: pure code reported: %q", name, found)
		}
	}
}

func checkSource(t *testing.T, src string) []string {
	t.Helper()
	src = "package p; " + src
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "snippet.go", src, 0)
	if err != nil {
		t.Fatalf("%q: %v", src, err)
	}
	return impurities(fset, file)
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

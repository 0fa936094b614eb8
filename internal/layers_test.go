// Package internal_test keeps internal/'s two layers apart: the libraries
// in internal/<name> sit below the pleg package (it and the API's servers
// use them), the applications in internal/app/<name> above it (they are
// made of it). A library never imports the pleg package or an
// application, and the pleg package never imports an application, so no
// arrow points back up.
package internal_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podlifecycle/pleg/internal/testkit"
)

const module = "github.com/podlifecycle/pleg"

func TestLayers(t *testing.T) {
	libs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, d := range libs {
		if !d.IsDir() || d.Name() == "app" || d.Name() == "testdata" {
			continue
		}
		checked++
		noUpward(t, d.Name(), "internal/"+d.Name())
	}
	noUpward(t, "..", "the pleg package")
	if checked < 5 {
		t.Fatalf("checked %d library packages; the test reads the wrong directory", checked)
	}
}

// noUpward fails t for every import of dir's package that points up: the
// pleg package itself, or an application.
func noUpward(t *testing.T, dir, what string) {
	t.Helper()
	imports, err := testkit.Imports(dir)
	if err != nil {
		t.Fatal(err)
	}
	for f, paths := range imports {
		for _, p := range paths {
			rel, ours := strings.CutPrefix(p, module)
			switch {
			case !ours:
			case strings.HasPrefix(rel, "/internal/app/") || rel == "/internal/app":
				t.Errorf("%s (%s) imports the application %s", what, filepath.Join(dir, f), p)
			case rel == "":
				t.Errorf("%s (%s) imports the pleg package %s", what, filepath.Join(dir, f), p)
			}
		}
	}
}

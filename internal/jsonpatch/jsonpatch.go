// Package jsonpatch applies the RFC 6902 operations that deploy's patches
// use (test and replace) to a document decoded into maps and slices, as
// `kubectl patch --type json` does: a failed test stops the patch, so a
// patch written for one layout of a manifest never changes the wrong item
// of another. The deploy tests and the end-to-end suite patch the
// DaemonSet with it.
package jsonpatch

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Op is one operation of a patch.
type Op struct {
	Op    string `yaml:"op" json:"op"`
	Path  string `yaml:"path" json:"path"`
	Value any    `yaml:"value" json:"value"`
}

// ErrTestFailed is wrapped by Apply's error when a test operation finds
// another value than the patch's.
var ErrTestFailed = errors.New("test operation failed")

// Parse reads a patch written as YAML or JSON (a list of operations).
func Parse(b []byte) ([]Op, error) {
	var ops []Op
	if err := yaml.Unmarshal(b, &ops); err != nil {
		return nil, fmt.Errorf("json patch: %w", err)
	}
	if len(ops) == 0 {
		return nil, errors.New("json patch: no operations")
	}
	return ops, nil
}

// Apply applies ops to doc in order, changing it in place; doc holds
// map[string]any and []any as YAML or JSON decoding gives them. Test
// compares with reflect.DeepEqual, so the document and the patch must be
// decoded alike (numbers are int from YAML, float64 from JSON). It stops at
// the first operation that fails, saying which; operations before it have
// been applied.
func Apply(doc any, ops []Op) error {
	for i, op := range ops {
		if err := apply(doc, op); err != nil {
			return fmt.Errorf("json patch op %d (%s %s): %w", i, op.Op, op.Path, err)
		}
	}
	return nil
}

func apply(doc any, op Op) error {
	if !strings.HasPrefix(op.Path, "/") {
		return fmt.Errorf("path %q does not start with /", op.Path)
	}
	keys := strings.Split(op.Path[1:], "/")
	for i, k := range keys {
		keys[i] = strings.ReplaceAll(strings.ReplaceAll(k, "~1", "/"), "~0", "~")
	}
	parent := doc
	for _, k := range keys[:len(keys)-1] {
		next, err := child(parent, k)
		if err != nil {
			return err
		}
		parent = next
	}
	last := keys[len(keys)-1]
	cur, err := child(parent, last)
	if err != nil {
		return err
	}
	switch op.Op {
	case "test":
		if !reflect.DeepEqual(cur, op.Value) {
			return fmt.Errorf("%w: found %v, want %v", ErrTestFailed, cur, op.Value)
		}
	case "replace":
		switch p := parent.(type) {
		case map[string]any:
			p[last] = op.Value
		case []any:
			n, _ := strconv.Atoi(last) // child checked it
			p[n] = op.Value
		}
	default:
		return fmt.Errorf("operation %q is not supported (only test and replace)", op.Op)
	}
	return nil
}

// child is v's member key: a map's key or a slice's index.
func child(v any, key string) (any, error) {
	switch c := v.(type) {
	case map[string]any:
		next, ok := c[key]
		if !ok {
			return nil, fmt.Errorf("no member %q", key)
		}
		return next, nil
	case []any:
		n, err := strconv.Atoi(key)
		if err != nil || n < 0 || n >= len(c) {
			return nil, fmt.Errorf("no index %q in a list of %d", key, len(c))
		}
		return c[n], nil
	}
	return nil, fmt.Errorf("cannot descend into %T at %q", v, key)
}

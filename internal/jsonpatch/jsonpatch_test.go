package jsonpatch

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const doc = `
spec:
  containers:
  - name: pleg
    args: [--a=1, --b=2]
  paths:
    a/b: x
`

const patch = `
- op: test
  path: /spec/containers/0/args/1
  value: --b=2
- op: replace
  path: /spec/containers/0/args/1
  value: --b=3
- op: replace
  path: /spec/paths/a~1b
  value: y
`

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestApply(t *testing.T) {
	d := decode(t, doc)
	ops, err := Parse([]byte(patch))
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(d, ops); err != nil {
		t.Fatal(err)
	}
	out, _ := yaml.Marshal(d)
	for _, want := range []string{"--b=3", "a/b: \"y\"", "--a=1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("patched document lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "--b=2") {
		t.Errorf("the replaced value is still there:\n%s", out)
	}
}

func TestApplyRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, patch, want string
		test              bool
	}{
		{"failed test", "- {op: test, path: /spec/containers/0/name, value: other}", "found pleg, want other", true},
		{"missing member", "- {op: replace, path: /spec/volumes/0, value: x}", `no member "volumes"`, false},
		{"index out of range", "- {op: replace, path: /spec/containers/3/name, value: x}", `no index "3" in a list of 1`, false},
		{"not an index", "- {op: test, path: /spec/containers/first, value: x}", `no index "first"`, false},
		{"scalar", "- {op: test, path: /spec/containers/0/name/x, value: x}", "cannot descend into string", false},
		{"relative path", "- {op: test, path: spec, value: x}", "does not start with /", false},
		{"unsupported op", "- {op: remove, path: /spec/containers/0}", `operation "remove" is not supported`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decode(t, doc)
			before, _ := yaml.Marshal(d)
			ops, err := Parse([]byte(tc.patch))
			if err != nil {
				t.Fatal(err)
			}
			err = Apply(d, ops)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply: %v, want an error with %q", err, tc.want)
			}
			if errors.Is(err, ErrTestFailed) != tc.test {
				t.Errorf("errors.Is(%v, ErrTestFailed) = %v", err, !tc.test)
			}
			if after, _ := yaml.Marshal(d); string(after) != string(before) {
				t.Errorf("a refused operation changed the document:\n%s", after)
			}
		})
	}
	if _, err := Parse([]byte("[]")); err == nil {
		t.Error("Parse accepted a patch with no operations")
	}
	if _, err := Parse([]byte("op: test")); err == nil {
		t.Error("Parse accepted a patch that is not a list")
	}
}

package crictl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Items decodes crictl's -o json listing (out) into the items under key
// ("items" for pods, "containers" for ps), by ID, without the fields of
// drop (docs/cri.md, "What differs"): "a" drops field a of each item,
// "a.b" field b of its object a. The tests that compare crictl's answers
// through pleg and straight to a runtime (this package's and test/e2e's)
// share it.
func Items(t testing.TB, out, key string, drop ...string) map[string]map[string]any {
	t.Helper()
	var doc map[string][]map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("crictl's JSON: %v\n%s", err, out)
	}
	m := map[string]map[string]any{}
	for _, it := range doc[key] {
		for _, d := range drop {
			if outer, inner, ok := strings.Cut(d, "."); ok {
				if o, _ := it[outer].(map[string]any); o != nil {
					delete(o, inner)
				}
				continue
			}
			delete(it, d)
		}
		id, ok := it["id"].(string)
		if !ok {
			t.Fatalf("crictl's JSON: an item of %q without an ID: %v", key, it)
		}
		m[id] = it
	}
	return m
}

// EqualJSON fails t when the runtime's and pleg's answers (Items' maps, or
// any JSON value) differ, showing both.
func EqualJSON(t testing.TB, what string, runtime, pleg any) {
	t.Helper()
	ja, _ := json.MarshalIndent(runtime, "", " ")
	jb, _ := json.MarshalIndent(pleg, "", " ")
	if !bytes.Equal(ja, jb) {
		t.Errorf("%s differs:\nruntime: %s\npleg:    %s", what, ja, jb)
	}
}

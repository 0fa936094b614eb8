package entrycache

import "testing"

// An entry is encoded once per identity choice; a slot reused by a later
// entry encodes it afresh; a refused encoding is not kept.
func TestGet(t *testing.T) {
	const size = 16
	c := New[string](size)
	calls := 0
	enc := func(s string) func() (string, bool) {
		return func() (string, bool) { calls++; return s, true }
	}
	for range 3 {
		if v, ok := c.Get(7, false, enc("a")); !ok || v != "a" {
			t.Fatalf("Get(7) = %q, %v", v, ok)
		}
	}
	if v, _ := c.Get(7, true, enc("A")); v != "A" || calls != 2 {
		t.Fatalf("Get(7, identity) = %q after %d encodings, want A after 2", v, calls)
	}
	if v, _ := c.Get(7+size, false, enc("b")); v != "b" || calls != 3 {
		t.Fatalf("Get(7+size) = %q after %d encodings, want b after 3", v, calls)
	}
	refuse := func() (string, bool) { calls++; return "", false }
	for range 2 {
		if _, ok := c.Get(9, false, refuse); ok {
			t.Fatal("a refused encoding was returned as ok")
		}
	}
	if calls != 5 {
		t.Fatalf("%d encodings, want a refused one retried (5)", calls)
	}
}

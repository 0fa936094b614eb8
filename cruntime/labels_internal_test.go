package cruntime

import (
	"strconv"
	"strings"
	"testing"
)

// Sets with the same keys share them; a set of other keys has its own;
// past the table's bound a new key set is kept privately, and still
// answers as its map.
func TestLabelsShareKeys(t *testing.T) {
	old := keySets.sets
	keySets.sets = nil
	t.Cleanup(func() { keySets.sets = old })

	pod := func(uid, name string) map[string]string {
		return map[string]string{LabelPodUID: uid, LabelPodName: name, LabelPodNamespace: "default", LabelContainerName: "app"}
	}
	a, b := NewLabels(pod("u1", "web-0")), NewLabels(pod("u2", "web-1"))
	if a.keys != b.keys {
		t.Error("two sets of the kubelet's container label keys keep two key slices")
	}
	if a.Equal(b) || a.Get(LabelPodUID) != "u1" || b.Get(LabelPodUID) != "u2" {
		t.Errorf("sets sharing keys mixed up: %v, %v", a, b)
	}
	if c := NewLabels(map[string]string{"app": "web"}); c.keys == a.keys {
		t.Error("sets of different keys share keys")
	}
	// {"ab"} and {"a", "b"} are different key sets.
	x, y := NewLabels(map[string]string{"ab": "1"}), NewLabels(map[string]string{"a": "1", "b": "2"})
	if x.keys == y.keys || x.Get("ab") != "1" || y.Get("b") != "2" {
		t.Errorf("key sets mixed up: %v, %v", x, y)
	}

	for i := 0; len(keySets.sets) < maxKeySets; i++ {
		NewLabels(map[string]string{"k" + strconv.Itoa(i): "v"})
	}
	p, q := NewLabels(map[string]string{"late": "1"}), NewLabels(map[string]string{"late": "2"})
	if len(keySets.sets) != maxKeySets || p.keys == q.keys || p.Get("late") != "1" || q.Get("late") != "2" {
		t.Errorf("past the bound: %d sets, %v and %v", len(keySets.sets), p, q)
	}
	if again := NewLabels(pod("u3", "web-2")); again.keys != a.keys {
		t.Error("a key set shared before the table filled is no longer shared")
	}
	long := NewLabels(map[string]string{strings.Repeat("k", maxKeySetBytes): "v"})
	if long.Len() != 1 || long.Get(strings.Repeat("k", maxKeySetBytes)) != "v" {
		t.Errorf("a key longer than the content key bound: %v", long.Len())
	}
}

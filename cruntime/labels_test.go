package cruntime_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/labels"
)

// Labels answers every question as the map it was made of, at every size
// (a linear scan for a few pairs, a binary search past them).
func TestLabelsAgreeWithTheirMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 4, 15, 16, 17, 40, 200} {
		m := map[string]string{}
		for len(m) < n {
			m[fmt.Sprintf("k%x", rng.Uint32()%1000)] = fmt.Sprint(rng.Uint32())
		}
		l := cruntime.NewLabels(m)
		if l.Len() != len(m) || !maps.Equal(l.Map(), m) && len(m) > 0 {
			t.Fatalf("%d pairs: %v from %v", n, l, m)
		}
		if n == 0 && l.Map() != nil {
			t.Errorf("empty labels made a map")
		}
		var keys []string
		for k, v := range l.All() {
			keys = append(keys, k)
			if m[k] != v {
				t.Errorf("%d pairs: All gives %s=%s, the map %s", n, k, v, m[k])
			}
		}
		if !slices.IsSorted(keys) {
			t.Errorf("%d pairs: All out of key order: %v", n, keys)
		}
		for k, v := range m {
			if got, ok := l.Lookup(k); !ok || got != v || l.Get(k) != v || !l.Has(k) {
				t.Errorf("%d pairs: Lookup(%q) = %q, %v; want %q", n, k, got, ok, v)
			}
		}
		for _, k := range []string{"", "k", "kzzz", "a", "~"} {
			if _, in := m[k]; in {
				continue
			}
			if v, ok := l.Lookup(k); ok || v != "" || l.Has(k) {
				t.Errorf("%d pairs: Lookup(%q) = %q, %v for a key it lacks", n, k, v, ok)
			}
		}
	}
}

func TestLabelsEqualAndSame(t *testing.T) {
	a := cruntime.LabelsOf("app", "web", "tier", "front")
	b := cruntime.NewLabels(map[string]string{"tier": "front", "app": "web"})
	c := cruntime.LabelsOf("app", "web", "tier", "back")
	if !a.Equal(b) || a.Equal(c) || a.Equal(cruntime.Labels{}) {
		t.Errorf("Equal: a=b %v, a=c %v", a.Equal(b), a.Equal(c))
	}
	if a.SameAs(b) || !a.SameAs(a) || !(cruntime.Labels{}).SameAs(cruntime.NewLabels(nil)) {
		t.Error("SameAs tells equal sets from one set wrongly")
	}
	if a.String() != "app=web,tier=front" {
		t.Errorf("String() = %q", a.String())
	}
}

// A key given twice to LabelsOf keeps its last value; an odd count is a
// programming error.
func TestLabelsOf(t *testing.T) {
	if l := cruntime.LabelsOf("a", "1", "a", "2"); l.Len() != 1 || l.Get("a") != "2" {
		t.Errorf("LabelsOf with a repeated key: %v", l)
	}
	defer func() {
		if recover() == nil {
			t.Error("LabelsOf with an odd count did not panic")
		}
	}()
	cruntime.LabelsOf("a")
}

// A label selector matches Labels as it matches the map.
func TestLabelsMatchSelectors(t *testing.T) {
	l := cruntime.LabelsOf("app", "web", "tier", "front")
	for sel, want := range map[string]bool{"app=web": true, "app=db": false, "tier in (front,back)": true, "!tier": false, "env": false, "": true} {
		s, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		if s.Matches(l) != want || s.Matches(labels.Set(l.Map())) != want {
			t.Errorf("%q matches %v: %v, want %v", sel, l, s.Matches(l), want)
		}
	}
}

// Labels is a JSON object, as the map it stands for; empty is null.
func TestLabelsJSON(t *testing.T) {
	l := cruntime.LabelsOf("b", "2", "a", `"1"`)
	b, err := json.Marshal(struct{ L cruntime.Labels }{l})
	if err != nil || string(b) != `{"L":{"a":"\"1\"","b":"2"}}` {
		t.Fatalf("Marshal: %s, %v", b, err)
	}
	var back struct{ L cruntime.Labels }
	if err := json.Unmarshal(b, &back); err != nil || !back.L.Equal(l) {
		t.Fatalf("Unmarshal: %v, %v", back.L, err)
	}
	if b, _ := json.Marshal(cruntime.Labels{}); string(b) != "null" {
		t.Errorf("empty labels: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"a":1}`), &back.L); err == nil {
		t.Error("a number value decoded")
	}
}

// A kubelet's four container labels take one allocation and a fraction
// of a map's memory.
func TestLabelsAreSmall(t *testing.T) {
	m := map[string]string{cruntime.LabelContainerName: "app", cruntime.LabelPodName: "web-0",
		cruntime.LabelPodNamespace: "default", cruntime.LabelPodUID: "0b6f7c1e-4d2a-4f3b-9c8d-000000000001"}
	in := new(cruntime.Interner)
	if n := testing.AllocsPerRun(100, func() { _ = in.Labels(m) }); n > 2 {
		t.Errorf("Interner.Labels: %v allocations, want at most 2 (the pairs and their sort)", n)
	}
}

func ExampleLabels() {
	l := cruntime.NewLabels(map[string]string{"io.kubernetes.pod.name": "web-0", "app": "web"})
	fmt.Println(l.Get("app"), l.Has("tier"), l.Len())
	for k, v := range l.All() {
		fmt.Println(k, v)
	}
	// Output:
	// web false 2
	// app web
	// io.kubernetes.pod.name web-0
}

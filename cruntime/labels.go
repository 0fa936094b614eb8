package cruntime

import (
	"encoding/json"
	"iter"
	"slices"
	"sort"
	"strings"
)

// Labels is an immutable set of labels or annotations: key-value pairs
// sorted by key. It is what pleg keeps for every sandbox and container
// for as long as its pod lives, so it is small: one slice of strings, 16
// bytes a string, where a Go map of a kubelet's four container labels
// costs about 340 bytes before its strings. The zero value is empty.
//
// A Labels is read-only once made; copies share their pairs. It satisfies
// k8s.io/apimachinery/pkg/labels.Labels, so a label selector matches it
// as it is.
type Labels struct {
	kv []string // key, value, key, value…; keys sorted, each once
}

// NewLabels returns the labels of m (nil or empty: empty labels).
func NewLabels(m map[string]string) Labels { return NewLabelsWith(m, nil, nil) }

// byKey sorts pairs key, value, key, value… by key.
type byKey []string

func (p byKey) Len() int           { return len(p) / 2 }
func (p byKey) Less(i, j int) bool { return p[2*i] < p[2*j] }
func (p byKey) Swap(i, j int) {
	p[2*i], p[2*j] = p[2*j], p[2*i]
	p[2*i+1], p[2*j+1] = p[2*j+1], p[2*i+1]
}

// NewLabelsWith returns the labels of m with every key passed through
// key and every value through value (nil: as they are). Each must return
// a string equal to its argument: a runtime client passes its interning
// of the strings many containers share.
func NewLabelsWith(m map[string]string, key, value func(string) string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	kv := make([]string, 0, 2*len(m))
	for k, v := range m {
		if key != nil {
			k = key(k)
		}
		if value != nil {
			v = value(v)
		}
		kv = append(kv, k, v)
	}
	sort.Sort(byKey(kv))
	return Labels{kv: kv}
}

// LabelsOf returns labels of the pairs key, value, key, value… (a key
// given twice keeps its last value). It panics when pairs has an odd
// length: it is for literals in code and tests.
func LabelsOf(pairs ...string) Labels {
	if len(pairs)%2 != 0 {
		panic("cruntime.LabelsOf: odd number of strings")
	}
	m := make(map[string]string, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return NewLabels(m)
}

// Len is the number of pairs.
func (l Labels) Len() int { return len(l.kv) / 2 }

// Lookup returns the value of key and whether l has it.
func (l Labels) Lookup(key string) (string, bool) {
	// A container has a handful of labels: a linear scan beats a binary
	// search up to a dozen or so, and most lookups are for one of them.
	if len(l.kv) <= 32 {
		for i := 0; i < len(l.kv); i += 2 {
			if l.kv[i] == key {
				return l.kv[i+1], true
			}
		}
		return "", false
	}
	n := len(l.kv) / 2
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c := strings.Compare(l.kv[2*m], key); c < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < n && l.kv[2*lo] == key {
		return l.kv[2*lo+1], true
	}
	return "", false
}

// Get returns the value of key, "" when l has none.
func (l Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Has says whether l has key.
func (l Labels) Has(key string) bool {
	_, ok := l.Lookup(key)
	return ok
}

// All yields the pairs in key order.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for i := 0; i < len(l.kv); i += 2 {
			if !yield(l.kv[i], l.kv[i+1]) {
				return
			}
		}
	}
}

// Map returns a new map of the pairs, nil when l is empty.
func (l Labels) Map() map[string]string {
	if len(l.kv) == 0 {
		return nil
	}
	m := make(map[string]string, len(l.kv)/2)
	for i := 0; i < len(l.kv); i += 2 {
		m[l.kv[i]] = l.kv[i+1]
	}
	return m
}

// Equal says whether l and o have the same pairs.
func (l Labels) Equal(o Labels) bool { return slices.Equal(l.kv, o.kv) }

// SameAs says whether l and o are one set (copies of one Labels, or both
// empty): what a reader can tell without comparing the pairs.
func (l Labels) SameAs(o Labels) bool {
	if len(l.kv) != len(o.kv) {
		return false
	}
	return len(l.kv) == 0 || &l.kv[0] == &o.kv[0]
}

// Bytes estimates what l holds in memory: its slice and its strings,
// as if none were shared.
func (l Labels) Bytes() int {
	n := 16 * len(l.kv)
	for _, s := range l.kv {
		n += len(s)
	}
	return n
}

// String formats l as k=v pairs separated by commas, in key order.
func (l Labels) String() string {
	var b strings.Builder
	for i := 0; i < len(l.kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.kv[i])
		b.WriteByte('=')
		b.WriteString(l.kv[i+1])
	}
	return b.String()
}

// MarshalJSON encodes l as a JSON object (null when empty, as a nil map).
func (l Labels) MarshalJSON() ([]byte, error) { return json.Marshal(l.Map()) }

// UnmarshalJSON decodes a JSON object of strings (or null).
func (l *Labels) UnmarshalJSON(b []byte) error {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*l = NewLabels(m)
	return nil
}

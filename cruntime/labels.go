package cruntime

import (
	"encoding/json"
	"iter"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Labels is an immutable set of labels or annotations: key-value pairs
// sorted by key. It is what pleg keeps for every sandbox and container
// for as long as its pod lives, so it is small: the values, 16 bytes a
// string, and a pointer to the sorted keys, which every set with the same
// keys shares (a kubelet gives each container the same four label keys,
// each replica of a workload the same annotation keys: see Interner). A Go map of a
// kubelet's four container labels costs about 340 bytes before its
// strings; these, 64 and a pointer. The zero value is empty.
//
// A Labels is read-only once made; copies share their pairs. It satisfies
// k8s.io/apimachinery/pkg/labels.Labels, so a label selector matches it
// as it is.
type Labels struct {
	keys *[]string // sorted, each once; shared (Interner); nil when empty
	vals []string  // vals[i] is the value of (*keys)[i]
}

// NewLabels returns the labels of m (nil or empty: empty labels), with
// keys and strings of their own: a runtime client shares them between
// the statuses it decodes through its Interner.
func NewLabels(m map[string]string) Labels { return newLabels(m, nil) }

// pairScratch holds the pairs of a set being made.
var pairScratch = sync.Pool{New: func() any { return new([]string) }}

// ownKeys returns keys of their own equal to the even strings of kv.
func ownKeys(kv []string) *[]string {
	keys := make([]string, len(kv)/2)
	for i := range keys {
		keys[i] = kv[2*i]
	}
	return &keys
}

// sortPairs sorts pairs key, value, key, value… by key: by insertion for
// the handful of labels most sets have, which allocates nothing.
func sortPairs(kv []string) {
	if len(kv) > 32 {
		sort.Sort(byKey(kv))
		return
	}
	for i := 2; i < len(kv); i += 2 {
		for j := i; j > 0 && kv[j] < kv[j-2]; j -= 2 {
			kv[j], kv[j-2] = kv[j-2], kv[j]
			kv[j+1], kv[j-1] = kv[j-1], kv[j+1]
		}
	}
}

// byKey sorts pairs key, value, key, value… by key.
type byKey []string

func (p byKey) Len() int           { return len(p) / 2 }
func (p byKey) Less(i, j int) bool { return p[2*i] < p[2*j] }
func (p byKey) Swap(i, j int) {
	p[2*i], p[2*j] = p[2*j], p[2*i]
	p[2*i+1], p[2*j+1] = p[2*j+1], p[2*i+1]
}

// newLabels returns the labels of m, its strings and key set shared
// through in (held by the caller), or its own when in is nil.
func newLabels(m map[string]string, in *Interner) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	sp := pairScratch.Get().(*[]string)
	kv := (*sp)[:0]
	for k, v := range m {
		if in != nil {
			k, v = in.str(k), in.str(v)
		}
		kv = append(kv, k, v)
	}
	sortPairs(kv)
	vals := make([]string, len(m))
	for i := range vals {
		vals[i] = kv[2*i+1]
	}
	var keys *[]string
	if in != nil {
		keys = in.keySet(kv)
	} else {
		keys = ownKeys(kv)
	}
	l := Labels{keys: keys, vals: vals}
	clear(kv)
	if cap(kv) <= 256 {
		*sp = kv
		pairScratch.Put(sp)
	}
	return l
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
func (l Labels) Len() int { return len(l.vals) }

// key is the i-th key.
func (l Labels) key(i int) string { return (*l.keys)[i] }

// Lookup returns the value of key and whether l has it.
func (l Labels) Lookup(key string) (string, bool) {
	if len(l.vals) == 0 {
		return "", false
	}
	keys := *l.keys
	// A container has a handful of labels: a linear scan beats a binary
	// search up to a dozen or so, and most lookups are for one of them.
	if len(keys) <= 16 {
		for i, k := range keys {
			if k == key {
				return l.vals[i], true
			}
		}
		return "", false
	}
	i, ok := slices.BinarySearch(keys, key)
	if !ok {
		return "", false
	}
	return l.vals[i], true
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
		for i, v := range l.vals {
			if !yield(l.key(i), v) {
				return
			}
		}
	}
}

// Map returns a new map of the pairs, nil when l is empty.
func (l Labels) Map() map[string]string {
	if len(l.vals) == 0 {
		return nil
	}
	m := make(map[string]string, len(l.vals))
	for i, v := range l.vals {
		m[l.key(i)] = v
	}
	return m
}

// Equal says whether l and o have the same pairs.
func (l Labels) Equal(o Labels) bool {
	if len(l.vals) != len(o.vals) {
		return false
	}
	if len(l.vals) == 0 {
		return true
	}
	return (l.keys == o.keys || slices.Equal(*l.keys, *o.keys)) && slices.Equal(l.vals, o.vals)
}

// SameAs says whether l and o are one set (copies of one Labels, or both
// empty): what a reader can tell without comparing the pairs.
func (l Labels) SameAs(o Labels) bool {
	if len(l.vals) != len(o.vals) {
		return false
	}
	return len(l.vals) == 0 || &l.vals[0] == &o.vals[0]
}

// Bytes estimates what l holds in memory: its pairs and their strings,
// as if none were shared.
func (l Labels) Bytes() int {
	n := 32 * len(l.vals)
	for i, v := range l.vals {
		n += len(l.key(i)) + len(v)
	}
	return n
}

// String formats l as k=v pairs separated by commas, in key order.
func (l Labels) String() string {
	var b strings.Builder
	for i, v := range l.vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.key(i))
		b.WriteByte('=')
		b.WriteString(v)
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

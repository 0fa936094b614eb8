package cruntime

import (
	"encoding/binary"
	"strings"
	"sync"
)

// Interner shares what many statuses hold alike: strings (image
// references, the keys and common values of labels and annotations), the
// sorted keys of label sets, and whole sets (the annotations a workload's
// replicas carry alike). A runtime client owns one and passes every
// status it decodes through it; nothing is shared between two Interners.
// It is safe for concurrent use; the zero value uses the default limits.
//
// What it keeps is bounded in entries and bytes, and it lets go of what
// no live pod holds: every use marks an entry with the current
// generation, and Round, called after each complete listing, sweeps the
// table (drops the entries not used since the previous sweep and starts a
// generation) once the bytes added since that sweep reach half what it
// kept then (and at least InternLimits.SweepBytes), or the table refused
// an entry for want of room. A sweep keeps what the period before it used
// or added, so the table holds about twice what live pods use again, the
// dead of one period and SweepBytes at most: the dead go within two
// sweeps, and a steady node, which adds nothing, is never swept. A string longer
// than InternLimits.MaxLen is never kept (a pod's own network status, a
// last-applied configuration). Dropping an entry frees nothing a status
// still holds; a status decoded later keeps a copy of its own, which the
// table shares again from then on.
type Interner struct {
	mu    sync.Mutex
	lim   InternLimits
	gen   uint32                    // the current generation
	strs  map[string]internedString // the string -> its shared copy
	keys  map[string]internedKeys   // content key -> shared sorted keys
	sets  map[string]internedSet    // content key -> shared labels
	bytes int                       // what the entries hold (entryBytes each, and their bytes)
	added int                       // bytes added since the last sweep
	kept  int                       // bytes kept by the last sweep
	full  bool                      // an entry was refused since the last sweep
	swept int                       // sweeps so far
	buf   []byte                    // scratch: a content key
}

// InternLimits bounds an Interner. A zero field takes its default.
type InternLimits struct {
	// MaxLen is the longest string interned (default 1 KiB).
	MaxLen int
	// MaxEntries bounds the strings, key sets and label sets kept
	// together (default 16,384).
	MaxEntries int
	// MaxBytes bounds what they hold, an entry's own bytes and
	// entryBytes of overhead each (default 2 MiB).
	MaxBytes int
	// SweepBytes is the least that must be added since the last sweep
	// for Round to sweep again (default 64 KiB).
	SweepBytes int
}

// Default limits (InternLimits).
const (
	DefaultInternMaxLen     = 1 << 10
	DefaultInternMaxEntries = 16 << 10
	DefaultInternMaxBytes   = 2 << 20
	DefaultInternSweepBytes = 64 << 10
)

const (
	// internMin is the shortest string interned: a shorter one costs less
	// than the map entry that would share it.
	internMin = 16
	// maxKeySetBytes is the longest content key of a shared key set;
	// maxSetBytes of a shared label set: larger sets keep their own.
	maxKeySetBytes = 1 << 10
	maxSetBytes    = 4 << 10
	// entryBytes is what an entry is counted for besides its bytes: its
	// map slot and headers.
	entryBytes = 64
)

type internedString struct {
	s   string
	gen uint32
}

type internedKeys struct {
	keys *[]string
	gen  uint32
}

type internedSet struct {
	l   Labels
	gen uint32
}

// InternStats is what an Interner holds.
type InternStats struct {
	Entries int // strings, key sets and label sets
	Bytes   int // counted as MaxBytes counts them
	Sweeps  int // sweeps so far
}

// NewInterner returns an empty Interner bounded by lim.
func NewInterner(lim InternLimits) *Interner { return &Interner{lim: lim} }

func (in *Interner) maxLen() int     { return cmpOr(in.lim.MaxLen, DefaultInternMaxLen) }
func (in *Interner) maxEntries() int { return cmpOr(in.lim.MaxEntries, DefaultInternMaxEntries) }
func (in *Interner) maxBytes() int   { return cmpOr(in.lim.MaxBytes, DefaultInternMaxBytes) }
func (in *Interner) sweepBytes() int { return cmpOr(in.lim.SweepBytes, DefaultInternSweepBytes) }

// cmpOr is v, or def when v is not positive.
func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// String returns the shared copy of s, sharing s if there is none and it
// is worth sharing.
func (in *Interner) String(s string) string {
	if len(s) < internMin {
		return s
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.str(s)
}

// Labels returns the labels of m, its strings and key set shared; equal
// labels returned before, that do not name their pod, are returned again
// instead (the annotations of a workload's replicas are the same). A set
// naming its pod (io.kubernetes.pod.uid: the labels the kubelet gives a
// container or sandbox) is that pod's alone and is not offered to the
// table. Nil or empty gives empty labels.
func (in *Interner) Labels(m map[string]string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.share(newLabels(m, in))
}

// Round ends a round of decoding (a complete listing, and the statuses
// fetched after the one before): it sweeps the table once enough was
// added since the last sweep, or an entry was refused.
func (in *Interner) Round() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.full || in.added >= max(in.kept/2, in.sweepBytes()) {
		in.sweep()
	}
}

// Sweep drops every entry not used since the last sweep and starts a
// generation.
func (in *Interner) Sweep() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.sweep()
}

func (in *Interner) sweep() {
	for k, e := range in.strs {
		if e.gen != in.gen {
			delete(in.strs, k)
			in.bytes -= len(k) + entryBytes
		}
	}
	for k, e := range in.keys {
		if e.gen != in.gen {
			delete(in.keys, k)
			in.bytes -= keysBytes(k, e.keys)
		}
	}
	for k, e := range in.sets {
		if e.gen != in.gen {
			delete(in.sets, k)
			in.bytes -= setBytes(k, e.l)
		}
	}
	in.gen++
	in.kept, in.added, in.full = in.bytes, 0, false
	in.swept++
}

// Stats returns what the table holds.
func (in *Interner) Stats() InternStats {
	in.mu.Lock()
	defer in.mu.Unlock()
	return InternStats{Entries: len(in.strs) + len(in.keys) + len(in.sets), Bytes: in.bytes, Sweeps: in.swept}
}

// Holds says whether the table keeps a string equal to s, or a string
// containing it, in any entry: a string, a key or a value of a set.
func (in *Interner) Holds(s string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for k := range in.strs {
		if strings.Contains(k, s) {
			return true
		}
	}
	for k := range in.keys {
		if strings.Contains(k, s) {
			return true
		}
	}
	for k := range in.sets {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// room says whether an entry of n bytes fits, and notes that the table is
// full when it does not.
func (in *Interner) room(n int) bool {
	if len(in.strs)+len(in.keys)+len(in.sets) >= in.maxEntries() || in.bytes+n > in.maxBytes() {
		in.full = true
		return false
	}
	in.bytes += n
	in.added += n
	return true
}

// str is String with in.mu held.
func (in *Interner) str(s string) string {
	if len(s) < internMin || len(s) > in.maxLen() {
		return s
	}
	if e, ok := in.strs[s]; ok {
		if e.gen != in.gen {
			in.strs[s] = internedString{e.s, in.gen}
		}
		return e.s
	}
	if !in.room(len(s) + entryBytes) {
		return s
	}
	if in.strs == nil {
		in.strs = make(map[string]internedString)
	}
	in.strs[s] = internedString{s, in.gen}
	return s
}

// keySet returns the shared keys equal to the even strings of kv (sorted
// pairs), adding them if there are none and the table has room; own
// makes keys of the set's own. in.mu is held.
func (in *Interner) keySet(kv []string) *[]string {
	n := 0
	for i := 0; i < len(kv); i += 2 {
		n += len(kv[i]) + binary.MaxVarintLen64
	}
	if n > maxKeySetBytes {
		return ownKeys(kv)
	}
	in.buf = in.buf[:0]
	for i := 0; i < len(kv); i += 2 {
		// Keys may hold any byte: each is prefixed by its length, so
		// that no two sets have one content key.
		in.buf = binary.AppendUvarint(in.buf, uint64(len(kv[i])))
		in.buf = append(in.buf, kv[i]...)
	}
	if e, ok := in.keys[string(in.buf)]; ok {
		if e.gen != in.gen {
			in.keys[string(in.buf)] = internedKeys{e.keys, in.gen}
		}
		return e.keys
	}
	keys := ownKeys(kv)
	if in.room(keysBytes(string(in.buf), keys)) {
		if in.keys == nil {
			in.keys = make(map[string]internedKeys)
		}
		in.keys[string(in.buf)] = internedKeys{keys, in.gen}
	}
	return keys
}

// share returns the table's labels equal to l, adding l if there are
// none and it may be shared. in.mu is held.
func (in *Interner) share(l Labels) Labels {
	if l.Len() == 0 || l.Has(LabelPodUID) {
		return l
	}
	in.buf = in.buf[:0]
	for k, v := range l.All() {
		if len(in.buf)+len(k)+len(v)+2*binary.MaxVarintLen64 > maxSetBytes {
			return l // checked first: the scratch key never outgrows the bound
		}
		// Keys and values may hold any byte: each is prefixed by its
		// length, so that no two sets have one key.
		in.buf = binary.AppendUvarint(in.buf, uint64(len(k)))
		in.buf = append(in.buf, k...)
		in.buf = binary.AppendUvarint(in.buf, uint64(len(v)))
		in.buf = append(in.buf, v...)
	}
	if e, ok := in.sets[string(in.buf)]; ok {
		if e.gen != in.gen {
			in.sets[string(in.buf)] = internedSet{e.l, in.gen}
		}
		return e.l
	}
	if in.room(setBytes(string(in.buf), l)) {
		if in.sets == nil {
			in.sets = make(map[string]internedSet)
		}
		in.sets[string(in.buf)] = internedSet{l, in.gen}
	}
	return l
}

// keysBytes is what a key set's entry is counted for: its content key,
// its slice of string headers and the overhead.
func keysBytes(content string, keys *[]string) int {
	return len(content) + 16*len(*keys) + entryBytes
}

// setBytes is what a label set's entry is counted for: its content key,
// its values' headers and the overhead (its strings are counted as
// strings, or are its own).
func setBytes(content string, l Labels) int {
	return len(content) + 16*l.Len() + entryBytes
}

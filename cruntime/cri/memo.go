package cri

import (
	"hash/maphash"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/podlifecycle/pleg/cruntime"
)

// A relist lists a node that mostly did not change since the last second.
// The memo of the last unfiltered listing makes such a listing cost one pass
// over the reply bytes:
//
//   - An item (a sandbox or container of a list reply) whose bytes are those
//     of an item of the previous listing is not decoded: its decoded form is
//     taken from the memo. Items are matched by a 64-bit hash of their bytes
//     (ID included), with a seed random to the process, confirmed by their
//     length: a wrong match needs two different items of the same length
//     whose hashes collide, about one chance in 2^64 for a pair. Labels and
//     annotations are left out of the hash: CRI never changes them, and
//     runtimes encode their entries in random order.
//   - A pod whose items were all matched, and as many as last time, is the
//     previous listing's *cruntime.Pod itself: nothing is built for it, and
//     the generator sees the same pointer (its diff is a comparison).
//   - The maps and scratch space are kept from one listing to the next and
//     cleared, not reallocated.
//
// Only what changed is decoded and allocated. What the memo holds is
// proportional to the listing: one entry per item that can be grouped and
// one per pod; the
// items' strings and the pods are shared with the generator's records.
type memo struct {
	mu         sync.Mutex // held for a whole listing; a concurrent listing goes without
	seed       maphash.Seed
	sandboxes  itemMemo
	containers itemMemo
	pods, next map[string]memoPod // by pod UID: last listing's, and the one being built
	// last is the last listing as returned (sorted), and its item counts:
	// a listing that found every item of it, and no other, is it again.
	last             []*cruntime.Pod
	lastSbs, lastCts int
	scratch          groupScratch
	strings          interner
}

// itemMemo maps the hash of an item's bytes to its decoded form, for the
// previous listing and the one being decoded, told apart by the listing
// they were last seen in: one lookup per item, and a sweep after the
// listing instead of a second table.
type itemMemo struct {
	items   itemTable
	gen     uint32 // the listing being decoded (wrapping: only equality counts)
	decoded int    // items it did not find, and decoded
	found   int    // items it found
	repeats int    // items found that the listing had already had
	// added are the items decoded since the last commit, which commits
	// them; uncommitted says the listing began with some (a listing
	// failed since the last commit), so that an item found may be one of
	// them.
	added       []*listed
	uncommitted bool
}

type memoPod struct {
	pod   *cruntime.Pod
	items int // sandboxes and containers
}

// lookup returns the decoded form of the item b if the memo has it, and
// notes it for the next listing; first says it is the first item of this
// listing found there. maps says which field numbers of the item are maps.
// The item returned is the memo's own: the caller only reads it.
func (m *itemMemo) lookup(seed maphash.Seed, b []byte, maps mapFields) (it *listed, h uint64, first, ok bool) {
	h = itemKey(seed, b, maps)
	if s := m.items.find(h); s != nil && int(s.size) == len(b) {
		if s.seen != m.gen {
			s.seen = m.gen
			m.found++
			first = true
		} else {
			m.repeats++
		}
		return s.it, h, first, true
	}
	return nil, h, false, false
}

// mapFields are the field numbers of an item's label and annotation maps,
// and of its state.
type mapFields struct{ labels, annotations, state protowire.Number }

var (
	sandboxMaps   = mapFields{labels: fieldSandboxLabels, annotations: fieldSandboxAnnotations, state: fieldSandboxState}
	containerMaps = mapFields{labels: fieldContainerLabels, annotations: fieldContainerAnnotations, state: fieldContainerState}
)

// itemKey hashes an encoded item.
//
// CRI never changes an item's labels and annotations (they are set when the
// sandbox or container is created), nor anything after them in the
// encoding; of what a listing item holds, only the state changes. And a
// runtime may encode map entries in any order (Go's encoder follows map
// iteration, which is random), so their bytes differ from one listing to
// the next anyway. So the key is the hash of the bytes before the first map
// entry, once the ID and the state have been read there (Go encoders write
// fields in number order: ID, metadata, image, state, creation time, then
// the maps); the caller checks the item's whole length. An
// encoder that writes the state after a map is hashed in full, maps left
// out. Malformed bytes hash as far as they can be read.
func itemKey(seed maphash.Seed, b []byte, maps mapFields) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	hashing := false // h holds bytes: the state came after a map
	idSeen, stateSeen := false, false
	run := 0 // start of the bytes not hashed yet
	for off := 0; off < len(b); {
		var num protowire.Number
		var typ protowire.Type
		var n, m int
		if t, l := b[off], 0; t < 0x80 && t&7 == byte(protowire.BytesType) && off+1 < len(b) && b[off+1] < 0x80 {
			// The common case, read inline: a one-byte tag of a
			// length-delimited field shorter than 128 bytes (every map
			// entry, most strings).
			l = int(b[off+1])
			num, typ, n, m = protowire.Number(t>>3), protowire.BytesType, 1, 1+l
			if off+n+m > len(b) {
				break
			}
		} else {
			num, typ, n = protowire.ConsumeTag(b[off:])
			if n < 0 {
				break
			}
			m = protowire.ConsumeFieldValue(num, typ, b[off+n:])
			if m < 0 {
				break
			}
		}
		switch {
		case typ == protowire.BytesType && (num == maps.labels || num == maps.annotations):
			if idSeen && stateSeen && !hashing {
				// The common case: one contiguous run, hashed in one
				// call (the same sum as writing it to h).
				return maphash.Bytes(seed, b[run:off])
			}
			h.Write(b[run:off])
			hashing = true
			if idSeen && stateSeen {
				return h.Sum64()
			}
			run = off + n + m
		case typ == protowire.BytesType && num == fieldSandboxID: // the same number for containers
			idSeen = true
		case typ == protowire.VarintType && num == maps.state:
			stateSeen = true
		}
		off += n + m
	}
	h.Write(b[run:])
	return h.Sum64()
}

// add notes it, just decoded from b, for the next listing.
func (m *itemMemo) add(h uint64, b []byte, it *listed) {
	m.items.put(h, itemSlot{it: it, size: uint32(len(b)), seen: m.gen})
	m.added = append(m.added, it)
	m.decoded++
}

// commit makes the listing just decoded the previous one: the items it did
// not have go, those decoded since the last commit are committed.
func (m *itemMemo) commit() {
	for _, it := range m.added {
		it.committed = true
	}
	clear(m.added)
	if cap(m.added) > 1024 {
		m.added = nil // the first listing's, or a big change's: not kept
	} else {
		m.added = m.added[:0]
	}
	if m.found+m.decoded == m.items.len() {
		return // every entry was seen: the steady state
	}
	m.items.sweep(m.gen)
}

// init starts decoding a listing.
func (m *itemMemo) init() {
	m.gen++
	m.decoded, m.found, m.repeats = 0, 0, 0
	m.uncommitted = len(m.added) > 0
}

// begin starts a listing with the memo; the caller holds m.mu.
func (m *memo) begin() {
	if m.pods == nil {
		m.seed = maphash.MakeSeed()
		m.pods, m.next = map[string]memoPod{}, map[string]memoPod{}
	}
	m.sandboxes.init()
	m.containers.init()
}

// unchanged reports whether the listing just decoded, of sbs sandboxes and
// cts containers, is the last one: nothing was decoded, every item of the
// last listing was found, none twice, and there are as many.
func (m *memo) unchanged(sbs, cts int) bool {
	return m.last != nil && m.sandboxes.decoded == 0 && m.containers.decoded == 0 &&
		m.sandboxes.repeats == 0 && m.containers.repeats == 0 &&
		m.sandboxes.found == m.sandboxes.items.len() && m.containers.found == m.containers.items.len() &&
		sbs == m.lastSbs && cts == m.lastCts
}

// keep records the listing just grouped, pods, as the last one.
func (m *memo) keep(pods []*cruntime.Pod, sbs, cts int) {
	m.last = append(m.last[:0], pods...)
	m.lastSbs, m.lastCts = sbs, cts
}

// commit keeps the listing just grouped for the next one.
func (m *memo) commit() {
	m.sandboxes.commit()
	m.containers.commit()
	m.pods, m.next = m.next, m.pods
	clear(m.next)
}

package cri

import (
	"encoding/binary"
	"hash/maphash"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/podlifecycle/pleg/runtime"
)

// A relist lists a node that mostly did not change since the last second.
// The memo of the last unfiltered listing makes such a listing cost one pass
// over the reply bytes:
//
//   - An item (a sandbox or container of a list reply) whose bytes are those
//     of an item of the previous listing is not decoded: its decoded form is
//     taken from the memo. Items are matched by a hash of their bytes,
//     confirmed by their length and their ID, so a wrong match needs two
//     versions of one item, of the same length, whose 64-bit hashes collide.
//     The entries of label and annotation maps are hashed as a set, since
//     runtimes encode them in random order.
//   - A pod whose items were all matched, and as many as last time, is the
//     previous listing's *runtime.Pod itself: nothing is built for it, and
//     the generator sees the same pointer (its diff is a comparison).
//   - The maps and scratch space are kept from one listing to the next and
//     cleared, not reallocated.
//
// Only what changed is decoded and allocated. What the memo holds is
// proportional to the listing: one entry per item and one per pod; the
// items' strings and the pods are shared with the generator's records.
type memo struct {
	mu         sync.Mutex // held for a whole listing; a concurrent listing goes without
	seed       maphash.Seed
	sandboxes  itemMemo
	containers itemMemo
	pods, next map[string]memoPod // by pod UID: last listing's, and the one being built
	scratch    groupScratch
	strings    interner
}

// itemMemo maps the hash of an item's bytes to its decoded form, for the
// previous listing (prev) and the one being decoded (next).
type itemMemo struct {
	prev, next map[uint64]memoItem
	decoded    int // items the listing being decoded did not find, and decoded
}

type memoItem struct {
	it   listed
	size int // length of the item's bytes
}

type memoPod struct {
	pod   *runtime.Pod
	items int // sandboxes and containers
}

// lookup returns the decoded form of the item b if the previous listing had
// it, and notes it for the next listing. maps says which field numbers of
// the item are maps.
func (m *itemMemo) lookup(seed maphash.Seed, b []byte, maps mapFields) (listed, uint64, bool) {
	h, id := itemKey(seed, b, maps)
	if e, ok := m.prev[h]; ok && e.size == len(b) && string(id) == e.it.id {
		m.next[h] = e
		e.it.reused = true
		return e.it, h, true
	}
	return listed{}, h, false
}

// mapFields are the field numbers of an item's label and annotation maps.
type mapFields struct{ labels, annotations protowire.Number }

var (
	sandboxMaps   = mapFields{labels: fieldSandboxLabels, annotations: fieldSandboxAnnotations}
	containerMaps = mapFields{labels: fieldContainerLabels, annotations: fieldContainerAnnotations}
)

// itemKey hashes an encoded item and returns its ID (field 1). A map's
// entries may be encoded in any order (Go's protobuf encoder follows map
// iteration, which is random), so the entries of the label and annotation
// maps are hashed as a set: each alone, summed. Everything else is hashed
// in order. Malformed bytes hash as far as they can be read.
func itemKey(seed maphash.Seed, b []byte, maps mapFields) (uint64, []byte) {
	var h maphash.Hash
	h.SetSeed(seed)
	var set uint64
	var id []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			break
		}
		field := b[:n+m]
		switch {
		case typ == protowire.BytesType && (num == maps.labels || num == maps.annotations):
			set += maphash.Bytes(seed, field)
		default:
			if num == fieldSandboxID && typ == protowire.BytesType && id == nil { // same number for containers
				id, _ = protowire.ConsumeBytes(b[n:])
			}
			h.Write(field)
		}
		b = b[n+m:]
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], set)
	h.Write(buf[:])
	return h.Sum64(), id
}

// add notes a freshly decoded item for the next listing.
func (m *itemMemo) add(h uint64, b []byte, it listed) {
	m.next[h] = memoItem{it: it, size: len(b)}
	m.decoded++
}

// commit makes the listing just decoded the previous one.
func (m *itemMemo) commit() {
	m.prev, m.next = m.next, m.prev
	clear(m.next)
}

// abort forgets a listing that failed half way.
func (m *itemMemo) abort() { clear(m.next) }

func (m *itemMemo) init() {
	if m.prev == nil {
		m.prev, m.next = map[uint64]memoItem{}, map[uint64]memoItem{}
	}
	m.decoded = 0
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

// commit keeps the listing just grouped for the next one.
func (m *memo) commit() {
	m.sandboxes.commit()
	m.containers.commit()
	m.pods, m.next = m.next, m.pods
	clear(m.next)
}

// abort forgets a listing that failed.
func (m *memo) abort() {
	m.sandboxes.abort()
	m.containers.abort()
	clear(m.next)
}

package cri

// itemTable is the memo's index from the hash of an item's bytes to the
// item decoded from them, with the length that confirms a match and the
// last listing that saw it. A Go map: an open-addressing table of its own
// (commit fc80a72) made the decode benchmark faster but nothing `pleg
// bench` can tell end to end (docs/performance.md), so it went.
type itemTable struct {
	m map[uint64]*itemSlot
}

type itemSlot struct {
	it   *listed
	size uint32 // length of the item's bytes
	seen uint32 // the last listing that had it (a listing counter, wrapping)
}

// len returns the number of entries.
func (t *itemTable) len() int { return len(t.m) }

// find returns the entry of hash h, or nil.
func (t *itemTable) find(h uint64) *itemSlot { return t.m[h] }

// put stores s as the entry of hash h, replacing any.
func (t *itemTable) put(h uint64, s itemSlot) {
	if t.m == nil {
		t.m = make(map[uint64]*itemSlot)
	}
	if p := t.m[h]; p != nil {
		*p = s
		return
	}
	t.m[h] = &s
}

// sweep removes the entries not seen by listing gen.
func (t *itemTable) sweep(gen uint32) {
	for h, s := range t.m {
		if s.seen != gen {
			delete(t.m, h)
		}
	}
}

package cri

// itemTable is the memo's index from the hash of an item's bytes to the
// item decoded from them. A lookup of an unchanged listing is one probe
// per item of a table the reply's megabytes have just pushed out of the
// CPU caches, so a slot holds all a lookup reads (the hash, the length it
// confirms, the listing that last saw it) beside the item's pointer: a
// hit reads one slot and touches no item. Open addressing with linear
// probing, at most three quarters full; deletion shifts the rest of the
// run back, so no slot is ever a tombstone.
type itemTable struct {
	slots []itemSlot // a power of two long, or empty
	n     int        // slots in use
}

type itemSlot struct {
	h    uint64
	it   *listed // nil: the slot is free
	size uint32  // length of the item's bytes
	seen uint32  // the last listing that had it (a listing counter, wrapping)
}

// find returns the slot of hash h, or nil.
func (t *itemTable) find(h uint64) *itemSlot {
	if t.n == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.it == nil {
			return nil
		}
		if s.h == h {
			return s
		}
	}
}

// put stores s, replacing the slot of the same hash if there is one.
func (t *itemTable) put(s itemSlot) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	for i := s.h & mask; ; i = (i + 1) & mask {
		p := &t.slots[i]
		if p.it == nil {
			*p = s
			t.n++
			return
		}
		if p.h == s.h {
			*p = s
			return
		}
	}
}

func (t *itemTable) grow() {
	old := t.slots
	t.slots = make([]itemSlot, max(64, 2*len(old)))
	t.n = 0
	for _, s := range old {
		if s.it != nil {
			t.put(s)
		}
	}
}

// sweep removes the slots not seen by listing gen.
func (t *itemTable) sweep(gen uint32) {
	for i := 0; i < len(t.slots); {
		if s := &t.slots[i]; s.it != nil && s.seen != gen {
			// The run after i shifts back, possibly into i: look at it
			// again. (A slot shifted from the table's start into its
			// end was looked at already, and kept.)
			t.removeAt(i)
			continue
		}
		i++
	}
}

// removeAt frees slot i and shifts back the slots of its run that would
// no longer be found past the hole.
func (t *itemTable) removeAt(i int) {
	mask := len(t.slots) - 1
	t.slots[i] = itemSlot{}
	t.n--
	for j := (i + 1) & mask; t.slots[j].it != nil; j = (j + 1) & mask {
		home := int(t.slots[j].h) & mask
		// The slot at j stays if its home lies cyclically in (i, j].
		if (i < j && i < home && home <= j) || (j < i && (i < home || home <= j)) {
			continue
		}
		t.slots[i], t.slots[j] = t.slots[j], itemSlot{}
		i = j
	}
}

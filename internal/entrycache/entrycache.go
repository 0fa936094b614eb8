// Package entrycache keeps the encoded form of recent journal entries, so
// that every subscriber that sends the same entry (the gRPC Watch and the
// SSE /api/v1/events streams) sends the same bytes, encoded once per entry
// rather than once per subscriber.
package entrycache

import "sync"

// Cache holds the encodings of the last entries of one journal, keyed by
// sequence number and whether containers' identities are included: size
// of each (subscribers read near the journal's head, so one that sends an
// entry finds it encoded by the first that did; one further behind than
// size encodes it again). It holds up to 2 x size encodings for as long
// as it lives: size bounds its memory.
type Cache[T any] struct {
	// mu is held while encoding: the subscribers that want the same entry
	// at once wait for the first one's encoding instead of repeating it.
	mu    sync.Mutex
	slots [2][]slot[T]
}

// New returns a cache of the last size entries' encodings.
func New[T any](size int) *Cache[T] {
	return &Cache[T]{slots: [2][]slot[T]{make([]slot[T], size), make([]slot[T], size)}}
}

type slot[T any] struct {
	seq uint64 // 0: empty (sequence numbers start at 1)
	v   T
}

// Get returns the encoding of entry seq (with identities or not), calling
// encode the first time; an encoding encode refuses (false) is not kept.
func (c *Cache[T]) Get(seq uint64, identity bool, encode func() (T, bool)) (T, bool) {
	side := 0
	if identity {
		side = 1
	}
	slots := c.slots[side]
	s := &slots[seq%uint64(len(slots))]
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.seq == seq && seq != 0 {
		return s.v, true
	}
	v, ok := encode()
	if ok {
		s.seq, s.v = seq, v
	}
	return v, ok
}

package pleg

import "sync"

// statsRing keeps the most recent relists.
type statsRing struct {
	mu   sync.Mutex
	buf  []RelistStat
	next int
	full bool
}

const statsKept = 300

func (r *statsRing) add(s RelistStat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buf == nil {
		r.buf = make([]RelistStat, statsKept)
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *statsRing) list() []RelistStat {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]RelistStat(nil), r.buf[:r.next]...)
	}
	out := make([]RelistStat, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// RecentRelists returns the last global relists (at most 300), oldest
// first, including failed ones.
func (g *Generator) RecentRelists() []RelistStat { return g.stats.list() }

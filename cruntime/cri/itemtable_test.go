package cri

import (
	"math/rand/v2"
	"testing"
)

// TestItemTable steps the table and a Go map through random puts, finds
// and sweeps, with hashes crowded into a few home slots at the end of the
// table so that runs wrap around it, and checks they always hold the same.
func TestItemTable(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var tb itemTable
		model := map[uint64]itemSlot{}
		gen := uint32(1)
		hash := func() uint64 {
			// Homes 60 to 67: in the table's first 64 slots, runs
			// that wrap around its end; high bits tell the hashes
			// apart.
			return uint64(60+rng.IntN(8)) + uint64(rng.IntN(400))<<20
		}
		for step := range 3000 {
			switch op := rng.IntN(10); {
			case op < 5:
				s := itemSlot{h: hash(), it: &listed{id: "x"}, size: uint32(rng.IntN(100)), seen: gen}
				tb.put(s)
				model[s.h] = s
			case op < 9:
				h := hash()
				got, want := tb.find(h), model[h]
				if (got == nil) != (want.it == nil) || got != nil && *got != want {
					t.Fatalf("seed %d step %d: find(%#x) = %+v, want %+v", seed, step, h, got, want)
				}
				if got != nil && rng.IntN(2) == 0 {
					got.seen = gen + 1 // seen by the next listing
					w := model[h]
					w.seen = gen + 1
					model[h] = w
				}
			default:
				gen++
				tb.sweep(gen)
				for h, s := range model {
					if s.seen != gen {
						delete(model, h)
					}
				}
				// What the sweep kept and moved can still be found.
				for h, want := range model {
					if got := tb.find(h); got == nil || *got != want {
						t.Fatalf("seed %d step %d: after a sweep find(%#x) = %+v, want %+v", seed, step, h, got, want)
					}
				}
			}
			if tb.n != len(model) {
				t.Fatalf("seed %d step %d: %d slots in use, the model has %d", seed, step, tb.n, len(model))
			}
		}
		for h, want := range model {
			if got := tb.find(h); got == nil || *got != want {
				t.Fatalf("seed %d: find(%#x) = %+v at the end, want %+v", seed, h, got, want)
			}
		}
	}
}

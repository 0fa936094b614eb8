package cri

import "testing"

func TestBufferPool(t *testing.T) {
	var p bufferPool
	for _, n := range []int{0, 1, 255, 256, 257, 16 << 10, 1 << 20, 1<<20 + 1, 5 << 20} {
		bp := p.Get(n)
		if len(*bp) != n {
			t.Fatalf("Get(%d): length %d", n, len(*bp))
		}
		if n > 0 && n <= 1<<20 && cap(*bp)&(cap(*bp)-1) != 0 {
			t.Fatalf("Get(%d): capacity %d is no tier", n, cap(*bp))
		}
		p.Put(bp)
	}
	// A buffer comes back from its tier, whatever length was asked.
	bp := p.Get(3000)
	(*bp)[0] = 7
	p.Put(bp)
	for range 100 { // sync.Pool may drop it; it must never return a short one
		got := p.Get(4096)
		if len(*got) != 4096 || cap(*got) < 4096 {
			t.Fatalf("Get(4096): len %d cap %d", len(*got), cap(*got))
		}
		p.Put(got)
	}
	// Foreign buffers are not pooled.
	odd := make([]byte, 1000)
	p.Put(&odd)
	if got := p.Get(1000); cap(*got) == 1000 {
		t.Fatal("a buffer of no tier came back")
	}
}

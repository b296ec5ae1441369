package memory

import (
	"math/rand/v2"
	"testing"
)

// TestTableMatchesMap drives a table and a Go map with the same random
// inserts, updates, deletes and sweeps, over digests crafted to share few
// home slots so that probe runs are long and wrap around the end, and checks
// after every operation that both hold the same entries.
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tb table[int64]
	ref := map[keyHash]int64{}
	digest := func() keyHash {
		k := rng.Uint64N(300)
		// Home slots cluster on a few values, near the end of the table.
		return keyHash{a: k<<1 | 1, b: ^uint64(0) - rng.Uint64N(4) - k<<40}
	}
	for op := range 8000 {
		h := digest()
		i := tb.find(h)
		if _, ok := ref[h]; ok != (i >= 0) {
			t.Fatalf("op %d: find(%v) = %d, map has it: %v", op, h, i, ok)
		}
		switch x := rng.IntN(10); {
		case x < 5 && i < 0:
			v := rng.Int64N(1000)
			tb.insert(h, v)
			ref[h] = v
		case x < 5:
			tb.slots[i].v++
			ref[h]++
		case x < 9 && i >= 0:
			tb.deleteAt(i)
			delete(ref, h)
		case x == 9:
			cut := rng.Int64N(1000)
			removed, next := tb.sweep(cut, func(v *int64) int64 { return *v })
			wantNext := int64(1 << 62)
			n := 0
			for k, v := range ref {
				if v <= cut {
					delete(ref, k)
					n++
				} else {
					wantNext = min(wantNext, v)
				}
			}
			if removed != n || (len(ref) > 0 && next != wantNext) {
				t.Fatalf("op %d: sweep(%d) = %d, %d; want %d, %d", op, cut, removed, next, n, wantNext)
			}
		}
		if tb.n != len(ref) {
			t.Fatalf("op %d: table holds %d, map %d", op, tb.n, len(ref))
		}
		for k, v := range ref {
			if j := tb.find(k); j < 0 || tb.slots[j].v != v {
				t.Fatalf("op %d: %v lost or wrong (index %d)", op, k, j)
			}
		}
	}
}

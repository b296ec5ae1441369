package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestTableMatchesMap drives a table and a Go map with the same random
// inserts, updates, deletes and sweeps, over digests crafted to share few
// home slots so that probe runs are long and wrap around the end, and checks
// after every operation that both hold the same entries.
func TestTableMatchesMap(t *testing.T) {
	for _, most := range []int{0, 101} { // powers of two; then 101, 202, 404 slots
		t.Run(fmt.Sprint("most=", most), func(t *testing.T) { tableMatchesMap(t, most) })
	}
}

func tableMatchesMap(t *testing.T, most int) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := table[int64]{most: most}
	sizes := map[int]bool{}
	ref := map[keyHash]int64{}
	digest := func() keyHash {
		k := rng.Uint64N(300)
		// Home slots cluster on a few values in the last eighth of the
		// table, whatever its size.
		return keyHash{a: k<<1 | 1, b: k<<40 | (1<<32 - 1 - rng.Uint64N(8)<<26)}
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
		sizes[len(tb.slots)] = true
		if tb.n != len(ref) {
			t.Fatalf("op %d: table holds %d, map %d", op, tb.n, len(ref))
		}
		for k, v := range ref {
			if j := tb.find(k); j < 0 || tb.slots[j].v != v {
				t.Fatalf("op %d: %v lost or wrong (index %d)", op, k, j)
			}
		}
	}
	if most > 0 && (!sizes[101] || !sizes[202]) {
		t.Errorf("table sizes %v: growth did not stop at %d, then double", sizes, most)
	}
}

// A shard's tables stop growing at the size its key bound needs, 4/5 full
// at the bound, short of the next power of two.
func TestTablesStopGrowingAtTheBound(t *testing.T) {
	s, _ := newTestStore(t, WithMaxKeys(100))
	for i := range 100 {
		decide(t, s, backend.Request{Key: fmt.Sprint("k", i), Algorithm: backend.GCRA, Limit: 10, Period: time.Hour, Cost: 1})
	}
	sh := &s.shards[0]
	if got, want := len(sh.gcra.slots), 125; sh.gcra.n != 100 || got != want {
		t.Errorf("%d keys in %d slots, want 100 in %d", sh.gcra.n, got, want)
	}
}

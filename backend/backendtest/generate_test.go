package backendtest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// TestGeneratedStampsWereReturned replays generated sequences on the
// model: every stamp a request carries was returned earlier in its
// sequence by an admission on the same key under the same rule, as a
// caller settling its reservation holds it; and the sequences do stamp
// refunds and step the clock back, often enough to matter.
func TestGeneratedStampsWereReturned(t *testing.T) {
	type rule struct {
		key   string
		alg   backend.Algorithm
		limit int64
		burst int64
		per   int64
	}
	ruleOf := func(r backend.Request) rule {
		return rule{r.Key, r.Algorithm, r.Limit, r.Burst, int64(r.Period)}
	}
	keys := Differential{}.keys()
	stamped, backs := 0, 0
	for seed := range uint64(500) {
		seq := generate(rand.New(rand.NewPCG(seed, 0x5eed)), keys)
		m := model.New()
		held := map[rule]map[int64]bool{}
		for i, st := range seq {
			if i > 0 && st.At < seq[i-1].At {
				backs++
			}
			if st.Reset != nil {
				m.Reset(st.Reset...)
				continue
			}
			for _, r := range st.Decide {
				if r.Stamp == 0 {
					continue
				}
				stamped++
				if r.Cost >= 0 || !held[ruleOf(r)][r.Stamp] {
					t.Fatalf("seed %d, step %d: %+v carries a stamp no earlier admission on its key and rule returned", seed, i, r)
				}
			}
			res, err := m.Decide(Epoch.Add(st.At).UnixMicro(), st.Decide)
			if err != nil {
				continue
			}
			for j, out := range res {
				if out.Stamp != 0 {
					k := ruleOf(st.Decide[j])
					if held[k] == nil {
						held[k] = map[int64]bool{}
					}
					held[k][out.Stamp] = true
				}
			}
		}
	}
	if stamped < 500 || backs < 100 {
		t.Errorf("500 sequences hold %d stamped refunds and %d steps back of the clock, want at least 500 and 100", stamped, backs)
	}
	t.Logf("500 sequences: %d stamped refunds, %d steps back", stamped, backs)
}

// TestGeneratedOnceNotRevived_Regression: seed 717 sent a settlement's Once
// again at 3.8 s after it was first sent at 1426 s and the clock had been at
// 5195 s, well past its record's lapse. The model still held the record (it
// never drops one) and answered a peek; Postgres had dropped it at the key's
// next settlement, as it may, and applied it again. Whether a clock stepped
// back finds a lapsed record again is the backend's, so no sequence may ask:
// a repeat comes before the clock reaches its record's lapse, or after.
func TestGeneratedOnceNotRevived_Regression(t *testing.T) {
	keys := Differential{}.keys()
	repeats := 0
	for seed := range uint64(1500) {
		seq := generate(rand.New(rand.NewPCG(seed, 0x5eed)), keys)
		first := map[int64]time.Duration{} // Once → when first sent
		kept := map[int64]time.Duration{}  // Once → how long its ticket or record lasts
		var hi time.Duration
		for i, st := range seq {
			if st.Reset == nil {
				hi = max(hi, st.At) // a Reset leaves records alone
			}
			for _, r := range st.Decide {
				if r.Once == 0 {
					continue
				}
				at, ok := first[r.Once]
				if !ok {
					first[r.Once], kept[r.Once] = st.At, keptFor(r)
					continue
				}
				repeats++
				lapse := at + kept[r.Once]
				if st.At < lapse && hi >= lapse {
					t.Fatalf("seed %d, step %d at %v: Once %d (first sent at %v) sent again before its ticket's or record's lapse at %v, after the clock was at %v",
						seed, i, st.At, r.Once, at, lapse, hi)
				}
			}
		}
	}
	if repeats < 100 {
		t.Fatalf("only %d settlements were sent again: the test proves little", repeats)
	}
}

package backendtest

import (
	"math/rand/v2"
	"testing"

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

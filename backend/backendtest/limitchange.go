package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testLimitChange pins ALGORITHMS.md's "A limit that changes" on one key
// at one instant: 3 units taken under 4 per second, then requests under
// 2 (lowered: the 3 units held are over it), 8 (raised: at once) and 4
// again. GCRA's debt is read as units, not as µs of the new rate: under
// 8 per second (T = 125ms) the 3 units written at T = 250ms leave
// remaining 8 - 3 - 1 = 4, where reading 750ms of debt at 125ms a unit
// would leave 1; back under 4, the 4 units held at 125ms leave retry
// d - (B - c)*Ts = 500ms - 3*125ms.
func (s *suite) testLimitChange(t *testing.T) {
	steps := []struct {
		limit, cost, rem int64
		ok               bool
	}{
		{4, 3, 1, true},
		{2, 1, 0, false}, // lowered below what the key holds
		{8, 1, 4, true},  // raised: takes effect at once
		{4, 1, 0, false}, // lowered again: 4 held
		{4, 0, 0, true},  // a peek agrees
		{1_000, 996, 0, true},
	}
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			e := s.env(t)
			key := e.key("k")
			for i, st := range steps {
				got := e.one(req(key, alg, st.limit, time.Second, st.cost))
				label := fmt.Sprintf("step %d (limit %d, cost %d)", i, st.limit, st.cost)
				if got.Allowed != st.ok || got.Remaining != st.rem || got.Limit != st.limit {
					t.Fatalf("%s: %+v, want allowed %v remaining %d", label, got, st.ok, st.rem)
				}
				if alg == backend.GCRA && i == 3 {
					if got, want := got.RetryAfter, 125*time.Millisecond; got != want {
						t.Errorf("%s: RetryAfter %v, want %v", label, got, want)
					}
				}
			}
		})
	}
}

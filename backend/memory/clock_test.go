package memory

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestHotKeyReadsTheClockUnderItsLock_Regression: 8 goroutines hammer one
// fixed-window key of 3 per 1 ms on the real clock, by calls of one
// request and of two (the hot key and a key of their own). A call read
// the clock before it took the shard's lock: behind calls that had since
// opened the next window it decided at an older instant, as on a clock
// stepped back, anchored the next window's count into the old window, and
// the call after it found the new window empty: 86 of 211 windows admitted
// more than 3 (up to 21). No window may admit more than its limit,
// counted by the admissions' stamps (their instants). The real clock,
// not an injected one: what is pinned is when the Store reads it.
func TestHotKeyReadsTheClockUnderItsLock_Regression(t *testing.T) {
	const P, L = 1000, 3 // µs, units
	for _, several := range []bool{false, true} {
		s := New()
		hot := backend.Request{Key: "hot", Algorithm: backend.FixedWindow, Limit: L, Period: P * time.Microsecond, Cost: 1}
		var mu sync.Mutex
		per := map[int64]int{} // window start → admissions
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				reqs := []backend.Request{hot}
				if several {
					own := hot
					own.Key, own.Limit = fmt.Sprintf("own%d", g), backend.MaxLimit
					reqs = append(reqs, own)
				}
				res := make([]backend.Result, len(reqs))
				local := map[int64]int{}
				for range 100_000 {
					if err := s.DecideInto(context.Background(), reqs, res); err != nil {
						t.Error(err)
						return
					}
					if res[0].Allowed {
						local[res[0].Stamp-res[0].Stamp%P]++
					}
				}
				mu.Lock()
				for ws, n := range local {
					per[ws] += n
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		s.Close()
		over, most := 0, 0
		for _, n := range per {
			if n > L {
				over++
			}
			most = max(most, n)
		}
		if over > 0 {
			t.Errorf("several requests a call %v: %d of %d windows of %v admitted more than %d (up to %d)", several, over, len(per), P*time.Microsecond, L, most)
		}
	}
}

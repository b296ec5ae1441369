package ceiling

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// A Charge refund that passes its admission's Stamp gives back that
// admission's units, not the newest: limit 10 per minute, A takes 5 at 0 s
// with Decide, B 5 at 4–8 s, A refunds its 5 at 50 s with Charge, then C
// asks for 5 at 50 s and D for 5 from 60 s on. Charge sent no stamp, so the
// refund took B's units: 15 real units in one window.
func TestChargeRefundWithStampGivesBackItsAdmissionsUnits_Regression(t *testing.T) {
	for _, alg := range []backend.Algorithm{SlidingLog, RollingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			start := time.Unix(1_699_999_980, 0)
			clock := &fakeClock{t: start}
			store := memory.New(memory.WithClock(clock.Now))
			defer store.Close()
			l := MustNew([]Rule{{Name: "tokens", Limit: 10, Period: time.Minute, Algorithm: alg}}, WithBackend(store), withClock(clock.Now))
			defer l.Close()
			ctx := context.Background()
			set := func(at time.Duration) {
				clock.mu.Lock()
				clock.t = start.Add(at)
				clock.mu.Unlock()
			}
			take := func(at time.Duration, n int64) Decision {
				set(at)
				d, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: n})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			a := take(0, 5)
			if !a.Allowed {
				t.Fatal("A refused")
			}
			var uses []use // A used none of its 5
			for _, at := range steps(4*time.Second, time.Second, 5) {
				if !take(at, 1).Allowed {
					t.Fatalf("B refused at %v", at)
				}
				uses = append(uses, use{at, 1})
			}
			set(50 * time.Second)
			if err := l.Charge(ctx, Input{Rule: "tokens", Key: "acme", Cost: -5, Stamp: a.Results[0].Stamp}); err != nil {
				t.Fatal(err)
			}
			if take(50*time.Second, 5).Allowed {
				uses = append(uses, use{50 * time.Second, 5})
			}
			for s := 60; s <= 70; s++ {
				if at := time.Duration(s) * time.Second; take(at, 5).Allowed {
					uses = append(uses, use{at, 5})
					break
				}
			}
			if n, end := mostInAWindow(uses, time.Minute, false); n > 10 {
				t.Errorf("%d real units in the minute ending at %v, limit 10; uses %v", n, end, uses)
			}
		})
	}
}

package postgres

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// TestGCRARefundAfterClockStepBack_Regression: found by the random
// differential (seed 15830631718794272364, sequence 1178), shrunk. GCRA, 1
// per 1.5 ms: A reserves 1 with ticket X, B 60 s later with ticket Y (that
// call's "lapsed" delete drops X, expired by then), the clock steps back
// 38 minutes, to before A's reservation, and A's refund with X comes. The
// model, memory and Redis still hold X (it expires after the stepped-back
// now) and apply the refund: the key is back to full. Postgres deleted X
// when it lapsed and answers the refund as a peek (Remaining 0). The
// backends disagree on a clock stepped back past a ticket's expiry;
// Postgres's answer gives back nothing, so it is never weaker.
func TestGCRARefundAfterClockStepBack_Regression(t *testing.T) {
	t.Skip("defect: Postgres deletes lapsed tickets that the model, memory and Redis revive when the clock steps back; a refund then disagrees (Postgres gives nothing back)")
	differential(migrated(t)).Replay(t, []backendtest.Step{
		{At: 6057420039760 * time.Microsecond, Decide: []backend.Request{
			{Key: "d", Algorithm: backend.GCRA, Limit: 1, Period: 1500 * time.Microsecond, Cost: 1, Once: 31961270045},
		}},
		{At: 6057479999999 * time.Microsecond, Decide: []backend.Request{
			{Key: "d", Algorithm: backend.GCRA, Limit: 1, Period: 1500 * time.Microsecond, Cost: 1, Once: 192649533243},
		}},
		{At: 6055199999999 * time.Microsecond, Decide: []backend.Request{
			{Key: "d", Algorithm: backend.GCRA, Limit: 1, Period: 1500 * time.Microsecond, Cost: -1, Once: 31961270045},
		}},
	})
}

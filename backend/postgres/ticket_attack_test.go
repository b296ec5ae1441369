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
// Postgres's answer gives back nothing, so it is never weaker. The second
// case (seed 876140889513705853) is a forced charge's record: swept when
// lapsed by a call on another key that peeked this one, then the clock
// steps back and the charge's repeat is applied again on Postgres (a
// second charge) where the model answers it as a peek.
func TestGCRARefundAfterClockStepBack_Regression(t *testing.T) {
	t.Skip("defect: Postgres deletes lapsed tickets that the model, memory and Redis revive when the clock steps back; a refund then disagrees (Postgres gives nothing back), as does a forced charge (Postgres applies it again)")
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
	differential(migrated(t)).Replay(t, []backendtest.Step{
		{At: 1507 * time.Millisecond, Decide: []backend.Request{
			{Key: "c", Algorithm: backend.SlidingLog, Limit: 1, Period: 7 * time.Millisecond, Cost: 1, Force: true, Once: 784326099041},
		}},
		{At: 1878351 * time.Microsecond, Decide: []backend.Request{
			{Key: "a", Algorithm: backend.RollingWindow, Limit: 1, Period: 1001 * time.Microsecond, Cost: 1, Once: 140431291255},
			{Key: "c", Algorithm: backend.SlidingLog, Limit: 1, Period: 7 * time.Millisecond, Cost: 0},
		}},
		{At: 0, Decide: []backend.Request{
			{Key: "c", Algorithm: backend.SlidingLog, Limit: 1, Period: 7 * time.Millisecond, Cost: 1, Force: true, Once: 784326099041},
		}},
	})
}

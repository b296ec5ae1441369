package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// TestClusterUndoKeepsStandingTicket_Regression: found by the random
// differential on Cluster (seed 1170035301977548839), shrunk. A reserves
// 1 on {y}c with ticket X. A call spanning two slots sends the same
// reservation again (X) beside a request on {x}a that never fits: the call
// is rejected, and the undo of {y}c must put X back as it stood before the
// call. It used to delete "the tickets it wrote", X among them, so A's
// refund with X found no ticket and gave back nothing, where the model (a
// rejected call writes and consumes nothing, ALGORITHMS.md) and
// single-node Redis apply it. The second case (cluster+deny, seed
// 2454369171443101095) is the same on a fixed window.
func TestClusterUndoKeepsStandingTicket_Regression(t *testing.T) {
	clusterDifferential(t).Replay(t, []backendtest.Step{
		{At: 4024879342468 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}c", Algorithm: backend.SlidingWindow, Limit: 1, Period: 1 * time.Millisecond, Cost: 1, Once: 278218198340},
		}},
		{At: 4024879342468 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}c", Algorithm: backend.SlidingWindow, Limit: 2, Period: 1 * time.Millisecond, Cost: 1, Once: 278218198340},
			{Key: "{x}a", Algorithm: backend.SlidingWindow, Limit: 1, Period: 25 * time.Hour, Cost: 3},
		}},
		{At: 4024879343065 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}c", Algorithm: backend.SlidingWindow, Limit: 1, Period: 1 * time.Millisecond, Cost: -1, Once: 278218198340},
		}},
	})
	clusterDenyDifferential(t).Replay(t, []backendtest.Step{
		{At: 3867 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}d", Algorithm: backend.FixedWindow, Limit: 1, Period: 1 * time.Millisecond, Cost: 1, Once: 222868977903},
		}},
		{At: 3867 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}d", Algorithm: backend.FixedWindow, Limit: 3, Period: 1 * time.Millisecond, Cost: 1, Once: 222868977903},
			{Key: "{x}b", Algorithm: backend.SlidingLog, Limit: 1, Period: 1500 * time.Microsecond, Cost: 3},
		}},
		{At: 3867 * time.Microsecond, Decide: []backend.Request{
			{Key: "{y}d", Algorithm: backend.FixedWindow, Limit: 1, Period: 1 * time.Millisecond, Cost: -1, Once: 222868977903},
		}},
	})
}

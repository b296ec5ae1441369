package memory

import "testing"

// TestConcurrentTicketsSettleOnce_Attack races reservations, refunds and
// forced charges with a Once on 8 goroutines, with repeats, and compares
// each key with the model (backendtest.ConcurrentTickets).
func TestConcurrentTicketsSettleOnce_Attack(t *testing.T) {
	differential(t).ConcurrentTickets(t, 8, 20, 100)
}

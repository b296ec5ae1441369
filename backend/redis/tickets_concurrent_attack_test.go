package redis

import "testing"

// TestConcurrentTicketsSettleOnce_Attack races reservations, refunds and
// forced charges with a Once on 8 goroutines, with repeats, and compares
// each key with the model (backendtest.ConcurrentTickets), on one server
// and on a Cluster, where rejected calls span slots and are undone.
func TestConcurrentTicketsSettleOnce_Attack(t *testing.T) {
	t.Run("redis", func(t *testing.T) { singleDifferential(t).ConcurrentTickets(t, 8, 10, 40) })
	t.Run("cluster", func(t *testing.T) { clusterDifferential(t).ConcurrentTickets(t, 8, 20, 40) })
}

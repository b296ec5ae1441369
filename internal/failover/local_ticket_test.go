package failover

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// A reservation that FailLocal admits while the backend is down carries a
// Once for its ticket on the backend (it was to be settled there). The
// local store needs none, and the recovery charge of what it admitted is
// a charge of its own: kept in the journal, the Once made the journal's
// peek of the local store an invalid request (a Once on a peek), failing
// every recovery charge, and would have named every recovery charge of
// the key by the same settlement, a repeat the backend would not apply.
func TestRecoveryChargeOfATicketedReservation(t *testing.T) {
	lc := &Local{Share: 1}
	defer lc.Close()
	global := backend.Request{Key: "k", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 99}
	reqs := []backend.Request{Scaled(global, lc.Share)}
	out := make([]backend.Result, 1)
	if err := lc.Decide(context.Background(), time.Now(), reqs, make([]time.Duration, 1), out, []backend.Request{global}, []int{0}); err != nil || !out[0].Allowed {
		t.Fatalf("the local admission: %+v, %v", out, err)
	}
	var sent []backend.Request
	n, units, err := lc.Charge(context.Background(), func(reqs []backend.Request) error {
		sent = append(sent, reqs...)
		return nil
	})
	if err != nil || n != 1 || units != 3 {
		t.Fatalf("the recovery charge: %d keys, %d units, %v; want 1 key, 3 units", n, units, err)
	}
	if q := sent[0]; q.Once != 0 || !q.Force || q.Cost != 3 || q.Validate() != nil {
		t.Errorf("the recovery charge sent %+v; want a valid forced charge of 3 with no Once", q)
	}
}

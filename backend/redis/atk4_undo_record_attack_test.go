package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestClusterInvertedChargeAndReservationKeepTheChargesRecord_Attack: one
// cross-slot call carries a forced charge with Once X and a reservation
// with X on one key (no entry before), and another slot rejects it; another
// client writes the key before the undo, so it is inverted. The charge
// stays applied (refund: "a settlement stays applied, so that a repeat is
// a no-op"), but the reservation's ticket replaced the charge's record when
// the call ended, and the reservation's inverse, a refund with X, consumes
// that ticket: no record is left. The caller, told the call was rejected,
// resends the charge, which is applied a second time. The model (a
// rejected call consumes nothing; the resend charges once) leaves
// 10 - 2 - 1 = 7; the user loses 2 units of quota for good (charged twice).
// The change 4e76a2f writes the record again only when it stood before the
// call, not when the call's own charge wrote it.
func TestClusterInvertedChargeAndReservationKeepTheChargesRecord_Attack(t *testing.T) {
	for _, order := range []string{"charge first", "reservation first"} {
		t.Run(order, func(t *testing.T) {
			client := redistest.SharedCluster(t).Client(t)
			clock := newFakeClock()
			s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
			reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 71}
			charge := reserve
			charge.Cost, charge.Force = 2, true
			one := reserve
			one.Cost, one.Once = 1, 0
			call := []backend.Request{charge, reserve}
			if order != "charge first" {
				call = []backend.Request{reserve, charge}
			}
			undoneAfterAnotherWrite(t, s, call, one)
			entry := onceEntry(t, s, reserve)
			res := decide(t, s, charge)[0] // the charge's resend
			if got := remainingOf(t, s, reserve); got != 7 {
				t.Errorf("after the undo (once entry %q) and the charge's resend (%+v): %d remaining, want 7 (the charge's 2 once, the other client's 1)", entry, res, got)
			}
		})
	}
}

// TestClusterInvertedChargeOverTicketKeepsItsRecord_Attack: reservation X
// (3 units) was admitted; the caller's call then carries its forced charge
// with X (which consumes the ticket and is applied) and the reservation
// resent, beside a slot that rejects; the key is written by another
// client meanwhile. The charge stays applied, the resend's inverse
// consumes the ticket the resend wrote (the call's settlement consumed the
// one before), and the record is gone. The charge's resend is applied
// again: the model leaves 10 - 3 - 2 - 1 = 4, the store 2.
func TestClusterInvertedChargeOverTicketKeepsItsRecord_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 72}
	decide(t, s, reserve)
	charge := reserve
	charge.Cost, charge.Force = 2, true
	one := reserve
	one.Cost, one.Once = 1, 0
	undoneAfterAnotherWrite(t, s, []backend.Request{charge, reserve}, one)
	entry := onceEntry(t, s, reserve)
	res := decide(t, s, charge)[0]
	if got := remainingOf(t, s, reserve); got != 4 {
		t.Errorf("after the undo (once entry %q) and the charge's resend (%+v): %d remaining, want 4", entry, res, got)
	}
}

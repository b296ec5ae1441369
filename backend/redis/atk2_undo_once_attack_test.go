package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestClusterInvertedRefundAndResendOfOneOnce_Attack: one cross-slot call
// resends a refund of reservation X and a reservation with the same Once X
// on one key, beside a slot that rejects. Another client charges the key
// between the group script and the undo, so the key is inverted instead of
// put back. The refund stays applied (a settlement's repeat must then be a
// no-op), but the reservation's inverse is sent without its Once because
// the once entry it read before the call was a ticket ("-..."): the ticket
// the call's reservation wrote stands after the undo. The client, told the
// call was rejected, resends its refund, which finds that ticket and gives
// X's units back a second time. The model (a rejected call writes and
// consumes nothing) and the documented inverse (the refund stays applied,
// its repeat a no-op) both leave 5 of 10 units: the first reservation's 3
// given back once, the other client's 5 charged.
func TestClusterInvertedRefundAndResendOfOneOnce_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 44}
	first := decide(t, s, reserve)[0]
	if !first.Allowed {
		t.Fatalf("the first reservation: %+v", first)
	}
	refund := reserve
	refund.Cost, refund.Stamp = -3, first.Stamp
	five := reserve
	five.Cost, five.Once = 5, 0
	undoneAfterAnotherWrite(t, s, []backend.Request{refund, reserve}, five) // another client meanwhile: the key cannot be put back
	ticket := onceEntry(t, s, reserve)
	res := decide(t, s, refund)[0] // the resend of the refund the caller saw rejected
	if got := remainingOf(t, s, reserve); got != 5 {
		t.Errorf("after the undo and the refund's resend (%+v; ticket after the undo %q): %d remaining, want 5 (X's 3 given back once, the other client's 5 charged)", res, ticket, got)
	}
}

// TestClusterInvertedTwinReservations_Attack: two reservations with one
// Once on one key in a cross-slot call that another slot rejects, the key
// written by another client before the undo. Each is inverted by a refund
// with the Once; the first consumes the ticket, so the second finds none
// and gives nothing back: the rejected call keeps 3 units charged. A
// rejected call consumes nothing (ALGORITHMS.md), so only the other
// client's 1 unit is taken.
func TestClusterInvertedTwinReservations_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 46}
	one := reserve
	one.Cost, one.Once = 1, 0
	undoneAfterAnotherWrite(t, s, []backend.Request{reserve, reserve}, one)
	if got := remainingOf(t, s, reserve); got != 9 {
		t.Errorf("after the undo: %d remaining, want 9 (only the other client's unit taken)", got)
	}
}

// TestClusterInvertedRefundAfterResendOfOneOnce_Attack is
// TestClusterInvertedRefundAndResendOfOneOnce_Attack with the reservation
// first: the call's refund still sees the ticket that stood and consumes
// it, and the reservation's ticket is written when the call ends.
func TestClusterInvertedRefundAfterResendOfOneOnce_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 47}
	first := decide(t, s, reserve)[0]
	refund := reserve
	refund.Cost, refund.Stamp = -3, first.Stamp
	five := reserve
	five.Cost, five.Once = 5, 0
	undoneAfterAnotherWrite(t, s, []backend.Request{reserve, refund}, five)
	res := decide(t, s, refund)[0]
	if got := remainingOf(t, s, reserve); got != 5 {
		t.Errorf("after the undo and the refund's resend (%+v): %d remaining, want 5", res, got)
	}
}

// TestClusterInvertedResendOverARecordKeepsTheRecord_Attack: reservation
// X is settled by a forced charge with X, whose record stands. The
// reservation is resent in a cross-slot call that another slot rejects,
// the key written by another client before the undo. The resend replaced
// the record with a ticket (ALGORITHMS.md: a reservation replaces any
// entry), and its inverse, a refund with X, consumes that ticket. A
// rejected call consumes nothing, so the record must stand again after
// the undo: the forced charge's resend is then a peek, not 2 units
// charged twice.
func TestClusterInvertedResendOverARecordKeepsTheRecord_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 3, Once: 48}
	decide(t, s, reserve)
	charge := reserve
	charge.Cost, charge.Force = 2, true
	decide(t, s, charge) // its record stands
	one := reserve
	one.Cost, one.Once = 1, 0
	undoneAfterAnotherWrite(t, s, []backend.Request{reserve}, one)
	record := onceEntry(t, s, reserve)
	res := decide(t, s, charge)[0] // the forced charge's resend
	if got := remainingOf(t, s, reserve); got != 4 {
		t.Errorf("after the undo (record %q) and the forced charge's resend (%+v): %d remaining, want 4 (3 + 2 + the other client's 1)", record, res, got)
	}
}

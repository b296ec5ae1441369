package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Settlement identity (backend.Request.Once): a reservation with a Once
// writes a ticket, a refund with it is applied only while the ticket
// stands and consumes it, and a forced charge leaves a record; a
// settlement delivered twice, because its first reply was lost, takes
// effect once, and a repeat answers as a peek would.

// testSettleOnce is the same settlement twice refunding once (3 per
// second): A reserves 2 with a ticket and B takes 1 at the same instant,
// so A's stamp names B's unit too; A's refund of 2 sent twice with A's
// Once leaves B's unit counted. Without Once the repeat gives B's unit
// back on every algorithm (the stamped run, bucket, window or TAT is
// shared).
func (s *suite) testSettleOnce(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 2)
		reserve := r
		reserve.Once = 42
		a := e.one(reserve)
		r.Cost = 1
		if b := e.one(r); !a.Allowed || !b.Allowed || b.Remaining != 0 {
			t.Fatalf("A reserves 2, B takes 1: %+v, %+v, want both allowed and the key full", a, b)
		}
		e.at(us(100_000))
		refund := r
		refund.Cost, refund.Stamp, refund.Once = -2, a.Stamp, 42
		if got := e.one(refund); !got.Allowed || got.Remaining != 2 {
			t.Fatalf("A's refund of 2: %+v, want allowed with 2 remaining", got)
		}
		want := e.peek(r)
		for i := range 2 {
			got := e.one(refund)
			check(t, fmt.Sprintf("A's refund delivered again (%d)", i+1), got, want)
			stampIs(t, "a repeat", got, 0)
		}
		if got := e.remaining(r); got != 2 {
			t.Errorf("after the repeats: remaining %d, want 2 (B's unit still counts)", got)
		}
	})
}

// testChargeOnce is a forced charge delivered twice charging once, the
// repeat coming nearly two Periods later (the record's least life), and
// the record being the key's own: the same Once on another key is another
// settlement, and a call that is rejected records nothing. Within one call
// the second delivery is the repeat.
func (s *suite) testChargeOnce(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 1)
		charge := r
		charge.Force, charge.Once = true, 7
		e.at(us(500_000))
		if got := e.one(charge); !got.Allowed || got.Remaining != 2 {
			t.Fatalf("a forced charge of 1: %+v, want allowed with 2 remaining", got)
		}
		if got := e.one(charge); !got.Allowed || got.Remaining != 2 {
			t.Errorf("the charge delivered again: %+v, want allowed with 2 remaining", got)
		}
		e.at(us(2_400_000)) // the first charge's unit has left
		if got := e.one(charge); !got.Allowed || got.Remaining != 3 {
			t.Errorf("the charge delivered again 1.9s later: %+v, want allowed with 3 remaining", got)
		}
		other := charge
		other.Key = e.key("other")
		if got := e.one(other); !got.Allowed || got.Remaining != 2 {
			t.Errorf("the same Once on another key: %+v, want applied, 2 remaining", got)
		}
		full := req(e.key("full"), alg, 1, time.Second, 2) // never fits: the call is rejected
		next := charge
		next.Once = 8
		if got := e.decide(next, full); got[1].Allowed {
			t.Fatalf("a cost of 2 under a limit of 1: %+v, want rejected", got[1])
		}
		if got := e.remaining(r); got != 3 {
			t.Errorf("after a rejected call: remaining %d, want 3 (nothing applied)", got)
		}
		if got := e.one(next); !got.Allowed || got.Remaining != 2 {
			t.Errorf("a charge whose first call was rejected: %+v, want applied, 2 remaining", got)
		}
		twice := charge
		twice.Once = 9
		if got := e.decide(twice, twice); got[0].Remaining != 1 || got[1].Remaining != 1 {
			t.Errorf("one charge twice in a call: %+v, want it applied once, 1 remaining", got)
		}
		peek := other
		peek.Cost, peek.Force, peek.Once = 0, false, 0
		if got := e.decide(twice, peek); got[0].Remaining != 1 {
			t.Errorf("the charge again beside another key: %+v, want 1 remaining", got[0])
		}
		if got := e.remaining(r); got != 1 {
			t.Errorf("after the charge of 1 delivered three times: remaining %d, want 1", got)
		}
	})
}

// testOnceHold is a record of a long rule's settlement kept for
// backend.OnceHold and no longer: a repeat just within it is a peek, one
// at its end is a new settlement. Kept twice an hour's Period instead,
// one key's refunded settlements would pile up without bound.
func (s *suite) testOnceHold(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 10, time.Hour, 1)
		charge := r
		charge.Force, charge.Once = true, 11
		e.at(us(1_000_000))
		if got := e.one(charge); !got.Allowed || got.Remaining != 9 {
			t.Fatalf("a forced charge of 1: %+v, want allowed with 9 remaining", got)
		}
		e.at(us(1_000_000) + backend.OnceHold - time.Microsecond)
		if got := e.remaining(r); got != 9 {
			t.Fatalf("just before the record's end: remaining %d, want 9", got)
		}
		e.one(charge)
		if got := e.remaining(r); got != 9 {
			t.Errorf("the charge delivered again just within OnceHold: remaining %d, want 9 (a repeat)", got)
		}
		e.at(us(1_000_000) + backend.OnceHold)
		e.one(charge)
		if got := e.remaining(r); got != 8 {
			t.Errorf("the charge delivered again OnceHold after it was applied: remaining %d, want 8 (its record gone)", got)
		}
	})
}

// testRefundWithoutTicket is a refund whose ticket does not stand giving
// nothing back (3 per second, A reserving 2 and B 1): not its
// reservation's Once (the reservation carried none, or another), nor the
// same Once on another key, nor a ticket a rejected call would have
// written. A backend that lost its data (a restart) loses the tickets
// with the units: the refund of a reservation it no longer holds gives
// back nothing, never the units taken since.
func (s *suite) testRefundWithoutTicket(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 2)
		a := e.one(r) // no ticket
		reserve := r
		reserve.Key, reserve.Once = e.key("other"), 5 // a ticket, on another key
		o := e.one(reserve)
		full := req(e.key("full"), alg, 1, time.Second, 2) // never fits: the call is rejected
		r.Cost, r.Once = 1, 6
		if got := e.decide(r, full); got[0].Allowed && got[1].Allowed {
			t.Fatalf("a call with a cost of 2 under a limit of 1: %+v, want rejected", got)
		}
		r.Once = 0
		if b := e.one(r); !a.Allowed || !o.Allowed || !b.Allowed || b.Remaining != 0 {
			t.Fatalf("A reserves 2, B takes 1: %+v, %+v, want both allowed and the key full", a, b)
		}
		e.at(us(100_000))
		want := e.peek(r)
		for _, once := range []int64{1, 5, 6} {
			refund := r
			refund.Cost, refund.Stamp, refund.Once = -2, a.Stamp, once
			got := e.one(refund)
			check(t, fmt.Sprintf("a refund with Once %d", once), got, want)
			stampIs(t, "a refund with no ticket", got, 0)
		}
		if got := e.remaining(r); got != 0 {
			t.Errorf("after refunds with no ticket: remaining %d, want 0 (nothing given back)", got)
		}
		refund := reserve
		refund.Cost, refund.Stamp = -2, o.Stamp
		if got := e.one(refund); !got.Allowed || got.Remaining != 3 {
			t.Errorf("the refund with its ticket, on its own key: %+v, want applied, 3 remaining", got)
		}
	})
}

// testTicketsBounded is a key's tickets bounded by its reservations that
// hold units: a refund consumes its ticket and leaves nothing in its place
// (a forced charge with the same Once is then applied: no record stands),
// and a reservation that is rejected writes none. A settlement does not
// see the ticket of a reservation in its own call, which is written when
// the call ends.
func (s *suite) testTicketsBounded(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 2)
		reserve := r
		reserve.Once = 21
		a := e.one(reserve)
		refund := r
		refund.Cost, refund.Stamp, refund.Once = -2, a.Stamp, 21
		if got := e.one(refund); !a.Allowed || !got.Allowed || got.Remaining != 3 {
			t.Fatalf("A reserves 2 and refunds them: %+v, %+v, want both applied, 3 remaining", a, got)
		}
		charge := r
		charge.Cost, charge.Force, charge.Once = 1, true, 21
		if got := e.one(charge); !got.Allowed || got.Remaining != 2 {
			t.Errorf("a forced charge with the refunded Once: %+v, want applied (the refund left no record), 2 remaining", got)
		}
		reserve.Once, reserve.Cost = 22, 3 // does not fit beside the unit charged
		if got := e.one(reserve); got.Allowed {
			t.Fatalf("a reservation of 3 beside 1 unit: %+v, want rejected", got)
		}
		refund.Cost, refund.Stamp, refund.Once = -1, 0, 22
		if got := e.one(refund); !got.Allowed || got.Remaining != 2 {
			t.Errorf("a refund of a rejected reservation: %+v, want nothing given back, 2 remaining", got)
		}
		reserve.Once, reserve.Cost = 23, 1
		refund.Once = 23
		got := e.decide(reserve, refund)
		if !got[0].Allowed || got[1].Remaining != 1 {
			t.Errorf("a reservation and its refund in one call: %+v, want the reservation applied, the refund a peek: 1 remaining", got)
		}
		refund.Stamp = got[0].Stamp
		if got := e.one(refund); !got.Allowed || got.Remaining != 2 {
			t.Errorf("the refund sent again, after its reservation's call: %+v, want applied, 2 remaining", got)
		}
	})
}

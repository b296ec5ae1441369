package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// TestSettlementRecordsGo: a settlement's record (backend.Request.Once)
// goes once expired, twice its Period after it was applied: deleted by
// the next decision that records a settlement on its key, or by the
// janitor for a key that sees none.
func TestSettlementRecordsGo(t *testing.T) {
	pool := migrated(t)
	clock := backendtest.NewClock(backendtest.Epoch)
	s := New(pool, WithPrefix("settled"), WithClock(clock.Now), WithJanitor(0, 0))
	ctx := context.Background()
	charge := func(key string, once int64) {
		t.Helper()
		r := backend.Request{Key: key, Algorithm: backend.FixedWindow, Limit: 5, Period: time.Second, Cost: 1, Force: true, Once: once}
		if _, err := s.Decide(ctx, []backend.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	records := func() []string {
		t.Helper()
		var got []string
		rs, err := pool.Query(ctx, "SELECT key || ' ' || once FROM ceiling_settled WHERE key LIKE 'settled:%' ORDER BY 1")
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		for rs.Next() {
			var v string
			if err := rs.Scan(&v); err != nil {
				t.Fatal(err)
			}
			got = append(got, v)
		}
		return got
	}
	charge("a", 1)
	charge("b", 2)
	clock.Advance(3 * time.Second)
	charge("b", 3)
	if got, want := records(), []string{"settled:a 1", "settled:b 3"}; !slices.Equal(got, want) {
		t.Fatalf("records after b's second settlement %v, want %v (b's first expired)", got, want)
	}
	s.sweep(100)
	if got, want := records(), []string{"settled:b 3"}; !slices.Equal(got, want) {
		t.Fatalf("records after a sweep %v, want %v", got, want)
	}
}

// TestTicketsGo: a reservation's ticket is a row of ceiling_settled until
// its refund consumes it, on the lone path and in a call of several
// requests, so that reservations refunded in full leave no row; a ticket
// nobody settles lapses twice its Period after it was written, and the
// janitor deletes it then, not before.
func TestTicketsGo(t *testing.T) {
	pool := migrated(t)
	clock := backendtest.NewClock(backendtest.Epoch)
	s := New(pool, WithPrefix("tickets"), WithClock(clock.Now), WithJanitor(0, 0))
	ctx := context.Background()
	req := func(key string, cost, once int64) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.FixedWindow, Limit: 5, Period: time.Second, Cost: cost, Once: once}
	}
	decide := func(reqs ...backend.Request) []backend.Result {
		t.Helper()
		res, err := s.Decide(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	rows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM ceiling_settled WHERE key LIKE 'tickets:%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range int64(20) {
		a := decide(req("a", 2, 100+i))
		refund := req("a", -2, 100+i)
		refund.Stamp = a[0].Stamp
		if got := decide(refund); got[0].Remaining != 5 {
			t.Fatalf("refund %d: %+v, want 5 left", i, got[0])
		}
		b := decide(req("b", 1, 200+i), req("c", 1, 300+i))
		rb, rc := req("b", -1, 200+i), req("c", -1, 300+i)
		rb.Stamp, rc.Stamp = b[0].Stamp, b[1].Stamp
		if got := decide(rb, rc); got[0].Remaining != 5 || got[1].Remaining != 5 {
			t.Fatalf("refunds %d in one call: %+v, want 5 left on each", i, got)
		}
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d rows after 60 reservations refunded in full, want none", n)
	}
	decide(req("d", 1, 7))
	clock.Advance(2*time.Second - time.Microsecond)
	s.sweep(100)
	if n := rows(); n != 1 {
		t.Fatalf("%d rows just before the ticket lapses, want 1", n)
	}
	clock.Advance(time.Microsecond)
	s.sweep(100)
	if n := rows(); n != 0 {
		t.Errorf("%d rows once the ticket lapsed, want none", n)
	}
}

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

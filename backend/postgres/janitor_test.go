package postgres

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// rows counts the rows stored under prefix.
func rows(t *testing.T, pool *pgxpool.Pool, prefix string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM ceiling_state WHERE key LIKE $1", prefix+":%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSweepDeletesExpiredRowsInBoundedDeletes: a sweep deletes the rows
// whose state is back to full, at most batch rows per delete and ten
// deletes per sweep, and keeps every row that still counts.
func TestSweepDeletesExpiredRowsInBoundedDeletes(t *testing.T) {
	pool := migrated(t)
	clock := backendtest.NewClock(backendtest.Epoch)
	s := New(pool, WithPrefix("sweep"), WithClock(clock.Now), WithJanitor(0, 0))
	ctx := context.Background()
	for i := range 25 {
		r := backend.Request{Key: fmt.Sprint("short", i), Algorithm: backend.FixedWindow, Limit: 5, Period: time.Second, Cost: 1}
		if _, err := s.Decide(ctx, []backend.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	long := backend.Request{Key: "long", Algorithm: backend.SlidingLog, Limit: 5, Period: time.Hour, Cost: 1}
	if _, err := s.Decide(ctx, []backend.Request{long}); err != nil {
		t.Fatal(err)
	}
	if got := s.sweep(2); got != 0 {
		t.Fatalf("a sweep before any state expired deleted %d rows", got)
	}
	clock.Advance(time.Minute)
	if got := s.sweep(2); got != 20 {
		t.Fatalf("the first sweep of 25 expired rows in deletes of 2 deleted %d, want 20 (ten deletes)", got)
	}
	if got := s.sweep(2); got != 5 {
		t.Fatalf("the second sweep deleted %d, want the 5 left", got)
	}
	if got := rows(t, pool, "sweep"); got != 1 {
		t.Fatalf("%d rows left, want the one that still counts", got)
	}
	if got := remaining(t, s, long); got != 4 {
		t.Fatalf("the kept key has %d remaining, want 4", got)
	}
}

// TestJanitorRunsUntilClose: the janitor deletes expired rows on its own,
// and Close stops its goroutine (and may be called again).
func TestJanitorRunsUntilClose(t *testing.T) {
	pool := migrated(t)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	clock := backendtest.NewClock(backendtest.Epoch)
	s := New(pool, WithPrefix("janitor"), WithClock(clock.Now), WithJanitor(5*time.Millisecond, 100))
	r := backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 5, Period: time.Second, Cost: 1}
	if _, err := s.Decide(context.Background(), []backend.Request{r}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for rows(t, pool, "janitor") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the janitor left an expired row for 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close()
	s.Close()
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before New", runtime.NumGoroutine(), before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

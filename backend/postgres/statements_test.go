package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestStatementsPerDecision counts, with pg_stat_statements tracking the
// statements inside the functions, what a warm session's decisions run:
// at most three statements each (the call, the lock and read, the write),
// for one request and for three, and no statement planned again. The
// three-request call's final UPDATE took arrays as parameters and was
// planned at every call, which cost as much as running it.
func TestStatementsPerDecision(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{Settings: []string{"pg_stat_statements.track=all", "pg_stat_statements.track_planning=on"}})
	ctx := context.Background()
	pool := pgtest.Pool(t, srv.URL("postgres"), func(c *pgxpool.Config) { c.MaxConns = 1 })
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		t.Fatal(err)
	}
	// other keys, so that the planner weighs a table of some size
	if _, err := pool.Exec(ctx, "INSERT INTO ceiling_state SELECT 'other:' || i, 3, '{0,0}', 0 FROM generate_series(1, 5000) i"); err != nil {
		t.Fatal(err)
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	calls := func(i int) [][]backend.Request {
		k := fmt.Sprint(i % 5)
		return [][]backend.Request{
			{{Key: "one:" + k, Limit: 1000, Period: time.Hour, Cost: 1}},
			{
				{Key: "a:" + k, Limit: 1000, Period: time.Second, Cost: 1},
				{Key: "b:" + k, Algorithm: backend.SlidingWindow, Limit: 1000, Period: time.Minute, Cost: 1},
				{Key: "c:" + k, Algorithm: backend.GCRA, Limit: 1000, Period: time.Hour, Cost: 1},
			},
		}
	}
	decide := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			for _, reqs := range calls(i) {
				res, err := s.Decide(ctx, reqs)
				if err != nil || !res[0].Allowed {
					t.Fatalf("decision %d of %d requests: %v, %v", i, len(reqs), res, err)
				}
			}
		}
	}
	counters := func() (stmts, plans int64) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(plans), 0)::bigint FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%'`).Scan(&stmts, &plans)
		if err != nil {
			t.Fatal(err)
		}
		return stmts, plans
	}
	decide(0, 20) // every key has a row; every plan is made, custom plans are over
	stmts0, plans0 := counters()
	const n = 20
	decide(20, 20+n)
	stmts, plans := counters()
	if got := float64(stmts-stmts0) / (2 * n); got > 3 {
		t.Errorf("%.2f statements per decision, want at most 3", got)
	}
	if plans != plans0 {
		t.Errorf("%d statements planned in %d warm decisions, want none", plans-plans0, 2*n)
	}
}

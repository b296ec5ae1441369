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
//
// A session plans each line of a function the first time it runs it, so
// a warm session is one that has run every line the measured decisions
// run. On the server's clock which lines those are went by the machine's
// speed (a one-second window rolls its 62.5 ms buckets only when a key's
// decisions are that far apart), and a loaded machine first rolled one in
// the measured decisions. The decisions therefore go by a clock the test
// steps: the measured ones repeat the warm-up's steps. Autovacuum is off
// for the tables, whose statistics the test sets with ANALYZE, so that
// no vacuum or analyze invalidates the plans meanwhile. The same
// measurement on a session that plans every statement at every call
// (plan_cache_mode force_custom_plan) must see them planned.
func TestStatementsPerDecision(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{Settings: []string{"pg_stat_statements.track=all", "pg_stat_statements.track_planning=on"}})
	ctx := context.Background()
	pool := pgtest.Pool(t, srv.URL("postgres"), func(c *pgxpool.Config) { c.MaxConns = 1 })
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
		"ALTER TABLE ceiling_state SET (autovacuum_enabled = off)",
		"ALTER TABLE ceiling_settled SET (autovacuum_enabled = off)",
		// other keys, so that the planner weighs a table of some size
		"INSERT INTO ceiling_state SELECT 'other:' || i, 3, '{0,0}', 0 FROM generate_series(1, 5000) i",
		"ANALYZE ceiling_state, ceiling_settled",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
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
	// measure makes 2*n warm decisions on a session of p and returns the
	// statements run and planned meanwhile. The clock starts on an hour
	// and steps 10 ms a decision: each key of a one-second window is
	// decided every 100 ms, so each of its decisions rolls one or two
	// buckets, in the warm-up as in the measured decisions; no minute or
	// hour passes.
	measure := func(p *pgxpool.Pool, prefix string, n int) (stmts, plans int64) {
		t.Helper()
		at := time.Unix(1_800_000_000, 0)
		s := New(p, WithPrefix(prefix), WithJanitor(0, 0), WithClock(func() time.Time { return at }))
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
					at = at.Add(10 * time.Millisecond)
					res, err := s.Decide(ctx, reqs)
					if err != nil || !res[0].Allowed {
						t.Fatalf("decision %d of %d requests: %v, %v", i, len(reqs), res, err)
					}
				}
			}
		}
		decide(0, 20) // every key has a row, every line has run; custom plans are over
		stmts0, plans0 := counters()
		decide(20, 20+n)
		stmts, plans = counters()
		return stmts - stmts0, plans - plans0
	}
	const n = 20
	stmts, plans := measure(pool, "warm", n)
	if got := float64(stmts) / (2 * n); got > 3 {
		t.Errorf("%.2f statements per decision, want at most 3", got)
	}
	if plans != 0 {
		t.Errorf("%d statements planned in %d warm decisions, want none", plans, 2*n)
	}
	// The counter sees a statement planned at every call.
	replan := pgtest.Pool(t, srv.URL("postgres"), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	})
	if _, plans := measure(replan, "replan", n); plans < 2*n {
		t.Errorf("%d statements planned in %d decisions of a session that plans every statement at every call, want at least %d", plans, 2*n, 2*n)
	}
}

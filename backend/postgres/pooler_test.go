package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDecidesWithoutPreparedStatements: behind PgBouncer in transaction
// pooling, a session's prepared statements are not there in the next
// transaction, so pgx must not prepare: default_query_exec_mode=exec or
// simple_protocol in the URL. On a pool of one session in each mode, a
// one-request call, a call of three (two algorithms, arrays as
// arguments), a peek, a rejection and a Reset decide as they do by
// default, Migrate runs, and the session holds no prepared
// statement afterwards.
func TestDecidesWithoutPreparedStatements(t *testing.T) {
	srv := pgtest.Shared(t)
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.Pool(t, srv.Database(t)+"&default_query_exec_mode="+mode, func(c *pgxpool.Config) { c.MaxConns = 1 })
			if err := Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			s := New(pool, WithJanitor(0, 0))
			defer s.Close()
			lone := backend.Request{Key: "lone", Algorithm: backend.GCRA, Limit: 2, Period: time.Hour, Cost: 1}
			three := []backend.Request{
				{Key: "a", Algorithm: backend.SlidingLog, Limit: 2, Period: time.Hour, Cost: 1},
				{Key: "b", Algorithm: backend.RollingWindow, Limit: 5, Period: time.Minute, Cost: 1},
				lone,
			}
			peek := lone
			peek.Cost = 0
			steps := []struct {
				reqs    []backend.Request
				allowed bool
				left    int64 // the last request's Remaining
			}{
				{[]backend.Request{lone}, true, 1},
				{three, true, 0},
				{[]backend.Request{peek}, true, 0},
				{[]backend.Request{lone}, false, 0},
				{three, false, 0},
			}
			for i, st := range steps {
				res, err := s.Decide(ctx, st.reqs)
				if err != nil {
					t.Fatalf("step %d (%d requests): %v", i, len(st.reqs), err)
				}
				last := res[len(res)-1]
				if last.Allowed != st.allowed || last.Remaining != st.left {
					t.Fatalf("step %d (%d requests): allowed %v, remaining %d; want %v, %d", i, len(st.reqs), last.Allowed, last.Remaining, st.allowed, st.left)
				}
			}
			if err := s.Reset(ctx, "lone"); err != nil {
				t.Fatal(err)
			}
			if got := remaining(t, s, peek); got != 2 {
				t.Fatalf("remaining %d after Reset, want 2", got)
			}
			var prepared int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&prepared); err != nil {
				t.Fatal(err)
			}
			if prepared != 0 {
				t.Fatalf("%d prepared statements on the session, want none", prepared)
			}
		})
	}
}

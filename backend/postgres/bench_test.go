package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkDecide is one decision of one or three rolling-window rules on
// the shared server, from one goroutine (serial) and from 64, beside the
// floor of a decision on the same pool: a SELECT 1 round trip
// (floor=select1) and a bare one-row INSERT ... ON CONFLICT DO UPDATE
// RETURNING committed asynchronously as a decision is (floor=upsert).
func BenchmarkDecide(b *testing.B) {
	pool := migrated(b, func(c *pgxpool.Config) { c.MaxConns = 64 })
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS bench_floor (key text COLLATE \"C\" PRIMARY KEY, n bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	floors := []struct{ name, sql string }{
		{"select1", "SELECT 1"},
		// one statement: the CTE sets the commit mode for its transaction
		// as the decision functions do
		{"upsert", `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
			INSERT INTO bench_floor AS t (key, n) SELECT 'bench:0', 1 FROM c
			ON CONFLICT (key) DO UPDATE SET n = t.n + 1 RETURNING t.n`},
	}
	for _, f := range floors {
		b.Run("floor="+f.name+"/serial", func(b *testing.B) {
			var n int64
			for b.Loop() {
				if err := pool.QueryRow(ctx, f.sql).Scan(&n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, rules := range []int{1, 3} {
		reqs := make([]backend.Request, rules)
		for i := range reqs {
			reqs[i] = backend.Request{Key: fmt.Sprint("bench:", i), Limit: 1_000_000_000, Period: time.Hour, Cost: 1}
		}
		b.Run(fmt.Sprintf("rules=%d/serial", rules), func(b *testing.B) {
			out := make([]backend.Result, rules)
			for b.Loop() {
				if err := s.DecideInto(ctx, reqs, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("rules=%d/parallel64", rules), func(b *testing.B) {
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				out := make([]backend.Result, rules)
				for pb.Next() {
					if err := s.DecideInto(ctx, reqs, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

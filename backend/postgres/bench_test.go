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
// the shared server, from one goroutine (serial) and from 64.
func BenchmarkDecide(b *testing.B) {
	pool := migrated(b, func(c *pgxpool.Config) { c.MaxConns = 64 })
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	for _, rules := range []int{1, 3} {
		reqs := make([]backend.Request, rules)
		for i := range reqs {
			reqs[i] = backend.Request{Key: fmt.Sprint("bench:", i), Limit: 1_000_000_000, Period: time.Hour, Cost: 1}
		}
		b.Run(fmt.Sprintf("rules=%d/serial", rules), func(b *testing.B) {
			out := make([]backend.Result, rules)
			for b.Loop() {
				if err := s.DecideInto(context.Background(), reqs, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("rules=%d/parallel64", rules), func(b *testing.B) {
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				out := make([]backend.Result, rules)
				for pb.Next() {
					if err := s.DecideInto(context.Background(), reqs, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

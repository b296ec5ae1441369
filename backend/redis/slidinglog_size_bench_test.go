package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// BenchmarkSlidingLogKeySize admits into sliding logs of limit n, one
// admission (one record) per op, on a local redis-server, and reports what
// Redis says a full log's key takes (MEMORY USAGE): the figure behind
// ceiling.MaxSlidingLogLimit. ns/op is the admission's round trip.
//
//	go test ./backend/redis -run '^$' -bench SlidingLogKeySize -benchtime 20000x
func BenchmarkSlidingLogKeySize(b *testing.B) {
	for _, n := range []int64{1_000, 10_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			client := redistest.Shared(b).Client(b)
			prefix := redistest.KeyPrefix(b)
			s := New(client, WithPrefix(prefix), WithDenyCache(0))
			ctx := context.Background()
			req := []backend.Request{{Key: "log", Algorithm: backend.SlidingLog, Limit: n, Period: time.Hour, Cost: 1}}
			full := ""
			b.ResetTimer()
			for i := range b.N {
				// A fresh key whenever the last one is full.
				req[0].Key = fmt.Sprintf("log%d", int64(i)/n)
				if _, err := s.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
				if int64(i)%n == n-1 {
					full = prefix + ":" + req[0].Key
				}
			}
			b.StopTimer()
			if full == "" {
				b.Logf("no log of %d filled: run at least %dx for B/key", n, n)
				return
			}
			bytes, err := client.MemoryUsage(ctx, full).Result()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(bytes), "B/key")
		})
	}
}

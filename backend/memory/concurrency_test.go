package memory

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// BenchmarkConcurrencyLeases measures one Concurrency decision on a key
// holding n live leases (hour-long, acquired 1µs apart), at n = 10 and
// n = 1000: an acquisition and its release (two decisions an iteration),
// the same in a call with a rate rule (the multi-request path), a renewal
// of a held lease, and a rejection of a key at its limit, whose retry
// needs the next lease to expire. The per-decision cost should not grow
// with n.
func BenchmarkConcurrencyLeases(b *testing.B) {
	for _, n := range []int{10, 1000} {
		for _, op := range []string{"acquire-release", "acquire-release-with-rate", "renew", "reject"} {
			b.Run(fmt.Sprintf("leases=%d/%s", n, op), func(b *testing.B) {
				now := backendtest.Epoch
				s := New(WithClock(func() time.Time { return now }), WithSweepInterval(0))
				defer s.Close()
				limit := int64(n + 1)
				if op == "reject" {
					limit = int64(n)
				}
				lease := func(id, cost int64) backend.Request {
					return backend.Request{Key: "k", Algorithm: backend.Concurrency, Limit: limit, Period: time.Hour, Cost: cost, Lease: id}
				}
				res := make([]backend.Result, 2)
				for id := range int64(n) {
					now = now.Add(time.Microsecond)
					if err := s.DecideInto(ctx, []backend.Request{lease(id+1, 1)}, res); err != nil || !res[0].Allowed {
						b.Fatalf("lease %d: %v %+v", id+1, err, res[0])
					}
				}
				rate := backend.Request{Key: "r", Algorithm: backend.GCRA, Limit: backend.MaxLimit, Period: time.Second, Cost: 1}
				acquire, release := []backend.Request{lease(0, 1)}, []backend.Request{lease(0, -1)}
				if op == "acquire-release-with-rate" {
					acquire, release = []backend.Request{rate, lease(0, 1)}, []backend.Request{lease(0, -1), rate}
					release[1].Cost = 0
				}
				b.ReportAllocs()
				id := int64(n)
				for b.Loop() {
					now = now.Add(time.Microsecond)
					id++
					switch op {
					case "acquire-release", "acquire-release-with-rate":
						acquire[len(acquire)-1].Lease, release[0].Lease = id, id
						if err := s.DecideInto(ctx, acquire, res); err != nil || !res[len(acquire)-1].Allowed {
							b.Fatalf("acquire %d: %v %+v", id, err, res)
						}
						if err := s.DecideInto(ctx, release, res); err != nil {
							b.Fatal(err)
						}
					case "renew":
						if err := s.DecideInto(ctx, []backend.Request{lease(1+id%int64(n), 1)}, res); err != nil || !res[0].Allowed {
							b.Fatalf("renew: %v %+v", err, res[0])
						}
					case "reject":
						if err := s.DecideInto(ctx, []backend.Request{lease(id, 1)}, res); err != nil || res[0].Allowed {
							b.Fatalf("an acquisition past the limit: %v %+v", err, res[0])
						}
					}
				}
				if op != "reject" {
					if got := s.Len(); got != 1 && got != 2 {
						b.Fatalf("%d keys", got)
					}
				}
			})
		}
	}
}

package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRestartEmptyForgetsEveryLimit pins the bound README.md states for a
// Redis without persistence: restarted empty, it forgets every key, so
// each key admits one more Limit. A concurrency limit of 3: instance A
// holds 3 slots, Redis restarts empty, instance B gets 3 more, 6 in
// flight. A sliding log of 3 per hour: 3 before, 3 more after, 6 in one
// hour. With AOF and appendfsync always, the restart keeps both, and B
// gets nothing.
func TestRestartEmptyForgetsEveryLimit(t *testing.T) {
	slots := func(key string, lease int64) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.Concurrency, Limit: 3, Period: time.Minute, Cost: 1, Lease: lease}
	}
	otp := func(key string) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.SlidingLog, Limit: 3, Period: time.Hour, Cost: 1}
	}
	// admitted decides each request once on its own Store and client (a
	// fresh instance), and counts the admissions.
	admitted := func(t *testing.T, inst *redistest.Instance, reqs ...backend.Request) int {
		t.Helper()
		client := redis.NewClient(&redis.Options{Addr: inst.Addr, ContextTimeoutEnabled: true})
		defer client.Close()
		s := New(client, WithDenyCache(0))
		n := 0
		for _, r := range reqs {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := s.Decide(ctx, []backend.Request{r})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name   string
		config []string
		after  int // admissions of B after the restart
	}{
		{"no persistence", nil, 3},
		{"AOF appendfsync always", []string{"appendonly yes", "appendfsync always"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			inst := redistest.ServerWith(t, c.config...)
			if got := admitted(t, inst, slots("s", 1), slots("s", 2), slots("s", 3), slots("s", 4)); got != 3 {
				t.Fatalf("instance A got %d of 4 slots, want 3", got)
			}
			if got := admitted(t, inst, otp("o"), otp("o"), otp("o"), otp("o")); got != 3 {
				t.Fatalf("instance A got %d of 4 codes, want 3", got)
			}
			inst.Restart(t) // SIGKILL, then start again on the same port
			if got := admitted(t, inst, slots("s", 5), slots("s", 6), slots("s", 7), slots("s", 8)); got != c.after {
				t.Errorf("after the restart instance B got %d of 4 slots while A holds 3, want %d", got, c.after)
			}
			if got := admitted(t, inst, otp("o"), otp("o"), otp("o"), otp("o")); got != c.after {
				t.Errorf("after the restart instance B got %d of 4 codes within the hour of A's 3, want %d", got, c.after)
			}
		})
	}
}

package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A stored value whose header disagrees with its counts (written by hand, by
// an older bug, or cut short) must never make a script loop: a script that
// does not end holds Redis's only thread, and every client of that Redis,
// not only the limiter, gets BUSY until someone sends SCRIPT KILL. Each
// scan over a value's counts or records stops at its end.
func TestCorruptValuesCannotHangRedis(t *testing.T) {
	srv := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0))
	ctx := context.Background()
	rolling := func(key string, cost int64) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.RollingWindow, Limit: 10, Period: time.Minute, Cost: cost}
	}
	log := func(key string, cost int64) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.SlidingLog, Limit: 10, Period: time.Minute, Cost: cost}
	}
	// corrupt rewrites key's stored value with edit.
	corrupt := func(t *testing.T, key string, edit func(*testing.T, string) string) {
		t.Helper()
		key = s.prefix + key
		v, err := client.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("reading %q: %v", key, err)
		}
		if err := client.Set(ctx, key, edit(t, v), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A rolling window whose sum S says 5 units over counts that are all 0.
	noCounts := func(t *testing.T, v string) string {
		const header = 51 // "R2 " and W, b, S of 15 digits, each followed by a space
		if !strings.HasPrefix(v, "R2 ") || len(v) < header {
			t.Fatalf("rolling value %q: not the R2 layout this test knows", v)
		}
		counts := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return '0'
			}
			return r
		}, v[header:])
		return v[:35] + fmt.Sprintf("%015d", 5) + " " + counts
	}
	// A sliding log whose header counts 9 units over records that hold 2.
	moreUnits := func(t *testing.T, v string) string {
		if !strings.HasPrefix(v, "L2 ") || len(v) < 19 {
			t.Fatalf("sliding-log value %q: not the L2 layout this test knows", v)
		}
		return v[:3] + fmt.Sprintf("%016d", 9) + v[19:]
	}
	for _, c := range []struct {
		name   string
		seed   []backend.Request
		edit   func(*testing.T, string) string
		decide []backend.Request
	}{
		{"rolling window, lone", []backend.Request{rolling("r1", 2)}, noCounts, []backend.Request{rolling("r1", 1)}},
		{"rolling window, with another rule", []backend.Request{rolling("r2", 2)}, noCounts, []backend.Request{rolling("r2", 0), day("x", 1)}},
		{"sliding log refund, lone", []backend.Request{log("l1", 2)}, moreUnits, []backend.Request{log("l1", -5)}},
		{"sliding log refund, with another rule", []backend.Request{log("l2", 2)}, moreUnits, []backend.Request{log("l2", -5), day("y", 1)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			decide(t, s, c.seed...)
			corrupt(t, c.seed[0].Key, c.edit)
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := s.Decide(cctx, c.decide)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, backend.ErrUnreachable) {
				_ = client.Do(ctx, "SCRIPT", "KILL").Err() // for the next cases
				t.Fatalf("deciding on a corrupt value: %v: the script did not end", err)
			}
			if err := client.Ping(ctx).Err(); err != nil {
				t.Fatalf("Redis after deciding on a corrupt value: %v", err)
			}
		})
	}
}

package ceiling

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestWaitFiftyOnTenPerSecondOnRedis: 50 waiters on a limit of 10 per
// second on a real Redis are all admitted, at the limit's rate: never
// more than 10 in any second of the server's clock (the admissions'
// stamps are Redis TIME), and the last within the five rounds the limit
// needs plus each round's jitter (a quarter of a wait) and slack for a
// busy machine. Each waiter's loop is bounded by its context.
func TestWaitFiftyOnTenPerSecondOnRedis(t *testing.T) {
	inst := redistest.Shared(t)
	store := ceilingredis.New(inst.Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
	l := MustNew([]Rule{{Name: "jobs", Algorithm: SlidingLog, Limit: 10, Period: time.Second}},
		WithBackend(store), WithTimeout(2*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var stamps []int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			d, err := l.Wait(ctx, Input{Rule: "jobs", Key: "queue"})
			if err != nil || !d.Allowed || d.Results[0].Fallback != 0 {
				t.Errorf("Wait: %v, allowed %v, fallback %v", err, d.Allowed, d.Results[0].Fallback)
				return
			}
			mu.Lock()
			stamps = append(stamps, d.Results[0].Stamp)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(stamps) != 50 {
		t.Fatalf("%d admitted, want 50", len(stamps))
	}
	slices.Sort(stamps)
	for i := 10; i < len(stamps); i++ {
		if gap := stamps[i] - stamps[i-10]; gap < 1_000_000 {
			t.Fatalf("admissions %d and %d (µs, Redis TIME) %dµs apart: 11 in one second", i-10, i, gap)
		}
	}
	if span := time.Duration(stamps[49]-stamps[0]) * time.Microsecond; span > 8*time.Second {
		t.Errorf("50 admitted over %v, want about 4s (5 rounds of 10), at most 8s", span)
	}
}

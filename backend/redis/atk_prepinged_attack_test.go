package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAFrozenRedisPingedBeforeNew_Regression: the client's first connection
// was dialed before New (a startup ping), so the Store's socket watcher
// never saw it; others were dialed since. Redis then freezes. A decision
// out of budget must be blamed on Redis, never on this process
// (ErrUnread: shed, no breaker, no degraded health). The judge took the
// watched connections, all idle, for a reply being read ("its reply waits
// to be read") when the call was on the unwatched one.
func TestAFrozenRedisPingedBeforeNew_Regression(t *testing.T) {
	citest.Only(t) // a 100 ms judgement: on a loaded machine this process can be the late one
	for _, before := range []bool{false, true} {
		name := "new first"
		if before {
			name = "ping first"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Server(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			ctx := context.Background()
			if before {
				if err := client.Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
			req := backend.Request{Key: "k", Limit: backend.MaxLimit, Period: time.Hour, Cost: 1}
			var wg sync.WaitGroup
			for range 8 { // more connections, watched
				wg.Go(func() {
					for range 20 {
						decide(t, s, req)
					}
				})
			}
			wg.Wait()
			srv.Freeze(t)
			defer srv.Thaw(t)
			var blamed []string
			for range 10 {
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err := s.Decide(ctx, []backend.Request{req})
				cancel()
				if err == nil {
					t.Fatal("decided on a frozen Redis")
				}
				if errors.Is(err, backend.ErrNotSent) || errors.Is(err, backend.ErrUnread) {
					blamed = append(blamed, err.Error())
				}
			}
			if len(blamed) > 0 {
				t.Errorf("%d of 10 decisions on a frozen Redis blamed this process: %q", len(blamed), blamed[0])
			}
		})
	}
}

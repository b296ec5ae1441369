package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAnInlineCallerIsNotHeldByTheLoadAfterItsAnswer_Attack: a caller
// that sends its own batch (ContextTimeoutEnabled, or no deadline and no
// Done) returns its answered decision at once, whatever a slow FUNCTION
// LOAD does: the load runs off every call's path.
func TestAnInlineCallerIsNotHeldByTheLoadAfterItsAnswer_Attack(t *testing.T) {
	for _, c := range []struct {
		name    string
		timeout time.Duration // 0: context.Background()
	}{
		{"deadline 800ms", 800 * time.Millisecond},
		{"no deadline", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Server(t)
			proxy := redistest.NewProxy(t, srv.Addr)
			client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			s := New(client, WithDenyCache(0))
			decide(t, s, day("warm", 1))
			if err := srv.Client(t).FunctionFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			lose := proxy.LoseReplyLate("register_function")
			defer lose()
			ctx := context.Background()
			if c.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.timeout)
				defer cancel()
			}
			start := time.Now()
			res, err := s.Decide(ctx, []backend.Request{day("k", 1)})
			took := time.Since(start)
			lose()
			if err != nil || !res[0].Allowed {
				t.Fatalf("%v %+v", err, res)
			}
			if took > 250*time.Millisecond {
				t.Errorf("a decision answered by EVAL returned after %v: held by the library load that follows its answer; want it within a round trip or two", took)
			}
		})
	}
}

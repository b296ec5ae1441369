package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestConcurrentUsersWithoutEVALAfterAFlush_Attack: a user allowed FCALL
// and FUNCTION but not EVAL. After a FUNCTION FLUSH, several callers find
// the library missing at once: one loads it, the others wait for that load,
// and each sends its FCALL again. Every decision is answered.
func TestConcurrentUsersWithoutEVALAfterAFlush_Attack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Server(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-eval", "-evalsha", "-script").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw", PoolSize: 64})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1))
	const n = 40
	failed, applied := 0, int64(1)
	for round := 0; round < 5 && failed == 0; round++ {
		if err := admin.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := s.Decide(c, []backend.Request{day("k", 1)})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if failed == 0 {
						t.Logf("round %d caller %d: %v (auth kind: %v)", round, i, err, isAuth(err))
					}
					failed++
				} else {
					applied++
				}
			}()
		}
		close(start)
		wg.Wait()
	}
	if failed > 0 {
		t.Errorf("%d decisions failed after a FUNCTION FLUSH for a user allowed FCALL and FUNCTION; want each decided (the library was being loaded by another caller)", failed)
	}
	if got := stored(t, s, "k"); got != applied {
		t.Errorf("stored %d, want %d", got, applied)
	}
}

func isAuth(err error) bool { return errors.Is(err, backend.ErrAuth) }

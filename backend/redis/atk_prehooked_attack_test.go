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

// TestAKilledMasterOfAClusterUsedBeforeNew_Regression: a user pings the
// Cluster before building the Store (the usual startup check), so that
// the client made its node clients before New hooked OnNewNode. A master
// then dies while the other masters keep answering. A decision on its
// slots must be blamed on the backend (unreachable or timed out), never on
// this process (ErrNotSent, ErrUnread: shed, no breaker, no degraded
// health), which is what the Store says when it sees neither the node's
// refused dials nor its sockets: OnNewNode alone never hooked the node
// clients made before New, and 1 or 2 of 10 such decisions came back
// ErrUnread.
func TestAKilledMasterOfAClusterUsedBeforeNew_Regression(t *testing.T) {
	for _, before := range []bool{false, true} {
		name := "new first"
		if before {
			name = "ping first"
		}
		t.Run(name, func(t *testing.T) {
			cl := redistest.Cluster(t)
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			ctx := context.Background()
			if before {
				if err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
					t.Fatal(err)
				}
			}
			prefix := redistest.KeyPrefix(t)
			s := New(client, WithPrefix(prefix), WithDenyCache(0))
			dead := backend.Request{Key: "a", Limit: backend.MaxLimit, Period: time.Hour, Cost: 1}
			decide(t, s, dead)
			master, err := client.MasterForKey(ctx, prefix+":"+dead.Key)
			if err != nil {
				t.Fatal(err)
			}
			// keys on the other masters, decided all along
			var others []backend.Request
			for i := 0; len(others) < 4 && i < 1000; i++ {
				r := backend.Request{Key: "o" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Limit: backend.MaxLimit, Period: time.Hour, Cost: 1}
				m, err := client.MasterForKey(ctx, prefix+":"+r.Key)
				if err != nil {
					t.Fatal(err)
				}
				if m.Options().Addr != master.Options().Addr {
					others = append(others, r)
				}
			}
			for _, r := range others {
				decide(t, s, r)
			}
			cl.Node(master.Options().Addr).Kill()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, r := range others {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						s.Decide(ctx, []backend.Request{r})
						cancel()
						time.Sleep(time.Millisecond)
					}
				})
			}
			defer func() { close(stop); wg.Wait() }()
			var kinds []string
			for range 10 {
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err := s.Decide(ctx, []backend.Request{dead})
				cancel()
				if err == nil {
					t.Fatal("decided on a killed master")
				}
				if errors.Is(err, backend.ErrNotSent) || errors.Is(err, backend.ErrUnread) {
					kinds = append(kinds, err.Error())
				}
			}
			if len(kinds) > 0 {
				t.Errorf("%d of 10 decisions on a killed master blamed this process: %q", len(kinds), kinds[0])
			}
		})
	}
}

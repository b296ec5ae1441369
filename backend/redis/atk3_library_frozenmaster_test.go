package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// keysOnMasters finds a key (under prefix p) on each master.
func keysOnMasters(t *testing.T, client *redis.ClusterClient) map[string]string {
	t.Helper()
	masters := map[string]string{}
	for i := 0; len(masters) < 3 && i < 1000; i++ {
		k := fmt.Sprintf("k%d", i)
		m, err := client.MasterForKey(context.Background(), "p:"+k)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := masters[m.Options().Addr]; !ok {
			masters[m.Options().Addr] = k
		}
	}
	return masters
}

// twoMasters decides a key on each of two masters through s, so that both
// hold the library, and returns the masters, their keys and a client of
// the first (closed when t ends).
func twoMasters(t *testing.T, s *Store, client *redis.ClusterClient) (a, b, ka, kb string, na *redis.Client) {
	t.Helper()
	masters := keysOnMasters(t, client)
	for addr := range masters {
		if a == "" {
			a = addr
		} else if b == "" {
			b = addr
		}
	}
	decide(t, s, day(masters[a], 1))
	decide(t, s, day(masters[b], 1))
	na = redis.NewClient(&redis.Options{Addr: a})
	t.Cleanup(func() { na.Close() })
	return a, b, masters[a], masters[b], na
}

// TestAFrozenMasterHoldsNoLoadForAnother_Attack: one master lost its
// library, another is frozen (a partition, a long operation) and serves no
// key of the call. The load into every master runs off the call's path, so
// the decision on the healthy master is not held by the frozen one; for a
// user without EVAL, the load into the key's own master is enough for the
// FCALL to be sent again.
func TestAFrozenMasterHoldsNoLoadForAnother_Attack(t *testing.T) {
	ctx := context.Background()
	c := redistest.Cluster(t)
	for _, addr := range c.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: addr})
		if err := n.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-eval", "-evalsha", "-script").Err(); err != nil {
			t.Fatal(err)
		}
		n.Close()
	}
	for _, noEval := range []bool{false, true} {
		t.Run(map[bool]string{false: "default user", true: "user without EVAL"}[noEval], func(t *testing.T) {
			opt := &redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, DialerRetries: 1}
			if noEval {
				opt.Username, opt.Password = "limiter", "pw"
			}
			client := redis.NewClusterClient(opt)
			t.Cleanup(func() { client.Close() })
			logs := &records{}
			s := New(client, WithPrefix("p"), WithDenyCache(0), WithLogger(slog.New(logs)))
			a, b, ka, _, na := twoMasters(t, s, client)
			if err := na.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			c.Node(b).Freeze(t)
			thawed := false
			thaw := func() {
				if !thawed {
					thawed = true
					c.Node(b).Thaw(t)
				}
			}
			defer thaw()
			dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := s.Decide(dctx, []backend.Request{day(ka, 1)})
			took := time.Since(start)
			thaw()
			if err != nil {
				t.Errorf("decision on the healthy master %s: %v (auth: %v); want it decided: the library was loaded there", a, err, errors.Is(err, backend.ErrAuth))
			}
			if took > 500*time.Millisecond {
				t.Errorf("decision on %s took %v: held by the load into frozen master %s, which the call never touched", a, took, b)
			}
			t.Logf("load failure lines: %d", len(storeLines(logs, "loading the function library")))
		})
	}
}

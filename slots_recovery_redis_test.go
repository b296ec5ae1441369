package ceiling

import (
	"log/slog"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// FailLocal's concurrency slots reach the backend when it recovers, not at
// their next renewal: 2 instances, a limit of 4 and a 30 s lease; the
// outage takes 4 slots locally (2 each, their share), and after the
// recovery, and past the hand-over, Redis admits none more while they are
// held. It admitted 4 more: 8 in flight until the renewal 10 s later.
func TestFailLocalSlotsReachTheBackendOnRecovery_Regression(t *testing.T) {
	inst := redistest.Server(t)
	proxy := redistest.NewProxy(t, inst.Addr)
	prefix := redistest.KeyPrefix(t)
	rule := Rule{Name: "streams", Limit: 4, Period: 30 * time.Second, Algorithm: Concurrency}
	var ls []*Limiter
	for range 2 {
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		l := MustNew([]Rule{rule}, WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(prefix))),
			WithInstances(2), WithTimeout(2*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	ctx := t.Context()
	proxy.Partition()
	proxy.Cut()
	for i, l := range ls {
		if !eventually(func() bool {
			d, _ := l.Decide(ctx, Input{Rule: "streams", Key: "probe"})
			d.Release()
			return l.Health().Status == "degraded"
		}) {
			t.Fatalf("instance %d never degraded", i)
		}
	}
	var held []Decision
	for i, l := range ls {
		for j := range 3 {
			d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			if want := j < 2; d.Allowed != want || d.Allowed && d.Results[0].Fallback != FailLocal {
				t.Fatalf("instance %d, slot %d during the outage: allowed %v by %v, want %v locally", i, j+1, d.Allowed, d.Results[0].Fallback, want)
			}
			if d.Allowed {
				held = append(held, d)
			}
		}
	}
	defer func() {
		for _, d := range held {
			d.Release()
		}
	}()
	proxy.Heal()
	for i, l := range ls {
		if !eventually(func() bool { return l.Health().Status == "healthy" && !l.inHandOver() }) {
			t.Fatalf("instance %d never recovered", i)
		}
	}
	for i, l := range ls {
		for j := range 4 {
			d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Errorf("instance %d, attempt %d after the recovery: admitted with 4 slots held in the outage, want refused (limit 4)", i, j+1)
				d.Release()
			}
		}
	}
	held[0].Release()
	if d, err := ls[1].Decide(ctx, Input{Rule: "streams", Key: "acme"}); err != nil || !d.Allowed {
		t.Errorf("after one outage slot was released: %v, %v; want admitted", d.Allowed, err)
	} else {
		d.Release()
	}
}

package ceiling

import (
	"log/slog"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// slotsLimiter is a limiter of one concurrency rule on Redis at addr.
func slotsLimiter(t *testing.T, addr, prefix string, rule Rule, opts ...Option) *Limiter {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	opts = append([]Option{WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(prefix))),
		WithInstances(2), WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	l := MustNew([]Rule{rule}, opts...)
	t.Cleanup(func() { l.Close() })
	return l
}

// untilDegraded decides on a key of its own until l's backend is degraded.
func untilDegraded(t *testing.T, l *Limiter) {
	t.Helper()
	if !eventually(func() bool {
		d, _ := l.Decide(t.Context(), Input{Rule: "streams", Key: "probe"})
		d.Release()
		return l.Health().Status == "degraded"
	}) {
		t.Fatal("never degraded")
	}
}

// The slots FailLocal moved to the backend at a recovery stay counted on the
// local store while the hand-over lasts: 2 instances, a limit of 4, each
// takes its share (2) locally during the outage; the first to recover moved
// its 2 and released them locally, so during the hand-over its local store
// admitted a fresh share and Redis (which knew only those 2) admitted it
// too, and the second instance's move then made 6 in flight.
func TestFailLocalMovedSlotsCountLocallyDuringHandover_Regression(t *testing.T) {
	inst := redistest.Server(t)
	prefix := redistest.KeyPrefix(t)
	rule := Rule{Name: "streams", Limit: 4, Period: 30 * time.Second, Algorithm: Concurrency}
	var ls []*Limiter
	var proxies []*redistest.Proxy
	for range 2 {
		p := redistest.NewProxy(t, inst.Addr)
		proxies = append(proxies, p)
		ls = append(ls, slotsLimiter(t, p.Addr, prefix, rule, WithTimeout(time.Second),
			WithBreaker(BreakerConfig{CoolDown: 50 * time.Millisecond, MaxCoolDown: 3 * time.Second})))
	}
	ctx := t.Context()
	for i, l := range ls {
		proxies[i].Partition()
		proxies[i].Cut()
		untilDegraded(t, l)
	}
	var held []Decision
	defer func() {
		for _, d := range held {
			d.Release()
		}
	}()
	for i, l := range ls {
		for range 2 {
			d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
			if err != nil || !d.Allowed || d.Results[0].Fallback != FailLocal {
				t.Fatalf("instance %d during the outage: allowed %v by %v (%v), want admitted locally", i, d.Allowed, d.Results[0].Fallback, err)
			}
			held = append(held, d)
		}
	}
	proxies[0].Heal()
	a := ls[0]
	if !eventually(func() bool { return a.Health().Status == "healthy" }) {
		t.Fatal("instance 0 never recovered")
	}
	if !a.inHandOver() {
		t.Fatal("instance 0 is past its hand-over already; the test needs it")
	}
	for j := range 3 {
		d, err := a.Decide(ctx, Input{Rule: "streams", Key: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			held = append(held, d)
			t.Errorf("attempt %d during instance 0's hand-over: admitted, want refused (its share, 2, is held since the outage, and instance 1's 2 are not moved yet)", j+1)
		}
	}
	proxies[1].Heal()
	for i, l := range ls {
		if !eventually(func() bool { return l.Health().Status == "healthy" && !l.inHandOver() }) {
			t.Fatalf("instance %d never recovered", i)
		}
	}
	for i, l := range ls {
		d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			held = append(held, d)
			t.Errorf("instance %d after the hand-over: admitted with the limit (4) held since the outage", i)
		}
	}
}

// Slots held on the backend before an outage longer than their lease are
// taken again when it recovers, before the breaker closes: the leases lapsed
// on Redis during the outage, and after the recovery 2 new slots were
// admitted beside the 2 still running (limit 2) until the next renewal,
// whatever the fail mode.
func TestSlotsHeldAcrossALongOutageAreRetakenOnRecovery_Regression(t *testing.T) {
	for _, mode := range []FailMode{FailLocal, FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			inst := redistest.Server(t)
			proxy := redistest.NewProxy(t, inst.Addr)
			prefix := redistest.KeyPrefix(t)
			rule := Rule{Name: "streams", Limit: 2, Period: 3 * time.Second, Algorithm: Concurrency}
			var ls []*Limiter
			for range 2 {
				ls = append(ls, slotsLimiter(t, proxy.Addr, prefix, rule, WithFailMode(mode), WithTimeout(200*time.Millisecond)))
			}
			// Reads Redis directly, past the partition.
			direct := slotsLimiter(t, inst.Addr, prefix, rule)
			ctx := t.Context()
			var held []Decision
			defer func() {
				for _, d := range held {
					d.Release()
				}
			}()
			for range 2 {
				d, err := ls[0].Decide(ctx, Input{Rule: "streams", Key: "acme"})
				if err != nil || !d.Allowed {
					t.Fatalf("before the outage: %v %v", d.Allowed, err)
				}
				held = append(held, d)
			}
			proxy.Partition()
			proxy.Cut()
			for _, l := range ls {
				untilDegraded(t, l)
			}
			if !eventually(func() bool {
				res, err := direct.Peek(ctx, "streams", "acme")
				return err == nil && res.Remaining == 2
			}) {
				t.Fatal("the leases never lapsed on Redis")
			}
			proxy.Heal()
			for i, l := range ls {
				if !eventually(func() bool { return l.Health().Status == "healthy" }) {
					t.Fatalf("instance %d never recovered", i)
				}
			}
			for i, l := range ls {
				for range 2 {
					d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
					if err == nil && d.Allowed {
						held = append(held, d)
						t.Errorf("instance %d after the recovery: admitted (by %v) with the limit (2) held since before the outage", i, d.Results[0].Fallback)
					}
				}
			}
		})
	}
}

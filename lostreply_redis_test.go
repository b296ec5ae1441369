package ceiling

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// withLibrary loads the Redis store's function library into a fresh
// server, as any server a Store has used holds it (the Store loads it in
// the background), so that a reply these tests lose is of a call that ran.
func withLibrary(t *testing.T, c *redis.Client) {
	t.Helper()
	s := ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)+"warm"))
	if _, err := s.Decide(t.Context(), []backend.Request{{Key: "k", Limit: 1, Period: time.Second}}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // a real server's load
		if libs, err := c.FunctionList(t.Context(), redis.FunctionListQuery{LibraryNamePattern: "ceiling_*"}).Result(); err == nil && len(libs) > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatal("no function library loaded within 10 s")
		}
	}
}

// proxiedLimiter is a limiter with rules on a Redis behind a lost-reply
// proxy, on a client that does not retry by itself.
func proxiedLimiter(t *testing.T, rules []Rule, opts ...Option) (*Limiter, *redistest.Proxy, *redis.Client) {
	t.Helper()
	inst := redistest.Server(t)
	withLibrary(t, inst.Client(t))
	proxy := redistest.NewProxy(t, inst.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	l := MustNew(rules, append([]Option{WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))),
		WithTimeout(500 * time.Millisecond), WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	t.Cleanup(func() { l.Close() })
	return l, proxy, inst.Client(t)
}

// An acquisition whose reply was lost may hold a slot on Redis that its
// caller never learnt of: the instance that asked releases it, by its
// lease, as soon as Redis answers again, instead of leaving it held for
// the whole lease (30 s here; four lost replies locked a shop of 4 out for
// the chat's minute).
func TestLostReplyDoesNotHoldASlot_Regression(t *testing.T) {
	for _, mode := range []FailMode{FailClosed, FailOpen, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			l, proxy, direct := proxiedLimiter(t, []Rule{{Name: "streams", Limit: 1, Period: 30 * time.Second, Algorithm: Concurrency}},
				WithFailMode(mode))
			ctx := t.Context()
			warm, err := l.Decide(ctx, Input{Rule: "streams", Key: "warm-up"}) // the script is loaded
			if err != nil || !warm.Allowed {
				t.Fatalf("warm-up: %v, %v", warm.Allowed, err)
			}
			warm.Release()
			proxy.DropReply("fcall")
			d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
			if proxy.Dropped() != 1 {
				t.Fatalf("the proxy dropped %d replies, want 1 (err %v)", proxy.Dropped(), err)
			}
			var ue *UnavailableError
			if mode == FailClosed && !errors.As(err, &ue) {
				t.Fatalf("FailClosed after a lost reply: %v, want an *UnavailableError", err)
			}
			d.Release()
			// The slot the lost call took is on Redis; it comes back once
			// the resend goes, well before its lease ends.
			start := time.Now()
			if !eventually(func() bool {
				d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
				defer d.Release()
				return err == nil && d.Allowed && d.Results[0].Fallback == inherit
			}) {
				keys, _ := direct.Keys(ctx, "*").Result()
				t.Fatalf("no slot for 10 s after a lost reply (keys %v): the lost acquisition holds it", keys)
			}
			if waited := time.Since(start); waited > 5*time.Second {
				t.Errorf("the slot came back after %v, want as soon as Redis answered", waited)
			}
		})
	}
}

// A release that fails (Redis unreachable for a moment) is sent again once
// Redis answers, instead of leaving the slot held for the whole lease.
func TestFailedReleaseIsResentRedis(t *testing.T) {
	l, proxy, _ := proxiedLimiter(t, []Rule{{Name: "streams", Limit: 1, Period: 30 * time.Second, Algorithm: Concurrency}},
		WithFailMode(FailClosed))
	ctx := t.Context()
	d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
	if err != nil || !d.Allowed {
		t.Fatalf("a slot: %v, %v", d.Allowed, err)
	}
	proxy.Partition()
	proxy.Cut()
	d.Release()
	proxy.Heal()
	start := time.Now()
	if !eventually(func() bool {
		d, err := l.Decide(ctx, Input{Rule: "streams", Key: "acme"})
		defer d.Release()
		return err == nil && d.Allowed
	}) {
		t.Fatal("no slot for 10 s after a failed release: it was not sent again")
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("the slot came back after %v, want as soon as Redis answered", waited)
	}
	if h := l.Health(); h.DroppedWrites != 0 {
		t.Errorf("DroppedWrites %d, want 0", h.DroppedWrites)
	}
}

package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// Check at start-up against a frozen Redis (SIGSTOP) fails as a timeout
// within about the timeout plus the probe's budget, leaves the limiter
// degraded (reason "timeout", no address in Health), and the limiter
// recovers by itself, without traffic, once Redis thaws.
func TestCheckOnAFrozenRedisDegradesAndRecovers_Attack(t *testing.T) {
	inst := redistest.Server(t)
	c := redis.NewClient(&redis.Options{Addr: inst.Addr})
	defer c.Close()
	l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 3, Period: time.Hour}},
		WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))),
		WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	if err := c.Ping(t.Context()).Err(); err != nil { // a connection exists: the freeze is not a dial
		t.Fatal(err)
	}
	inst.Freeze(t)
	start := time.Now()
	err := l.Check(context.Background())
	took := time.Since(start)
	h := l.Health()
	inst.Thaw(t)
	if !errors.Is(err, ErrTimeout) || took > confirmBudget+time.Second {
		t.Errorf("Check on a frozen Redis: %v after %v; want ErrTimeout within about %v", err, took, confirmBudget+defaultTimeout)
	}
	if h.Status != "degraded" || h.Reason != kindTimeout || strings.Contains(string(h.Reason), "127.0.0.1") {
		t.Errorf("health after the check: %q, reason %q; want degraded, timeout", h.Status, h.Reason)
	}
	if !eventually(func() bool { return l.Health().Status == "healthy" }) {
		t.Errorf("Redis thawed: still %q after 10 s without traffic", l.Health().Status)
	}
}

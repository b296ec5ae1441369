package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Misconfiguration refuses to start: Check, against a real redis-server set
// up wrong, fails within seconds with an error that wraps the kind and
// names the root cause, and the limiter is degraded from the start
// (issue 12.8).
func TestCheckNamesRedisMisconfiguration(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) *redis.Options
		kind  error
		cause []string // one of these is in the error
	}{
		{"no password", func(t *testing.T) *redis.Options {
			return &redis.Options{Addr: redistest.ServerWith(t, "requirepass s3cret").Addr}
		}, backend.ErrAuth, []string{"NOAUTH", "unauthenticated"}},
		{"wrong password", func(t *testing.T) *redis.Options {
			return &redis.Options{Addr: redistest.ServerWith(t, "requirepass s3cret").Addr, Password: "guess"}
		}, backend.ErrAuth, []string{"WRONGPASS"}},
		{"read-only replica", func(t *testing.T) *redis.Options {
			master := redistest.Server(t)
			_, port, _ := net.SplitHostPort(master.Addr)
			return &redis.Options{Addr: redistest.ServerWith(t, "replicaof 127.0.0.1 "+port).Addr}
		}, backend.ErrReadOnly, []string{"READONLY"}},
		{"full", func(t *testing.T) *redis.Options {
			inst := redistest.Server(t)
			inst.Fill(t)
			return &redis.Options{Addr: inst.Addr}
		}, backend.ErrOutOfMemory, []string{"OOM"}},
		{"unreachable", func(t *testing.T) *redis.Options {
			inst := redistest.Server(t)
			inst.Kill()
			return &redis.Options{Addr: inst.Addr}
		}, backend.ErrUnreachable, []string{"refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(tc.setup(t))
			defer c.Close()
			l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 3, Period: time.Hour}},
				WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))),
				WithLogger(slog.New(slog.DiscardHandler)))
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err := l.Check(ctx)
			took := time.Since(start)
			t.Logf("%v: %v", took, err)
			if !errors.Is(err, tc.kind) {
				t.Errorf("Check: %v, want it to wrap %v", err, tc.kind)
			}
			if err != nil && !containsAny(err.Error(), tc.cause) {
				t.Errorf("Check: %v, want it to name the cause (%s)", err, strings.Join(tc.cause, " or "))
			}
			if took > 5*time.Second {
				t.Errorf("Check took %v, want a few seconds at most", took)
			}
			if h := l.Health(); h.Status != "degraded" || h.Reason != KindOf(tc.kind) {
				t.Errorf("health after the check: %+v, want degraded, reason %q", h, KindOf(tc.kind))
			}
		})
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

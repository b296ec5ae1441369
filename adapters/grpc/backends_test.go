package ceilinggrpc_test

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// onBackends runs fn on the memory backend and on a real redis-server,
// each with its own keys; opts are the limiter options fn is to use.
func onBackends(t *testing.T, fn func(t *testing.T, opts ...ceiling.Option)) {
	quiet := ceiling.WithLogger(slog.New(slog.DiscardHandler))
	t.Run("memory", func(t *testing.T) { fn(t, quiet) })
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Shared(t).Client(t)
		// These tests count exact outcomes, not timeouts: on a loaded machine
		// a decision past the default 100 ms is a failed call, which may
		// have been applied (stored ≤ admitted + failed) and skews the count.
		fn(t, quiet, ceiling.WithKeySecret([]byte("a test key secret of thirty-two bytes")), ceiling.WithTimeout(2*time.Second),
			ceiling.WithBackend(ceilingredis.New(rdb, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))))
	})
}

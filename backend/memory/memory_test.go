package memory

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		s := New(WithClock(now))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestConformanceSmallShards runs the suite with a store of one shard and
// a tight key bound, so that multi-key calls share a lock and tables grow
// and shrink under the suite's traffic.
func TestConformanceOneShard(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		s := New(WithClock(now), WithMaxKeys(100), WithSweepInterval(0))
		if got := len(s.shards); got != 1 {
			t.Fatalf("%d shards for 100 keys, want 1", got)
		}
		return s
	})
}

var ctx = context.Background()

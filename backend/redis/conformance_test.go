package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// TestConformance runs the suite every backend passes, against miniredis
// (always), a real redis-server and a three-master cluster (when
// redis-server is installed), each with the default deny cache on.
func TestConformance(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
				return New(client, WithClock(now))
			})
		})
	}
}

// TestConformanceWithoutDenyCache runs the suite with every decision going
// to Redis, so the script alone is held to the same answers, on the real
// servers (miniredis, slow under the suite's 1000 goroutines, runs it once
// above).
func TestConformanceWithoutDenyCache(t *testing.T) {
	for _, tg := range targets[1:] {
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
				return New(client, WithClock(now), WithDenyCache(0))
			})
		})
	}
}

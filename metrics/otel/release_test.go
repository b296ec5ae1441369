package ceilingotel_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
)

// refusing is a remote backend whose every call is refused.
type refusing struct{}

func (refusing) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, fmt.Errorf("%w: connection refused", backend.ErrUnreachable)
}

func (refusing) Reset(context.Context, ...string) error { return nil }

// A program that rebuilds its limiter on reload, closing the old one, and
// keeps one observer: the closed limiter and its store must not stay
// reachable from the observer, read at every collection for ever.
func TestClosedLimiterIsReleasedByTheObserver_Attack(t *testing.T) {
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Minute}},
		ceiling.WithObserver(obs), quiet)
	w := weak.Make(l)
	l.Close()
	l = nil
	for range 5 {
		runtime.GC()
	}
	if w.Value() != nil {
		t.Error("the closed limiter is still reachable from the observer")
	}
	collect()
	runtime.KeepAlive(obs)
}

// A limiter closed while degraded reports no recovery: after the next
// collection it no longer holds the shared degraded gauge at 1, while
// another limiter still degraded does.
func TestLimiterClosedDegradedReleasesTheGauge(t *testing.T) {
	obs, collect := sdkObserver(t)
	degraded := func() *ceiling.Limiter {
		l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Minute}},
			ceiling.WithBackend(refusing{}), ceiling.WithObserver(obs),
			ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 1, CoolDown: time.Hour}), quiet)
		if err := l.Check(context.Background()); err == nil {
			t.Fatal("Check passed on a refusing backend")
		}
		if s := l.Health().Status; s != "degraded" {
			t.Fatalf("status %q, want degraded", s)
		}
		return l
	}
	a, b := degraded(), degraded()
	a.Close()
	for range 2 { // a collection releases a only once
		expect(t, collect(), map[string]float64{"ceiling.rate_limiting.degraded{}": 1})
	}
	b.Close()
	expect(t, collect(), map[string]float64{"ceiling.rate_limiting.degraded{}": 0, "ceiling.rate_limiting.degraded.transitions{}": 2})
}

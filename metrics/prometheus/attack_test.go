package ceilingprom_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/ceiling-go/ceiling"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// One observer shared by two limiters: while one of them is still
// degraded, the other's recovery must not clear the degraded gauge, or
// CeilingDegraded stops firing while fail modes still decide.
func TestSharedDegradedGaugeHoldsWhileOneLimiterIsDegraded_Attack(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	gauge := func(v string) string {
		return "# HELP ceiling_rate_limiting_degraded 1 while the backend is not called (circuit breaker open) and fail modes decide, else 0.\n" +
			"# TYPE ceiling_rate_limiting_degraded gauge\nceiling_rate_limiting_degraded " + v + "\n"
	}
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true}) // limiter A
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true}) // limiter B
	obs.ObserveDegraded(ceiling.DegradedEvent{})               // B recovers; A is still degraded
	if err := testutil.CollectAndCompare(obs, strings.NewReader(gauge("1")), "ceiling_rate_limiting_degraded"); err != nil {
		t.Errorf("one of two limiters still degraded: %v", err)
	}
	obs.ObserveDegraded(ceiling.DegradedEvent{}) // A recovers
	if err := testutil.CollectAndCompare(obs, strings.NewReader(gauge("0")), "ceiling_rate_limiting_degraded"); err != nil {
		t.Errorf("both recovered: %v", err)
	}
}

// A program that rebuilds its limiter on a configuration reload, closing
// the old one, and keeps one observer (it stays registered): the closed
// limiter, its store with every key it held, must not stay reachable from
// the observer, read at every scrape for ever.
func TestClosedLimiterIsReleasedByTheObserver_Attack(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Minute}},
		ceiling.WithObserver(obs))
	w := weak.Make(l)
	l.Close()
	l = nil
	for range 5 {
		runtime.GC()
	}
	if w.Value() != nil {
		t.Error("the closed limiter is still reachable from the observer")
	}
	runtime.KeepAlive(obs)
}

// A limiter closed while degraded reports no recovery: after the next
// scrape it no longer holds the shared degraded gauge at 1, while another
// limiter still degraded does.
func TestLimiterClosedDegradedReleasesTheGauge(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	gauge := func(v string) string {
		return "# HELP ceiling_rate_limiting_degraded 1 while the backend is not called (circuit breaker open) and fail modes decide, else 0.\n" +
			"# TYPE ceiling_rate_limiting_degraded gauge\nceiling_rate_limiting_degraded " + v + "\n"
	}
	degraded := func() *ceiling.Limiter {
		l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Minute}},
			ceiling.WithBackend(&flaky{down: true}), ceiling.WithObserver(obs),
			ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 1, CoolDown: time.Hour}),
			ceiling.WithLogger(slog.New(slog.DiscardHandler)))
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
	if s := a.Health().Status; s != "closed" {
		t.Errorf("closed limiter's status %q, want closed", s)
	}
	for range 2 { // a collection releases a only once
		if err := testutil.CollectAndCompare(obs, strings.NewReader(gauge("1")), "ceiling_rate_limiting_degraded"); err != nil {
			t.Errorf("one closed, one still degraded: %v", err)
		}
	}
	b.Close()
	if err := testutil.CollectAndCompare(obs, strings.NewReader(gauge("0")), "ceiling_rate_limiting_degraded"); err != nil {
		t.Errorf("both closed degraded: %v", err)
	}
}

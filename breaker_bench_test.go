package ceiling

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// admitAll answers instantly and admits everything, so that benchmarks
// measure the middleware and not a store. remote makes it look like a
// backend that does I/O (timeout, breaker).
type admitAll struct{ remote bool }

func (a admitAll) InProcess() bool { return !a.remote }

func (admitAll) DecideInto(_ context.Context, reqs []backend.Request, out []backend.Result) error {
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return nil
}

func (a admitAll) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, a.DecideInto(ctx, reqs, out)
}

func (admitAll) Reset(context.Context, ...string) error { return nil }

var benchRules = []Rule{
	{Name: "ip", Key: RemoteAddr, Limit: 1e9, Period: time.Minute},
	{Name: "global", Key: Static("all"), Limit: 1e9, Period: time.Minute},
}

// openLimiter returns a limiter whose breaker is open and stays open.
func openLimiter(t *testing.T, mode FailMode) *Limiter {
	l := MustNew(benchRules, WithBackend(&flaky{err: errDown}), WithFailMode(mode), withLocalStore(admitAll{}),
		WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
	get(t, l.Handler(okHandler))
	if l.Health().Status != "degraded" {
		t.Fatal("breaker did not open")
	}
	return l
}

func benchHandler(b *testing.B, h http.Handler) {
	b.ReportAllocs()
	r := httptest.NewRequest("GET", "/", nil)
	w := &discardWriter{h: http.Header{}}
	b.ResetTimer()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkMiddlewareBreakerOpen compares a request decided by an instant
// in-process backend with one decided by the fail mode while the breaker is
// open: the open breaker adds no measurable latency.
func BenchmarkMiddlewareBreakerOpen(b *testing.B) {
	b.Run("baseline=instant-in-process", func(b *testing.B) {
		benchHandler(b, MustNew(benchRules, WithBackend(admitAll{})).Handler(okHandler))
	})
	b.Run("open/fail=open", func(b *testing.B) {
		benchHandler(b, openLimiterB(b, FailOpen).Handler(okHandler))
	})
	b.Run("open/fail=local", func(b *testing.B) {
		benchHandler(b, openLimiterB(b, FailLocal).Handler(okHandler))
	})
	b.Run("open/fail=closed", func(b *testing.B) {
		benchHandler(b, openLimiterB(b, FailClosed).Handler(okHandler))
	})
	quiet := WithLogger(slog.New(slog.DiscardHandler))
	b.Run("healthy-remote=instant", func(b *testing.B) {
		benchHandler(b, MustNew(benchRules, WithBackend(admitAll{remote: true}), quiet).Handler(okHandler))
	})
}

func openLimiterB(b *testing.B, mode FailMode) *Limiter {
	l := MustNew(benchRules, WithBackend(&flaky{err: errDown}), WithFailMode(mode), withLocalStore(admitAll{}),
		WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
	l.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if l.Health().Status != "degraded" {
		b.Fatal("breaker did not open")
	}
	return l
}

// The open breaker's fallback allocates no more than a healthy in-process
// decision, and observing nothing costs nothing.
func TestBreakerOpenAddsNoAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	allocs := func(h http.Handler) float64 {
		r := httptest.NewRequest("GET", "/", nil)
		w := &discardWriter{h: http.Header{}}
		return testing.AllocsPerRun(200, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		})
	}
	base := allocs(MustNew(benchRules, WithBackend(admitAll{})).Handler(okHandler))
	for _, mode := range []FailMode{FailOpen, FailLocal} {
		if got := allocs(openLimiter(t, mode).Handler(okHandler)); got > base {
			t.Errorf("breaker open, failing %v: %v allocations per request, healthy in-process: %v", mode, got, base)
		}
	}
}

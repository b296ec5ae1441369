package ceilingotel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

var quiet = ceiling.WithLogger(slog.New(slog.DiscardHandler))

var ok = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// breakable is a memory store behind the bare Backend contract, as a
// remote backend would be, that fails once broken.
type breakable struct {
	store  *memory.Store
	broken atomic.Bool
}

func (b *breakable) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if b.broken.Load() {
		return nil, errors.New("dial tcp 127.0.0.1:1: connection refused")
	}
	return b.store.Decide(ctx, reqs)
}

func (b *breakable) Reset(ctx context.Context, keys ...string) error {
	return b.store.Reset(ctx, keys...)
}

// traced starts a span around each request, as otelhttp does, on a tracer
// provider whose spans rec records.
func traced(t *testing.T, h http.Handler) (http.Handler, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tr := tp.Tracer("test")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tr.Start(r.Context(), "POST /api/chat")
		defer span.End()
		h.ServeHTTP(w, r.WithContext(ctx))
	}), rec
}

func newObserver(t *testing.T) *ceilingotel.Observer {
	t.Helper()
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

// attrs is a span's attributes under ceiling's namespace, as key=value.
func attrs(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, kv := range s.Attributes() {
		out = append(out, string(kv.Key)+"="+kv.Value.Emit())
	}
	slices.Sort(out)
	return out
}

// The decision is recorded on the request's span, the one the HTTP
// instrumentation started: no span of ceiling's own, the rule that
// decided, the result, the fail mode when one decided, and on a refusal
// the Retry-After that the response carries.
func TestDecisionIsRecordedOnTheRequestsSpan(t *testing.T) {
	be := &breakable{store: memory.New()}
	t.Cleanup(func() { be.store.Close() })
	obs := newObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:minute", Key: ceiling.Static("s"), Limit: 3, Period: time.Minute, Algorithm: ceiling.SlidingLog, FailMode: ceiling.FailOpen},
		{Name: "chat:day", Key: ceiling.Static("s"), Limit: 2, Period: 24 * time.Hour, Algorithm: ceiling.SlidingLog, FailMode: ceiling.FailOpen},
		{Name: "chat:new", Key: ceiling.Static("s"), Limit: 1, Period: time.Hour, Shadow: true},
	}, ceiling.WithBackend(be), ceiling.WithObserver(obs), quiet,
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 100, CoolDown: time.Hour}))
	t.Cleanup(func() { l.Close() })
	h, rec := traced(t, l.Handler(ok))

	var retryAfter []string
	send := func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/api/chat", nil))
		retryAfter = append(retryAfter, w.Header().Get("Retry-After"))
	}
	send()
	send()
	send() // the day's two are spent
	be.broken.Store(true)
	send() // failing open

	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans ended, want the 4 requests' own", len(spans))
	}
	want := [][]string{
		// chat:day has 1 left, chat:minute 2: the day is nearest.
		{"ceiling.rate_limiting.result=allowed", "ceiling.rate_limiting.rule=chat:day"},
		{"ceiling.rate_limiting.result=allowed", "ceiling.rate_limiting.rule=chat:day"},
		{"ceiling.rate_limiting.result=rejected", "ceiling.rate_limiting.retry_after=" + retryAfter[2], "ceiling.rate_limiting.rule=chat:day"},
		// Nothing counted it: no rule decided.
		{"ceiling.rate_limiting.fail_mode=open", "ceiling.rate_limiting.result=fail_open"},
	}
	for i, s := range spans {
		if got := attrs(s); !slices.Equal(got, want[i]) {
			t.Errorf("request %d: span attributes %q, want %q", i+1, got, want[i])
		}
	}
	if n, err := strconv.Atoi(retryAfter[2]); err != nil || n < 86000 {
		t.Errorf("the 429's Retry-After %q is not the day's wait", retryAfter[2])
	}
}

// A request refused failing closed is "fail_closed", the rule failing
// closed is named, and its Retry-After is the 503's.
func TestFailClosedIsRecordedOnTheSpan(t *testing.T) {
	be := &breakable{store: memory.New()}
	t.Cleanup(func() { be.store.Close() })
	be.broken.Store(true)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:to", Key: ceiling.Static("s"), Limit: 3, Period: time.Hour, FailMode: ceiling.FailClosed},
	}, ceiling.WithBackend(be), ceiling.WithObserver(newObserver(t)), quiet)
	t.Cleanup(func() { l.Close() })
	h, rec := traced(t, l.Handler(ok))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/otp", nil))
	if w.Code != 503 {
		t.Fatalf("status %d, want 503", w.Code)
	}
	want := []string{"ceiling.rate_limiting.fail_mode=closed", "ceiling.rate_limiting.result=fail_closed",
		"ceiling.rate_limiting.retry_after=" + w.Header().Get("Retry-After"), "ceiling.rate_limiting.rule=otp:to"}
	if got := attrs(rec.Ended()[0]); !slices.Equal(got, want) {
		t.Errorf("span attributes %q, want %q", got, want)
	}
}

// A request shed because this process could not send its call is "shed",
// not a fail mode's doing: no fail_mode attribute, though its rule fails
// open.
func TestShedIsRecordedOnTheSpan(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.Static("s"), Limit: 3, Period: time.Hour, FailMode: ceiling.FailOpen},
	}, ceiling.WithBackend(notSent{}), ceiling.WithObserver(newObserver(t)), quiet)
	t.Cleanup(func() { l.Close() })
	h, rec := traced(t, l.Handler(ok))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/chat", nil))
	if w.Code != 503 {
		t.Fatalf("status %d, want 503", w.Code)
	}
	want := []string{"ceiling.rate_limiting.result=shed",
		"ceiling.rate_limiting.retry_after=" + w.Header().Get("Retry-After"), "ceiling.rate_limiting.rule=chat"}
	if got := attrs(rec.Ended()[0]); !slices.Equal(got, want) {
		t.Errorf("span attributes %q, want %q", got, want)
	}
}

// A 429 leaves out a Hidden rule when a listed rule rejects too, and the
// span says what the response says: the listed rule, and its wait.
func TestSpanNamesWhatTheResponseNames(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:to", Key: ceiling.Static("victim"), Limit: 1, Period: 24 * time.Hour, Hidden: true},
		{Name: "otp:ip", Key: ceiling.Static("me"), Limit: 1, Period: time.Minute},
	}, ceiling.WithObserver(newObserver(t)), quiet)
	t.Cleanup(func() { l.Close() })
	h, rec := traced(t, l.Handler(ok))
	var w *httptest.ResponseRecorder
	for range 2 {
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/otp", nil))
	}
	if w.Code != 429 {
		t.Fatalf("status %d, want 429", w.Code)
	}
	want := []string{"ceiling.rate_limiting.result=rejected", "ceiling.rate_limiting.retry_after=" + w.Header().Get("Retry-After"), "ceiling.rate_limiting.rule=otp:ip"}
	if got := attrs(rec.Ended()[1]); !slices.Equal(got, want) {
		t.Errorf("span attributes %q, want %q (Retry-After %s)", got, want, w.Header().Get("Retry-After"))
	}
}

// Without a recording span in the context (no span, or one the sampler
// dropped) the observer records nothing and allocates nothing.
func TestNoRecordingSpanCostsNoAllocation(t *testing.T) {
	obs := newObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.Static("s"), Limit: 1, Period: time.Minute}}, quiet)
	t.Cleanup(func() { l.Close() })
	d, err := l.Decide(context.Background(), ceiling.Input{Rule: "r", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	dropped, span := tp.Tracer("test").Start(context.Background(), "dropped")
	defer span.End()
	for name, ctx := range map[string]context.Context{"no span": context.Background(), "unsampled span": dropped} {
		if n := testing.AllocsPerRun(100, func() { obs.ObserveRequest(ctx, &d, nil) }); n != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", name, n)
		}
	}
	// The same decision on a recording span does record: the path above
	// is skipped because nothing records, not because nothing works.
	rec := tracetest.NewSpanRecorder()
	on := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { on.Shutdown(context.Background()) })
	ctx, live := on.Tracer("test").Start(context.Background(), "live")
	obs.ObserveRequest(ctx, &d, nil)
	live.End()
	if got := rec.Ended()[0].Attributes(); !slices.Contains(got, attribute.String("ceiling.rate_limiting.result", "allowed")) {
		t.Errorf("recording span got %v", got)
	}
}

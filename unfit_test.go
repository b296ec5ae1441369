package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A cost the client chooses past backend.MaxLimit is a rejection that no
// wait cures, as a cost over the limit is: on the memory backend with
// FailOpen it was the backend's ErrInvalidRequest, and FailOpen admitted
// it (100 of 100 where cost 6 admitted 0).
func TestCostOverMaximumIsARejection_FailOpenRegression(t *testing.T) {
	l := MustNew([]Rule{{Name: "api", Limit: 5, Period: time.Minute}}, WithFailMode(FailOpen))
	defer l.Close()
	for _, cost := range []int64{6, backend.MaxLimit, backend.MaxLimit + 1, 1 << 40, math.MaxInt64} {
		admitted := 0
		for range 100 {
			d, err := l.Decide(t.Context(), Input{Rule: "api", Key: "k", Cost: cost})
			if err != nil {
				t.Fatalf("cost %d: %v, want a rejection", cost, err)
			}
			if d.Allowed {
				admitted++
			}
			if d.RetryAfter != backend.Never || d.Results[0].Fallback != inherit {
				t.Fatalf("cost %d: RetryAfter %v, fallback %v; want Never, decided without a fail mode", cost, d.RetryAfter, d.Results[0].Fallback)
			}
		}
		if admitted != 0 {
			t.Errorf("cost %d on a limit of 5: %d of 100 admitted, want 0", cost, admitted)
		}
	}
	// Nothing was consumed: the whole budget is still there.
	if d, _ := l.Decide(t.Context(), Input{Rule: "api", Key: "k", Cost: 5}); !d.Allowed {
		t.Errorf("cost 5 after the refusals: refused, want the full budget")
	}
}

// An Estimate read from the body is the client's number: past the maximum
// it is a 429 like any estimate over the budget (it was a 200 for
// 1,000,000,001 and 2^40, where 10,001 got 429).
func TestEstimateOverMaximumIs429_Regression(t *testing.T) {
	maxTokens := Must(BodyField("max_tokens"))
	l := MustNew([]Rule{{Name: "tokens", Key: Static("shop"), Limit: 10_000, Period: time.Minute,
		Estimate: func(r *http.Request) (int64, error) {
			v, err := maxTokens(r)
			if err != nil {
				return 0, err
			}
			return strconv.ParseInt(v, 10, 64)
		}}}, WithFailMode(FailOpen))
	defer l.Close()
	h := l.Handler(okHandler)
	for _, n := range []string{"10001", "999999999", "1000000001", "1099511627776", "9223372036854775807"} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(`{"max_tokens":`+n+`}`))
		r.Header.Set("Content-Type", "application/json")
		if w := serve(t, h, r); w.Code != http.StatusTooManyRequests {
			t.Errorf("max_tokens %s against 10,000: %d, want 429", n, w.Code)
		}
	}
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"max_tokens":10000}`))
	r.Header.Set("Content-Type", "application/json")
	if w := serve(t, h, r); w.Code != 200 {
		t.Errorf("max_tokens 10000 after the refusals: %d, want 200 (nothing consumed)", w.Code)
	}
}

// A shadow rule whose cost cannot fit reports a rejection and does not
// block the request; the enforced rule is decided as usual.
func TestShadowCostOverMaximumIsReportedNotBlocking(t *testing.T) {
	l := MustNew([]Rule{{Name: "a", Limit: 5, Period: time.Minute}, {Name: "s", Limit: 5, Period: time.Minute, Shadow: true}})
	defer l.Close()
	d, err := l.Decide(t.Context(), Input{Rule: "a", Key: "k"}, Input{Rule: "s", Key: "k", Cost: 1 << 40})
	if err != nil || !d.Allowed || d.Results[1].Allowed || d.Results[1].RetryAfter != backend.Never || d.Results[0].Remaining != 4 {
		t.Fatalf("Decide: %+v, %v; want admitted by a, s refused with Never, a at 4 left", d, err)
	}
}

// invalidBackend refuses every call as invalid, as a backend with
// narrower bounds than the limiter's checks would.
type invalidBackend struct{ flaky }

func (*invalidBackend) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if isProbe(reqs) {
		return []backend.Result{{Allowed: true}}, nil
	}
	return nil, fmt.Errorf("%w: key %q: too large for this store", backend.ErrInvalidRequest, reqs[0].Key)
}

// A backend's ErrInvalidRequest is about what it was sent, never its
// health: it does not move the breaker, and no fail mode admits it.
func TestInvalidRequestNeverMovesTheBreaker(t *testing.T) {
	l := MustNew([]Rule{{Name: "api", Limit: 5, Period: time.Minute}},
		WithBackend(&invalidBackend{}), WithFailMode(FailOpen), WithBreaker(BreakerConfig{Failures: 1}))
	defer l.Close()
	for range 10 {
		d, err := l.Decide(t.Context(), Input{Rule: "api", Key: "k"})
		var le *LimitError
		if d.Allowed || !errors.As(err, &le) || !errors.Is(err, backend.ErrInvalidRequest) {
			t.Fatalf("Decide: allowed %v, %v; want a *LimitError wrapping ErrInvalidRequest", d.Allowed, err)
		}
		if err := l.Charge(t.Context(), Input{Rule: "api", Key: "k", Cost: 1}); !errors.Is(err, backend.ErrInvalidRequest) {
			t.Fatalf("Charge: %v, want ErrInvalidRequest", err)
		}
	}
	if h := l.Health(); h.Status != "healthy" || h.DegradedTotal != 0 || h.Rules[0].FailOpenAdmissions != 0 {
		t.Errorf("health %+v: want healthy, no transition, no fail-open admission", h)
	}
}

// Every invalid input the API accepts, sent at a limiter on a real Redis
// with a breaker that opens on the first failure: none of it reaches the
// breaker (0 transitions, no failure counted), and the other traffic is
// still limited. One client sending a cost of 1e9+1 every 150 ms opened
// the breaker 6 to 7 times in 3 s, switching limiting off for everybody.
func TestInvalidInputsNeverMoveTheBreakerRedis(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	store := ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
	rules := []Rule{
		{Name: "rolling", Key: Header("X-Key"), Limit: 5, Period: time.Minute},
		{Name: "log", Key: Header("X-Key"), Limit: 5, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "window", Key: Header("X-Key"), Limit: 5, Period: time.Minute, Algorithm: SlidingWindow},
		{Name: "fixed", Key: Header("X-Key"), Limit: 5, Period: time.Minute, Algorithm: FixedWindow},
		{Name: "gcra", Key: Header("X-Key"), Limit: 5, Period: time.Minute, Algorithm: GCRA, Burst: 5},
		{Name: "slots", Key: Header("X-Key"), Limit: 5, Period: 30 * time.Second, Algorithm: Concurrency},
	}
	// A patient timeout: only what the inputs do may move the breaker.
	opts := []Option{WithBackend(store), WithFailMode(FailOpen), WithBreaker(BreakerConfig{Failures: 1}),
		WithTimeout(5 * time.Second), WithLogger(slog.New(slog.DiscardHandler))}
	l := MustNew(rules, opts...)
	defer l.Close()
	ctx := t.Context()

	costs := []int64{0, -1, math.MinInt64, 6, backend.MaxLimit, backend.MaxLimit + 1, 1 << 40, math.MaxInt64}
	limits := []int64{0, -1, math.MinInt64, backend.MaxLimit + 1, 1 << 40, math.MaxInt64, MaxSlidingLogLimit + 1}
	keys := []string{"", strings.Repeat("k", 1<<20), "\x00\xff{tag}", "{", "}"}
	for _, r := range rules {
		for _, cost := range costs {
			d, _ := l.Decide(ctx, Input{Rule: r.Name, Key: "attacker", Cost: cost})
			d.Release()
			_ = l.Charge(ctx, Input{Rule: r.Name, Key: "attacker", Cost: cost})
		}
		for _, n := range limits {
			for _, in := range []Input{
				{Rule: r.Name, Key: "attacker", Limit: n},
				{Rule: r.Name, Key: "attacker", Burst: n},
				{Rule: r.Name, Key: "attacker", Limit: 1, Burst: n},
				{Rule: r.Name, Key: "attacker", Limit: n, Cost: n},
			} {
				d, _ := l.Decide(ctx, in)
				d.Release()
				in.Cost = 1
				_ = l.Charge(ctx, in)
			}
		}
		for _, k := range keys {
			d, _ := l.Decide(ctx, Input{Rule: r.Name, Key: k})
			d.Release()
			_ = l.Charge(ctx, Input{Rule: r.Name, Key: k, Cost: 1})
			_, _ = l.Peek(ctx, r.Name, k)
		}
		_, _ = l.Decide(ctx, Input{Rule: r.Name, Key: "a"}, Input{Rule: r.Name, Key: "b"})
		_ = l.Charge(ctx, Input{Rule: r.Name, Key: "attacker"})
	}
	_, _ = l.Decide(ctx, Input{Rule: "nope", Key: "a"})
	_, _ = l.Decide(ctx, Input{Rule: "gcra", Key: "attacker", Limit: 1, Burst: backend.MaxLimit, Cost: 1})

	// The same through HTTP: an Estimate, a per-request limit and a
	// settlement, each from the client's headers.
	num := func(r *http.Request, h string) int64 {
		n, _ := strconv.ParseInt(r.Header.Get(h), 10, 64)
		return n
	}
	hl := MustNew([]Rule{{Name: "tokens", Key: Header("X-Key"), Limit: 10_000, Period: time.Minute,
		Estimate: func(r *http.Request) (int64, error) { return num(r, "X-Cost"), nil },
		Limits:   func(r *http.Request) (int64, int64, error) { return num(r, "X-Limit"), 0, nil },
	}}, opts...)
	defer hl.Close()
	h := hl.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = Settle(r, "tokens", num(r, "X-Used"))
	}))
	for _, cost := range append(costs, 1) {
		for _, n := range limits {
			for _, used := range []int64{0, math.MaxInt64, -1} {
				r := httptest.NewRequest("POST", "/", nil)
				r.Header.Set("X-Key", "attacker")
				r.Header.Set("X-Cost", strconv.FormatInt(cost, 10))
				r.Header.Set("X-Limit", strconv.FormatInt(n, 10))
				r.Header.Set("X-Used", strconv.FormatInt(used, 10))
				serve(t, h, r)
			}
		}
	}

	for _, lim := range []*Limiter{l, hl} {
		if h := lim.Health(); h.Status != "healthy" || h.DegradedTotal != 0 || lim.backendFailures() != 0 {
			t.Errorf("after the invalid inputs: %+v with %d failures counted; want healthy, 0 transitions, 0 failures", h, lim.backendFailures())
		}
		for _, rh := range lim.Health().Rules {
			if rh.FailOpenAdmissions != 0 {
				t.Errorf("rule %s: %d admitted failing open, want 0", rh.Name, rh.FailOpenAdmissions)
			}
		}
	}
	for _, r := range rules {
		admitted := 0
		for range 10 {
			if d, err := l.Decide(ctx, Input{Rule: r.Name, Key: "victim"}); err == nil && d.Allowed {
				admitted++
				defer d.Release() // a slot is held to the end: the count is of slots at once
			}
		}
		if admitted != 5 {
			t.Errorf("rule %s: %d of 10 admitted for an honest caller, want the limit of 5", r.Name, admitted)
		}
	}
}

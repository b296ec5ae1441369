package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// recording is a scripted backend that also remembers whether each call's
// context was already done and which keys were reset. It stamps what it
// admits (a settlement refunds only stamped units).
type recording struct {
	scripted
	ctxErrs []error
	resets  []string
}

func (b *recording) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	b.mu.Lock()
	b.ctxErrs = append(b.ctxErrs, ctx.Err())
	b.mu.Unlock()
	out, err := b.scripted.Decide(ctx, reqs)
	for i := range out {
		if out[i].Allowed && reqs[i].Cost > 0 && reqs[i].Algorithm != Concurrency {
			out[i].Stamp = 1
		}
	}
	return out, err
}

func (b *recording) Reset(_ context.Context, keys ...string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resets = append(b.resets, keys...)
	return b.err
}

// fixed is an Estimate of n units whatever the request.
func fixed(n int64) func(*http.Request) (int64, error) {
	return func(*http.Request) (int64, error) { return n, nil }
}

// settling returns a handler that settles each rule to its cost.
func settling(t *testing.T, costs map[string]int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for rule, n := range costs {
			if err := Settle(r, rule, n); err != nil {
				t.Errorf("Settle(%q, %d): %v", rule, n, err)
			}
		}
	})
}

// costs lists a call's requests as "rule cost" with "!" for forced, in order.
func costs(reqs []backend.Request) string {
	var parts []string
	for _, r := range reqs {
		s := fmt.Sprintf("%s %d", ruleOf(r.Key), r.Cost)
		if r.Force {
			s += "!"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

var chatRules = []Rule{
	{Name: "chat:minute", Key: headerKey("X-Shop"), Limit: 30, Period: time.Minute, Algorithm: SlidingLog},
	{Name: "chat:tokens", Key: headerKey("X-Shop"), Limit: 200_000, Period: 24 * time.Hour, Estimate: fixed(2_000)},
	{Name: "chat:spend", Key: headerKey("X-Shop"), Limit: 50_000, Period: 24 * time.Hour, Estimate: fixed(0)},
}

func shopRequest() *http.Request {
	r := httptest.NewRequest("POST", "/chat", nil)
	r.Header.Set("X-Shop", "shop-1")
	return r
}

// The settlement table: what the handler reports, and the one backend call
// that follows (empty: none).
func TestSettleAppliesTheDifferenceInOneCall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		settled map[string]int64
		want    string
	}{
		{"used less: refund", map[string]int64{"chat:tokens": 1_500, "chat:spend": 1}, "chat:tokens -500"},
		{"used more: charge the excess", map[string]int64{"chat:tokens": 3_200, "chat:spend": 40}, "chat:tokens 1200!, chat:spend 39!"},
		{"exactly the estimate", map[string]int64{"chat:tokens": 2_000, "chat:spend": 1}, ""},
		{"nothing reported: the estimates stand", nil, "chat:spend -1"},
		{"excess capped at the capacity", map[string]int64{"chat:tokens": 900_000, "chat:spend": 1}, "chat:tokens 200000!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &recording{}
			h := MustNew(chatRules, WithBackend(be)).Handler(settling(t, tc.settled))
			serve(t, h, shopRequest())
			if got, want := costs(be.calls[0]), "chat:minute 1, chat:tokens 2000, chat:spend 1"; got != want {
				t.Errorf("admission = %q, want %q (an estimate of 0 reserves 1)", got, want)
			}
			var got string
			switch len(be.calls) {
			case 1:
			case 2:
				got = costs(be.calls[1])
			default:
				t.Fatalf("%d backend calls, want at most 2", len(be.calls))
			}
			if got != tc.want {
				t.Errorf("settlement = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRefusedRequestSettlesNothing(t *testing.T) {
	be := &recording{scripted: scripted{answers: map[string]backend.Result{"chat:tokens": {Allowed: false, Limit: 200_000, RetryAfter: time.Hour}}}}
	h := MustNew(chatRules, WithBackend(be)).Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a refused request reached the handler")
	}))
	w := serve(t, h, shopRequest())
	if w.Code != 429 {
		t.Fatalf("status = %d, want 429", w.Code)
	}
	if got, want := len(be.calls), 1; got != want {
		t.Errorf("backend calls = %d, want %d: a refusal reserved nothing", got, want)
	}
}

// A handler that panics after reporting its real cost is settled to it, and
// the panic goes on to the server.
func TestPanickingHandlerSettlesThenPanics(t *testing.T) {
	be := &recording{}
	h := MustNew(chatRules, WithBackend(be)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Settle(r, "chat:tokens", 2_600)
		panic("model client bug")
	}))
	func() {
		defer func() {
			if got := recover(); got != "model client bug" {
				t.Errorf("recovered %v, want the handler's panic", got)
			}
		}()
		serve(t, h, shopRequest())
	}()
	if got, want := len(be.calls), 2; got != want {
		t.Fatalf("backend calls = %d, want %d", got, want)
	}
	if got, want := costs(be.calls[1]), "chat:tokens 600!, chat:spend -1"; got != want {
		t.Errorf("settlement = %q, want %q", got, want)
	}
}

// The client hanging up does not undo the work: the settlement is made with
// a context that is not cancelled.
func TestSettlementSurvivesTheClientLeaving(t *testing.T) {
	be := &recording{}
	ctx, cancel := context.WithCancel(context.Background())
	h := MustNew(chatRules, WithBackend(be)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Settle(r, "chat:tokens", 5_000)
		cancel()
	}))
	serve(t, h, shopRequest().WithContext(ctx))
	if got, want := len(be.calls), 2; got != want {
		t.Fatalf("backend calls = %d, want %d", got, want)
	}
	if err := be.ctxErrs[1]; err != nil {
		t.Errorf("settlement context: %v, want live", err)
	}
}

func TestSettleRefusals(t *testing.T) {
	be := &recording{}
	var kept *http.Request
	errs := map[string]error{}
	h := MustNew(chatRules, WithBackend(be)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kept = r
		errs["negative"] = Settle(r, "chat:tokens", -1)
		errs["no estimate"] = Settle(r, "chat:minute", 1)
		errs["unknown"] = Settle(r, "chat:nope", 1)
	}))
	serve(t, h, shopRequest())
	errs["after return"] = Settle(kept, "chat:tokens", 1)
	errs["no limiter"] = Settle(httptest.NewRequest("GET", "/", nil), "chat:tokens", 1)
	for name, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ceiling: rule ") {
			t.Errorf("%s: err = %v, want an error naming the rule", name, err)
		}
		if name != "negative" && !errors.Is(err, ErrNotReserved) {
			t.Errorf("%s: err = %v, want ErrNotReserved", name, err)
		}
	}
	if got, want := len(be.calls), 2; got != want {
		t.Fatalf("backend calls = %d, want %d", got, want)
	}
	if got, want := costs(be.calls[1]), "chat:spend -1"; got != want {
		t.Errorf("settlement = %q, want %q: refused settlements change nothing", got, want)
	}
}

// A request that failed open reserved nothing, so there is nothing to
// settle; a shadow rule that did not fit reserved nothing either.
func TestNothingReservedNothingSettled(t *testing.T) {
	be := &recording{scripted: scripted{err: errors.New("down")}}
	var err error
	h := MustNew(chatRules, WithBackend(be), WithFailMode(FailOpen), WithLogger(discard())).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err = Settle(r, "chat:tokens", 10)
	}))
	serve(t, h, shopRequest())
	if !errors.Is(err, ErrNotReserved) {
		t.Errorf("Settle after failing open: err = %v, want ErrNotReserved", err)
	}
	if got, want := len(be.calls), 1; got != want {
		t.Errorf("backend calls = %d, want %d", got, want)
	}

	shadow := []Rule{{Name: "tokens", Key: Static("s"), Limit: 100, Period: time.Hour, Estimate: fixed(50), Shadow: true}}
	be = &recording{scripted: scripted{answers: map[string]backend.Result{"tokens": {Allowed: false, Limit: 100, RetryAfter: time.Minute}}}}
	h = MustNew(shadow, WithBackend(be)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err = Settle(r, "tokens", 80)
	}))
	if w := serve(t, h, shopRequest()); w.Code != 200 {
		t.Fatalf("shadow rule refused: %d", w.Code)
	}
	if !errors.Is(err, ErrNotReserved) || len(be.calls) != 1 {
		t.Errorf("shadow rule that did not fit: Settle err = %v, calls = %d; want ErrNotReserved, 1", err, len(be.calls))
	}
}

func TestEstimateErrorsAreBadInput(t *testing.T) {
	for _, tc := range []struct {
		est    func(*http.Request) (int64, error)
		status int
		calls  int
	}{
		{func(*http.Request) (int64, error) { return 0, errors.New("max_tokens: not a number") }, 400, 0},
		{func(*http.Request) (int64, error) { return 0, ErrBodyTooLarge }, 413, 0},
		{func(*http.Request) (int64, error) { return -5, nil }, 400, 0},
		{func(*http.Request) (int64, error) { return 0, ErrNoKey }, 200, 1}, // the default cost: only the Key leaves a rule out
	} {
		be := &recording{}
		rules := []Rule{{Name: "tokens", Key: Static("s"), Limit: 100, Period: time.Hour, Estimate: tc.est}}
		w := serve(t, MustNew(rules, WithBackend(be)).Handler(okHandler), httptest.NewRequest("POST", "/", nil))
		if w.Code != tc.status || len(be.calls) != tc.calls {
			t.Errorf("got %d with %d backend calls, want %d with %d: %s", w.Code, len(be.calls), tc.status, tc.calls, w.Body)
		}
	}
	if _, err := New([]Rule{{Name: "both", Key: Static("s"), Limit: 1, Period: time.Second, Cost: 1, Estimate: fixed(1)}}); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("Cost and Estimate together: err = %v", err)
	}
}

// Peek and Reset reach the very key the middleware decides on.
func TestPeekAndResetUseTheMiddlewaresKey(t *testing.T) {
	be := &recording{}
	l := MustNew(chatRules, WithBackend(be), WithKeySecret([]byte("0123456789abcdef0123456789abcdef")))
	serve(t, l.Handler(okHandler), shopRequest())
	stored := be.calls[0][1].Key

	if _, err := l.Peek(context.Background(), "chat:tokens", "shop-1"); err != nil {
		t.Fatal(err)
	}
	peek := be.calls[len(be.calls)-1]
	if len(peek) != 1 || peek[0].Key != stored || peek[0].Cost != 0 || peek[0].Force || peek[0].Limit != 200_000 {
		t.Errorf("peek sent %+v, want one request of cost 0 on %q", peek, stored)
	}
	if err := l.Reset(context.Background(), "chat:tokens", "shop-1"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(be.resets, ","); got != stored {
		t.Errorf("reset keys = %q, want %q", got, stored)
	}

	if _, err := l.Peek(context.Background(), "nope", "x"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Peek of an unknown rule: %v", err)
	}
	if err := l.Reset(context.Background(), "nope", "x"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Reset of an unknown rule: %v", err)
	}
	be.err = errors.New("down")
	if _, err := l.Peek(context.Background(), "chat:tokens", "x"); !errors.Is(err, be.err) || !strings.Contains(err.Error(), `"chat:tokens"`) {
		t.Errorf("Peek on a broken backend: %v", err)
	}
	if err := l.Reset(context.Background(), "chat:tokens", "x"); !errors.Is(err, be.err) {
		t.Errorf("Reset on a broken backend: %v", err)
	}
}

// A limiter without prefetches or estimates hands the handler the request it
// got: no context value, no copy.
func TestPlainLimiterPassesTheSameRequest(t *testing.T) {
	in := httptest.NewRequest("GET", "/", nil)
	var got *http.Request
	serve(t, MustNew(ipRule, WithBackend(&scripted{})).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
	})), in)
	if got != in {
		t.Error("the handler got a copy of the request from a limiter with nothing to carry")
	}
}

// A settlement the backend cannot take is not silent: it is logged with the
// rules whose charge was lost.
func TestFailedSettlementIsLogged(t *testing.T) {
	var logs syncBuffer
	be := &recording{}
	h := MustNew(chatRules, WithBackend(be), WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Settle(r, "chat:tokens", 9_000)
		Settle(r, "chat:spend", 1)
		be.mu.Lock()
		be.err = errors.New("connection reset")
		be.mu.Unlock()
	}))
	serve(t, h, shopRequest())
	be.mu.Lock()
	calls := len(be.calls) // the decision, the settlement, and perhaps its resend
	be.mu.Unlock()
	if calls < 2 {
		t.Fatalf("backend calls = %d, want the decision and the settlement", calls)
	}
	if s := logs.String(); !strings.Contains(s, "settlement failed") || !strings.Contains(s, "rules=[chat:tokens]") || !strings.Contains(s, "connection reset") {
		t.Errorf("log = %q, want the failed settlement of chat:tokens and its cause", s)
	}
}

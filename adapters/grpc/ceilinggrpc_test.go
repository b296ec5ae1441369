package ceilinggrpc_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/ceiling-go/ceiling/backend"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func apiLimiter(t *testing.T, limit int64, opts ...ceiling.Option) *ceiling.Limiter {
	t.Helper()
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "api", Limit: limit, Period: time.Minute, Algorithm: ceiling.SlidingLog},
	}, opts...)
	t.Cleanup(func() { l.Close() })
	return l
}

// serveLimiter serves the health service behind g's interceptors.
func serveLimiter(t *testing.T, g *ceilinggrpc.Limiter) *server {
	return serve(t, []grpc.UnaryServerInterceptor{g.UnaryServerInterceptor()}, []grpc.StreamServerInterceptor{g.StreamServerInterceptor()})
}

// A unary call over the limit is ResourceExhausted before its handler runs,
// with the wait in a RetryInfo and the rule in a QuotaFailure; another key
// has its own budget.
func TestUnaryOverTheLimitIsResourceExhaustedWithRetryInfo(t *testing.T) {
	g := ceilinggrpc.MustNew(apiLimiter(t, 2), []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")}})
	s := serveLimiter(t, g)
	errs := []error{s.check(t, "x-api-key", "k1"), s.check(t, "x-api-key", "k1"), s.check(t, "x-api-key", "k1"), s.check(t, "x-api-key", "k2")}
	if got, want := codesOf(errs...), []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.OK}; !equalCodes(got, want) {
		t.Fatalf("codes %v, want %v (%v)", got, want, errs)
	}
	if got, want := s.handled.Load(), int64(3); got != want {
		t.Errorf("%d calls reached the handler, want %d", got, want)
	}
	if d := retryDelay(errs[2]); d < 59*time.Second || d > time.Minute {
		t.Errorf("RetryInfo delay %v, want just under a minute", d)
	}
	if got, want := strings.Join(quotaSubjects(errs[2]), "; "), "api: 2 per 1m0s"; got != want {
		t.Errorf("QuotaFailure %q, want %q", got, want)
	}
	if got, want := status.Convert(errs[2]).Message(), "quota exceeded for api (2 per 60 s); retry in 60 s"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

// A stream is decided once, when it opens: over the limit it ends with
// ResourceExhausted and RetryInfo before its handler runs.
func TestStreamIsDecidedWhenItOpens(t *testing.T) {
	g := ceilinggrpc.MustNew(apiLimiter(t, 1), []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.FullMethod}})
	s := serveLimiter(t, g)
	first, second := s.watch(t), s.watch(t)
	if first != nil || status.Code(second) != codes.ResourceExhausted || retryDelay(second) <= 0 {
		t.Fatalf("streams: %v then %v, want OK then ResourceExhausted with RetryInfo", first, second)
	}
	if err := s.check(t); err != nil {
		t.Errorf("Check shares no budget with Watch under FullMethod: %v", err)
	}
	if got, want := s.handled.Load(), int64(2); got != want {
		t.Errorf("%d calls reached handlers, want %d", got, want)
	}
}

// down is a backend that cannot decide.
type down struct{ calls atomic.Int64 }

func (b *down) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	b.calls.Add(1)
	return nil, errors.New("connection refused")
}
func (b *down) Reset(context.Context, ...string) error { return nil }

// When the backend cannot decide and the rule fails closed, the call is
// Unavailable (not ResourceExhausted: nobody is over a limit) with a
// RetryInfo; failing open it is admitted.
func TestFailClosedIsUnavailableWithRetryInfo(t *testing.T) {
	quiet := ceiling.WithLogger(slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		mode ceiling.FailMode
		want codes.Code
	}{{ceiling.FailClosed, codes.Unavailable}, {ceiling.FailOpen, codes.OK}} {
		g := ceilinggrpc.MustNew(apiLimiter(t, 5, ceiling.WithBackend(&down{}), ceiling.WithFailMode(tc.mode), quiet),
			[]ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")}})
		s := serveLimiter(t, g)
		for _, err := range []error{s.check(t, "x-api-key", "k"), s.watch(t, "x-api-key", "k")} {
			if status.Code(err) != tc.want {
				t.Errorf("%v: %v, want %v", tc.mode, err, tc.want)
			}
			if tc.want == codes.Unavailable {
				if d := retryDelay(err); d < time.Second {
					t.Errorf("%v: RetryInfo delay %v, want at least a second", tc.mode, d)
				}
				if strings.Contains(err.Error(), "refused") {
					t.Errorf("%v: %v: the backend's error reached the client", tc.mode, err)
				}
			}
		}
		if tc.want == codes.Unavailable && s.handled.Load() != 0 {
			t.Errorf("%v: %d calls reached the handler", tc.mode, s.handled.Load())
		}
	}
}

// A key function's complaint is InvalidArgument, before any backend call.
func TestBadKeyIsInvalidArgumentBeforeTheBackend(t *testing.T) {
	be := &down{}
	g := ceilinggrpc.MustNew(apiLimiter(t, 5, ceiling.WithBackend(be)), []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")}})
	s := serveLimiter(t, g)
	err := s.check(t, "x-api-key", "a", "x-api-key", "b")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `rule "api"`) {
		t.Errorf("two different API keys: %v, want InvalidArgument naming the rule", err)
	}
	if n := be.calls.Load(); n != 0 {
		t.Errorf("%d backend calls, want none", n)
	}
	// Without the entry the rule does not apply, and nothing is asked.
	if err := s.check(t); err != nil || be.calls.Load() != 0 {
		t.Errorf("no API key: %v with %d backend calls, want OK with none", err, be.calls.Load())
	}
}

// A limit per plan from metadata, decided in the one call; a Limits
// function that fails is Internal without its cause, logged.
func TestLimitsPerCall(t *testing.T) {
	var logs bytes.Buffer
	plans := map[string]int64{"pro": 3, "free": 0}
	g := ceilinggrpc.MustNew(apiLimiter(t, 1), []ceilinggrpc.Rule{{
		Name: "api", Key: ceilinggrpc.Metadata("x-api-key"),
		Limits: func(ctx context.Context, _ string) (int64, int64, error) {
			p, err := ceilinggrpc.Metadata("x-plan")(ctx, "")
			if err != nil {
				return 0, 0, err
			}
			limit, ok := plans[p]
			if !ok {
				return 0, 0, errors.New("plan db: secret-dsn: unknown plan " + p)
			}
			return limit, 0, nil
		},
	}}, ceilinggrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	s := serveLimiter(t, g)
	var pro, free []error
	for range 4 {
		pro = append(pro, s.check(t, "x-api-key", "p", "x-plan", "pro"))
		free = append(free, s.check(t, "x-api-key", "f", "x-plan", "free"))
	}
	if got, want := codesOf(pro...), []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted}; !equalCodes(got, want) {
		t.Errorf("pro: %v, want %v", got, want)
	}
	if got, want := codesOf(free...), []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted, codes.ResourceExhausted}; !equalCodes(got, want) {
		t.Errorf("free: %v, want %v", got, want)
	}
	if got := quotaSubjects(pro[3]); len(got) != 1 || got[0] != "api: 3 per 1m0s" {
		t.Errorf("pro QuotaFailure %q, want the limit that applied", got)
	}
	err := s.check(t, "x-api-key", "x", "x-plan", "gold")
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "secret-dsn") {
		t.Errorf("unknown plan: %v, want Internal without the cause", err)
	}
	if !strings.Contains(logs.String(), "secret-dsn") || !strings.Contains(logs.String(), "rule=api") {
		t.Errorf("the cause was not logged with the rule:\n%s", logs.String())
	}
	// A limit out of range from Limits is refused the same way.
	plans["broken"] = -1
	if err := s.check(t, "x-api-key", "y", "x-plan", "broken"); status.Code(err) != codes.Internal {
		t.Errorf("limit -1: %v, want Internal", err)
	}
}

// New refuses bindings the limiter cannot honour.
func TestNewRefusesBadBindings(t *testing.T) {
	l := apiLimiter(t, 1)
	key := ceilinggrpc.FullMethod
	for _, tc := range []struct {
		rules []ceilinggrpc.Rule
		want  string
	}{
		{nil, "no rules"},
		{[]ceilinggrpc.Rule{{Name: "nope", Key: key}}, `rule "nope": the limiter declares no such rule`},
		{[]ceilinggrpc.Rule{{Name: "api", Key: key}, {Name: "api", Key: key}}, `rule "api": bound twice`},
		{[]ceilinggrpc.Rule{{Name: "api"}}, `rule "api": no Key`},
	} {
		if _, err := ceilinggrpc.New(l, tc.rules); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%v): %v, want an error saying %q", tc.rules, err, tc.want)
		}
	}
}

// A Hidden rule is named in a QuotaFailure, and its wait in RetryInfo, only
// when no other rule refuses the call too: a caller who spent its own
// budget learns nothing of a third party's key (issue 14).
func TestHiddenRuleIsNamedOnlyWhenAloneRefusing(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "dest", Limit: 1, Period: time.Hour, Algorithm: ceiling.SlidingLog, Hidden: true},
		{Name: "api", Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog},
	})
	t.Cleanup(func() { l.Close() })
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{
		{Name: "dest", Key: ceilinggrpc.Metadata("x-dest")},
		{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")},
	})
	s := serveLimiter(t, g)
	call := func(key, dest string) error { return s.check(t, "x-api-key", key, "x-dest", dest) }
	if errs := []error{call("k1", "d1"), call("k1", "d2")}; errs[0] != nil || errs[1] != nil {
		t.Fatalf("first calls: %v", errs)
	}
	both := call("k1", "d1") // api spent, and d1 at its limit
	if got := strings.Join(quotaSubjects(both), "; "); got != "api: 2 per 1m0s" {
		t.Errorf("both refusing: QuotaFailure %q, want only api", got)
	}
	if d := retryDelay(both); d > time.Minute {
		t.Errorf("both refusing: RetryInfo %v, want api's wait (under a minute), not the hidden rule's hour", d)
	}
	alone := call("k2", "d1")
	if got := strings.Join(quotaSubjects(alone), "; "); got != "dest: 1 per 1h0m0s" {
		t.Errorf("hidden rule alone refusing: QuotaFailure %q, want dest", got)
	}
	if d := retryDelay(alone); d < 59*time.Minute {
		t.Errorf("hidden rule alone refusing: RetryInfo %v, want about an hour", d)
	}
}

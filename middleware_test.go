package ceiling

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// scripted is a Backend whose answers a test dictates: for each request key
// prefix (the rule name) the result to return. It records every call.
type scripted struct {
	mu      sync.Mutex
	calls   [][]backend.Request
	answers map[string]backend.Result
	err     error
}

func (s *scripted) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, append([]backend.Request(nil), reqs...))
	if s.err != nil {
		return nil, s.err
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		rule := ruleOf(r.Key)
		res, ok := s.answers[rule]
		if !ok {
			res = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
		}
		out[i] = res
	}
	return out, nil
}

func (s *scripted) Reset(context.Context, ...string) error { return nil }

func (s *scripted) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Write([]byte("ok"))
})

func serve(t *testing.T, h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func headerKey(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", ErrNoKey
		}
		return v, nil
	}
}

func TestOneDecideCallCoversEveryApplicableRule(t *testing.T) {
	be := &scripted{}
	l := MustNew([]Rule{
		{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "user", Key: headerKey("X-User"), Limit: 5, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "global", Key: Static("all"), Limit: 100, Period: time.Hour, Algorithm: FixedWindow, Cost: 2},
	}, WithBackend(be))
	h := l.Handler(okHandler)

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "alice")
	serve(t, h, r)
	if got, want := be.callCount(), 1; got != want {
		t.Fatalf("Decide calls = %d, want %d", got, want)
	}
	reqs := be.calls[0]
	if got, want := len(reqs), 3; got != want {
		t.Fatalf("requests in the call = %d, want %d", got, want)
	}
	if reqs[1].Algorithm != SlidingLog || reqs[1].Limit != 5 || reqs[2].Cost != 2 || reqs[0].Cost != 1 {
		t.Errorf("requests do not carry their rules: %+v", reqs)
	}

	// Anonymous caller: the per-user rule does not apply and is left out.
	serve(t, h, httptest.NewRequest("GET", "/", nil))
	if got, want := len(be.calls[1]), 2; got != want {
		t.Fatalf("requests without X-User = %d, want %d", got, want)
	}
	for _, req := range be.calls[1] {
		if ruleOf(req.Key) == "user" {
			t.Errorf("the user rule was decided for an anonymous request: %q", req.Key)
		}
	}
}

func TestRejectedRequestNeverReachesNext(t *testing.T) {
	be := &scripted{answers: map[string]backend.Result{
		"ip": {Allowed: false, Limit: 10, RetryAfter: 1500 * time.Millisecond},
	}}
	reached := false
	h := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}}, WithBackend(be)).
		Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if reached {
		t.Fatal("a rejected request reached the next handler")
	}
	if got, want := w.Code, http.StatusTooManyRequests; got != want {
		t.Fatalf("status = %d, want %d", got, want)
	}
	if got, want := w.Header().Get("Retry-After"), "2"; got != want {
		t.Errorf("Retry-After = %q, want %q (1.5s rounded up)", got, want)
	}
	if got, want := w.Header().Get("Content-Type"), "application/problem+json"; got != want {
		t.Errorf("Content-Type = %q, want %q", got, want)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body is not JSON: %v: %s", err, w.Body)
	}
	if p.Type != quotaExceededType || p.Status != 429 || p.RetryAfter != 2 || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "ip" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem body = %+v", p)
	}
}

// Promise 5: with several rejecting rules the answer depends only on the
// declaration order and the state, not on which rule the backend evaluated
// first or which wait is longer.
func TestSeveralRejectionsAreDeterministic(t *testing.T) {
	answers := map[string]backend.Result{
		"minute": {Allowed: false, Limit: 30, RetryAfter: 10 * time.Second, ResetAfter: 50 * time.Second},
		"day":    {Allowed: false, Limit: 1000, RetryAfter: 3 * time.Hour, ResetAfter: 20 * time.Hour},
		"ip":     {Allowed: true, Limit: 300, Remaining: 200, ResetAfter: time.Second},
	}
	minute := Rule{Name: "minute", Key: Static("s"), Limit: 30, Period: time.Minute}
	day := Rule{Name: "day", Key: Static("s"), Limit: 1000, Period: 24 * time.Hour}
	ip := Rule{Name: "ip", Key: RemoteAddr, Limit: 300, Period: time.Minute}
	for _, tc := range []struct {
		rules     []Rule
		violated  []string
		ratelimit string
	}{
		// t: a rejecting rule's own wait. Only the rejecting rules' state:
		// "ip" did not decide this request.
		{[]Rule{minute, day, ip}, []string{"minute", "day"}, `"minute";r=0;t=10, "day";r=0;t=10800`},
		{[]Rule{ip, day, minute}, []string{"day", "minute"}, `"day";r=0;t=10800, "minute";r=0;t=10`},
	} {
		be := &scripted{answers: answers}
		w := serve(t, MustNew(tc.rules, WithBackend(be)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
		if got, want := w.Header().Get("Retry-After"), "10800"; got != want {
			t.Errorf("Retry-After = %q, want %q: the request is admitted only when every rule admits", got, want)
		}
		var p Problem
		json.Unmarshal(w.Body.Bytes(), &p)
		if got, want := strings.Join(p.ViolatedPolicies, ","), strings.Join(tc.violated, ","); got != want {
			t.Errorf("violated-policies = %q, want %q (declaration order)", got, want)
		}
		if got := w.Header().Get("RateLimit"); got != tc.ratelimit {
			t.Errorf("RateLimit = %q, want %q", got, tc.ratelimit)
		}
	}
}

// sfList matches an HTTP Structured Field list of sf-string items whose
// parameters are integers (RFC 8941 sections 3.1, 3.1.2, 3.3.3, 3.3.1).
var sfList = regexp.MustCompile(`^"[!#-\[\]-~]*"(;[a-z*][a-z0-9_.*-]*=-?[0-9]{1,15})*(, "[!#-\[\]-~]*"(;[a-z*][a-z0-9_.*-]*=-?[0-9]{1,15})*)*$`)

func TestIETFHeadersAreStructuredFields(t *testing.T) {
	be := &scripted{}
	h := MustNew([]Rule{
		{Name: "otp:phone", Key: Static("p"), Limit: 3, Period: 15 * time.Minute, Algorithm: SlidingLog},
		{Name: "otp:ip", Key: RemoteAddr, Limit: 20, Period: 15 * time.Minute},
		{Name: "otp:new", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
	}, WithBackend(be)).Handler(okHandler)
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	policy, state := w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit")
	if got, want := policy, `"otp:phone";q=3;w=900, "otp:ip";q=20;w=900`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := state, `"otp:phone";r=2;t=0, "otp:ip";r=19;t=0`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	for _, v := range []string{policy, state} {
		if !sfList.MatchString(v) {
			t.Errorf("%q does not parse as a structured field list", v)
		}
	}
}

func TestHeaderStyles(t *testing.T) {
	be := &scripted{answers: map[string]backend.Result{
		"a": {Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 2500 * time.Millisecond},
		"b": {Allowed: true, Limit: 5, Remaining: 1, ResetAfter: 9 * time.Second},
	}}
	rules := []Rule{{Name: "a", Key: Static("x"), Limit: 10, Period: time.Second}, {Name: "b", Key: Static("x"), Limit: 5, Period: time.Minute}}
	for _, tc := range []struct {
		style HeaderStyle
		want  map[string]string
	}{
		{HeadersRateLimit, map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "1", "RateLimit-Reset": "9", "RateLimit": "", "X-RateLimit-Limit": ""}},
		// The Unix time of the reset, as httprate, ulule/limiter and
		// express-rate-limit send it: the clock's 1_700_000_000.5 s plus
		// 9 s, rounded up.
		{HeadersXRateLimit, map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1700000010", "RateLimit-Limit": ""}},
		{HeadersNone, map[string]string{"RateLimit": "", "RateLimit-Policy": "", "RateLimit-Limit": "", "X-RateLimit-Limit": ""}},
	} {
		clock := func() time.Time { return time.Unix(1_700_000_000, 5e8) }
		w := serve(t, MustNew(rules, WithBackend(be), WithHeaders(tc.style), withClock(clock)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
		for k, v := range tc.want {
			if got := w.Header().Get(k); got != v {
				t.Errorf("style %d: %s = %q, want %q", tc.style, k, got, v)
			}
		}
	}
}

// X-RateLimit-Reset waits for the reset: a fraction of a second rounds up.
func TestEpochCeil(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want int64
	}{{time.Unix(10, 0), 10}, {time.Unix(10, 1), 11}, {time.Unix(10, 999_999_999), 11}} {
		if got := epochCeil(tc.t); got != tc.want {
			t.Errorf("epochCeil(%v) = %d, want %d", tc.t, got, tc.want)
		}
	}
}

func TestShadowRuleNeverRejects(t *testing.T) {
	be := &scripted{answers: map[string]backend.Result{"new": {Allowed: false, Limit: 1, RetryAfter: time.Minute}}}
	h := MustNew([]Rule{
		{Name: "old", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "new", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
	}, WithBackend(be)).Handler(okHandler)
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if w.Code != 200 || w.Header().Get("Retry-After") != "" {
		t.Fatalf("a shadow rejection refused the request: %d %q", w.Code, w.Header().Get("Retry-After"))
	}
	if got := be.calls[0]; len(got) != 2 || !got[1].Shadow || got[0].Shadow {
		t.Errorf("shadow flag not passed to the backend: %+v", got)
	}
}

func TestBadInputIsAProblemBeforeAnyBackendCall(t *testing.T) {
	be := &scripted{}
	for _, tc := range []struct {
		err    error
		status int
	}{
		{errors.New("phone: not a number"), 400},
		{ErrBodyTooLarge, 413},
		{&http.MaxBytesError{Limit: 1024}, 413},
	} {
		h := MustNew([]Rule{{Name: "otp", Key: func(*http.Request) (string, error) { return "", tc.err }, Limit: 3, Period: time.Minute}}, WithBackend(be)).Handler(okHandler)
		w := serve(t, h, httptest.NewRequest("POST", "/", nil))
		if w.Code != tc.status || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%v: got %d %q, want %d problem+json", tc.err, w.Code, w.Header().Get("Content-Type"), tc.status)
		}
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != tc.status || !strings.Contains(p.Detail, `"otp"`) {
			t.Errorf("%v: problem = %+v (%v)", tc.err, p, err)
		}
	}
	if n := be.callCount(); n != 0 {
		t.Errorf("backend called %d times for bad input", n)
	}
}

func TestBackendErrorAppliesFailMode(t *testing.T) {
	be := &scripted{err: errors.New("connection refused")}
	rules := []Rule{{Name: "ip", Key: RemoteAddr, Limit: 1, Period: time.Minute}}

	w := serve(t, MustNew(rules, WithBackend(be), WithFailMode(FailOpen)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if w.Code != 200 {
		t.Errorf("fail open: status %d, want 200", w.Code)
	}
	w = serve(t, MustNew(rules, WithBackend(be), WithFailMode(FailClosed)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), "refused") {
		t.Errorf("fail closed: %d Retry-After=%q body=%s; want 503 with Retry-After and no error text", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	// A rule may insist on failing closed even when its limiter fails open.
	closed := []Rule{{Name: "ip", Key: RemoteAddr, Limit: 1, Period: time.Minute, FailMode: FailClosed}}
	w = serve(t, MustNew(closed, WithBackend(be), WithFailMode(FailOpen)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if w.Code != 503 {
		t.Errorf("rule fail closed under limiter fail open: status %d, want 503", w.Code)
	}
}

func TestStoredKeysHoldNoRawValue(t *testing.T) {
	be := &scripted{}
	rules := []Rule{{Name: "otp:phone", Key: headerKey("X-Phone"), Limit: 3, Period: time.Minute}}
	keyFor := func(l *Limiter, phone string) string {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Phone", phone)
		serve(t, l.Handler(okHandler), r)
		return be.calls[len(be.calls)-1][0].Key
	}
	plain := MustNew(rules, WithBackend(be))
	secret := MustNew(rules, WithBackend(be), WithKeySecret([]byte("0123456789abcdef0123456789abcdef")))
	k1, k2 := keyFor(plain, "254700000000"), keyFor(plain, "{slot}"+strings.Repeat("9", 200))
	h1 := keyFor(secret, "254700000000")
	for _, k := range []string{k1, k2, h1} {
		if tag := tagOf(k); ruleOf(k) != "otp:phone" || len(tag) != 22 || strings.ContainsAny(tag, "{}") || strings.Contains(k, "2547") {
			t.Errorf("stored key %q: want {22 digest characters}:otp:phone, nothing raw", k)
		}
	}
	if k1 == k2 || k1 == h1 {
		t.Errorf("distinct values or secrets gave the same key: %q %q %q", k1, k2, h1)
	}
	if again := keyFor(plain, "254700000000"); again != k1 {
		t.Errorf("same value, different keys: %q %q", k1, again)
	}
}

func TestNewRejectsBadRules(t *testing.T) {
	ok := Rule{Name: "r", Key: RemoteAddr, Limit: 1, Period: time.Second}
	for _, tc := range []struct {
		name  string
		rules []Rule
		opts  []Option
		want  string
	}{
		{"none", nil, nil, "no rules"},
		{"no name", []Rule{{Key: RemoteAddr, Limit: 1, Period: time.Second}}, nil, "no name"},
		{"brace", []Rule{{Name: "a{b}", Key: RemoteAddr, Limit: 1, Period: time.Second}}, nil, `"a{b}"`},
		{"zero limit", []Rule{{Name: "z", Key: RemoteAddr, Period: time.Second}}, nil, `rule "z"`},
		{"tiny period", []Rule{{Name: "p", Key: RemoteAddr, Limit: 1, Period: time.Microsecond}}, nil, `rule "p"`},
		{"duplicate", []Rule{ok, ok}, nil, "declared twice"},
		{"cost", []Rule{{Name: "c", Key: RemoteAddr, Limit: 3, Period: time.Second, Cost: 4}}, nil, "never fit"},
		// A burst with the zero Algorithm was GCRA's before RollingWindow
		// became the default: refused, not silently dropped.
		{"burst without GCRA", []Rule{{Name: "b", Key: RemoteAddr, Limit: 3, Period: time.Second, Burst: 6}}, nil, "set Algorithm: ceiling.GCRA"},
		{"burst on a log", []Rule{{Name: "l", Key: RemoteAddr, Limit: 3, Period: time.Second, Burst: 6, Algorithm: SlidingLog}}, nil, "Burst is GCRA's"},
		{"short secret", []Rule{ok}, []Option{WithKeySecret([]byte("x"))}, "too short"},
		{"secret under 32 bytes", []Rule{ok}, []Option{WithKeySecret([]byte("0123456789abcdef0123456789abcde"))}, "want at least 32"},
		{"a sliding log of megabytes", []Rule{{Name: "l", Key: RemoteAddr, Limit: 50_000, Period: time.Hour, Algorithm: SlidingLog}}, nil, "at most 10000"},
		{"nil backend", []Rule{ok}, []Option{WithBackend(nil)}, "WithBackend(nil)"},
	} {
		_, err := New(tc.rules, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

// The bounds of TestNewRejectsBadRules are inclusive.
func TestNewAcceptsTheBounds(t *testing.T) {
	log := Rule{Name: "l", Key: RemoteAddr, Limit: MaxSlidingLogLimit, Period: time.Hour, Algorithm: SlidingLog}
	l, err := New([]Rule{log}, WithKeySecret([]byte("0123456789abcdef0123456789abcdef")))
	if err != nil {
		t.Fatalf("a sliding log of %d and a secret of 32 bytes: %v", MaxSlidingLogLimit, err)
	}
	l.Close()
}

// A backend that refused a call from a cache knows nothing of the other
// rules' state: the headers must not advertise a made-up "0 remaining".
func TestUnreadStateIsNotAdvertised(t *testing.T) {
	be := &scripted{answers: map[string]backend.Result{
		"minute": {Allowed: false, Limit: 30, RetryAfter: 20 * time.Second, ResetAfter: 40 * time.Second},
		"day":    {Allowed: true, Limit: 1000, Unread: true},
	}}
	rules := []Rule{
		{Name: "minute", Key: Static("s"), Limit: 30, Period: time.Minute},
		{Name: "day", Key: Static("s"), Limit: 1000, Period: 24 * time.Hour},
	}
	w := serve(t, MustNew(rules, WithBackend(be)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if got, want := w.Header().Get("RateLimit"), `"minute";r=0;t=20`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	be.answers["minute"] = backend.Result{Allowed: true, Limit: 30, Remaining: 5, Unread: true}
	be.answers["day"] = backend.Result{Allowed: true, Limit: 1000, Remaining: 7, ResetAfter: time.Hour}
	w = serve(t, MustNew(rules, WithBackend(be), WithHeaders(HeadersRateLimit)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if got, want := w.Header().Get("RateLimit-Remaining"), "7"; got != want {
		t.Errorf("RateLimit-Remaining = %q, want %q from the rule whose state was read", got, want)
	}
}

package ceiling

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/golang-jwt/jwt/v5"
)

// planLimits reads the verified "plan" claim: pro callers get 100 a
// minute, everybody else the rule's own 10.
func planLimits() func(*http.Request) (int64, int64, error) {
	plan := Must(JWTClaim("plan", hmacKey, []string{"HS256"}))
	return func(r *http.Request) (int64, int64, error) {
		p, err := plan(r)
		if err != nil {
			return 0, 0, err
		}
		if p == "pro" {
			return 100, 0, nil
		}
		return 0, 0, nil
	}
}

// A limit per plan from a verified JWT claim: free callers get 10 a
// minute, pro callers 100, each request in one backend call with the
// per-address rule, and the headers and the problem body show the limit
// that applied to that request.
func TestLimitsPerPlanFromAJWTClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) backend.Backend
	}{
		{"memory", func(*testing.T) backend.Backend { return nil }},
		{"redis", func(t *testing.T) backend.Backend {
			c := redistest.Shared(t).Client(t)
			return ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &countingObserver{}
			opts := []Option{WithObserver(obs)}
			if b := tc.backend(t); b != nil {
				opts = append(opts, WithBackend(b))
			}
			l := MustNew([]Rule{
				{Name: "api", Key: Must(JWTClaim("sub", hmacKey, []string{"HS256"})), Limit: 10, Period: time.Minute,
					Algorithm: SlidingLog, Limits: planLimits()},
				{Name: "ip", Key: RemoteAddr, Limit: 1000, Period: time.Minute, Algorithm: SlidingLog},
			}, opts...)
			defer l.Close()
			h := l.Handler(okHandler)
			exp := time.Now().Add(time.Hour).Unix()
			free := sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice", "plan": "free", "exp": exp})
			pro := sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "bob", "plan": "pro", "exp": exp})

			for _, p := range []struct {
				token  string
				limit  int
				policy string
			}{
				{free, 10, `"api";q=10;w=60, "ip";q=1000;w=60`},
				{pro, 100, `"api";q=100;w=60, "ip";q=1000;w=60`},
			} {
				calls := obs.calls.Load()
				for i := range p.limit + 1 {
					w := serve(t, h, bearerRequest(p.token))
					want := 200
					if i == p.limit {
						want = 429
					}
					if w.Code != want {
						t.Fatalf("limit %d, request %d: status %d, want %d", p.limit, i+1, w.Code, want)
					}
					if got := w.Header().Get("RateLimit-Policy"); got != p.policy {
						t.Fatalf("limit %d, request %d: RateLimit-Policy %q, want %q", p.limit, i+1, got, p.policy)
					}
					if i == 0 {
						if got, want := w.Header().Get("RateLimit"), `"api";r=`+itoa(p.limit-1)+`;t=0`; !strings.HasPrefix(got, want) {
							t.Errorf("limit %d: first RateLimit %q, want it to start %q", p.limit, got, want)
						}
					}
					if want == 429 {
						var pb Problem
						if err := json.Unmarshal(w.Body.Bytes(), &pb); err != nil {
							t.Fatal(err)
						}
						if wantDetail := "quota exceeded for api (" + itoa(p.limit) + " per 60 s)"; !strings.HasPrefix(pb.Detail, wantDetail) {
							t.Errorf("limit %d: problem detail %q, want it to start %q", p.limit, pb.Detail, wantDetail)
						}
					}
				}
				if got, want := obs.calls.Load()-calls, int64(p.limit+1); got != want {
					t.Errorf("limit %d: %d backend calls for %d requests, want one each", p.limit, got, want)
				}
			}

			// Without a token the per-user rule does not apply: the policy
			// advertises its default.
			anon := bearerRequest("")
			anon.RemoteAddr = "198.51.100.7:1"
			w := serve(t, h, anon)
			if got, want := w.Header().Get("RateLimit-Policy"), `"api";q=10;w=60, "ip";q=1000;w=60`; w.Code != 200 || got != want {
				t.Errorf("anonymous: %d with RateLimit-Policy %q, want 200 with %q", w.Code, got, want)
			}
		})
	}
}

func itoa(n int) string { return string(appendSeconds(nil, time.Duration(n)*time.Second)) }

// The single-policy header styles report the limit that applied too.
func TestLimitsInRateLimitLimitHeader(t *testing.T) {
	l := MustNew([]Rule{{Name: "api", Key: Must(JWTClaim("sub", hmacKey, []string{"HS256"})), Limit: 10, Period: time.Minute, Limits: planLimits()}},
		WithHeaders(HeadersXRateLimit))
	defer l.Close()
	pro := sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "bob", "plan": "pro"})
	w := serve(t, l.Handler(okHandler), bearerRequest(pro))
	if got, want := w.Header().Get("X-RateLimit-Limit"), "100"; got != want {
		t.Errorf("X-RateLimit-Limit %q, want %q", got, want)
	}
}

// A Limits function that fails, or gives a limit the backend cannot take,
// is the server's fault for that request: 500 naming the rule and not the
// cause, logged once a minute per rule, with nothing decided. ErrNoKey
// gives the rule's own limit.
func TestLimitsErrorIsAServerErrorForThatRequest(t *testing.T) {
	var logs bytes.Buffer
	be := newCounting()
	limits := map[string]func() (int64, int64, error){
		"broken":   func() (int64, int64, error) { return -5, 0, nil },
		"huge":     func() (int64, int64, error) { return backend.MaxLimit + 1, 0, nil },
		"badburst": func() (int64, int64, error) { return 0, -1, nil },
		"lookup":   func() (int64, int64, error) { return 0, 0, errors.New("tenant db: secret-dsn unreachable") },
		"noplan":   func() (int64, int64, error) { return 0, 0, ErrNoKey },
		"ok":       func() (int64, int64, error) { return 2, 0, nil },
	}
	l := MustNew([]Rule{
		{Name: "tenant", Key: headerKey("X-Tenant"), Limit: 10, Period: time.Minute,
			Limits: func(r *http.Request) (int64, int64, error) { return limits[r.Header.Get("X-Tenant")]() }},
		{Name: "ip", Key: RemoteAddr, Limit: 1000, Period: time.Minute},
	}, WithBackend(be), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer l.Close()
	h := l.Handler(okHandler)
	req := func(tenant string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Tenant", tenant)
		return r
	}
	for _, tenant := range []string{"broken", "huge", "badburst", "lookup", "lookup"} {
		w := serve(t, h, req(tenant))
		if w.Code != 500 {
			t.Errorf("%s: status %d, want 500", tenant, w.Code)
		}
		body := w.Body.String()
		if !strings.Contains(body, `rule \"tenant\"`) || strings.Contains(body, "secret-dsn") || strings.Contains(body, "limit") && strings.Contains(body, "-5") {
			t.Errorf("%s: body %s: want the rule named and no cause", tenant, body)
		}
	}
	if be.calls != 0 {
		t.Errorf("%d backend calls for requests without a valid limit, want none", be.calls)
	}
	if got := strings.Count(logs.String(), "no valid limit"); got != 1 {
		t.Errorf("%d log lines for five refusals of one rule in a minute, want 1:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), `rule=tenant`) || !strings.Contains(logs.String(), "limit -5 outside") {
		t.Errorf("log does not name the rule and the refused value:\n%s", logs.String())
	}

	if w := serve(t, h, req("noplan")); w.Code != 200 || !strings.Contains(w.Header().Get("RateLimit"), `"tenant";r=9;`) {
		t.Errorf("ErrNoKey: %d, RateLimit %q: want 200 with the tenant rule at its own limit of 10", w.Code, w.Header().Get("RateLimit"))
	}
	for i, want := range []int{200, 200, 429} {
		if w := serve(t, h, req("ok")); w.Code != want {
			t.Errorf("limit 2 from Limits, request %d: %d, want %d", i+1, w.Code, want)
		}
	}

	// Decide reports the same error type for an Input's limit.
	_, err := l.Decide(t.Context(), Input{Rule: "tenant", Key: "t", Limit: -1})
	var le *LimitError
	if !errors.As(err, &le) || le.Rule != "tenant" || le.Limit != -1 || !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("Decide with limit -1: %v, want a *LimitError for rule tenant wrapping backend.ErrInvalidRequest", err)
	}
}

// A settlement past the reservation is capped at the capacity of the limit
// that applied, not the rule's default.
func TestSettleCapsAtTheRequestsLimit(t *testing.T) {
	be := &scripted{}
	l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-Tenant"), Limit: 10, Period: time.Minute,
		Estimate: func(*http.Request) (int64, error) { return 1, nil },
		Limits:   func(*http.Request) (int64, int64, error) { return 50, 0, nil }}}, WithBackend(be))
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "tokens", 1000); err != nil {
			t.Error(err)
		}
	}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Tenant", "acme")
	serve(t, h, r)
	if len(be.calls) != 2 {
		t.Fatalf("%d backend calls, want the decision and the settlement", len(be.calls))
	}
	if q := be.calls[1][0]; q.Cost != 50 || !q.Force || q.Limit != 50 {
		t.Errorf("settlement %+v, want 50 units forced under limit 50 (capped at the capacity of the limit that applied)", q)
	}
}

// MaxSlidingLogLimit bounds every sliding log that reaches a backend, not
// only a rule's own Limit: a limit from Rule.Limits or Input.Limit past it
// is a *LimitError for that request (500 from the middleware), with
// nothing decided, while the bound itself and other algorithms' larger
// limits pass.
func TestSlidingLogBoundHoldsForLimitsPerRequest(t *testing.T) {
	be := newCounting()
	l := MustNew([]Rule{
		{Name: "log", Key: headerKey("X-Tenant"), Limit: 10, Period: time.Minute, Algorithm: SlidingLog,
			Limits: func(r *http.Request) (int64, int64, error) {
				n, err := strconv.ParseInt(r.Header.Get("X-Limit"), 10, 64)
				return n, 0, err
			}},
		{Name: "rolling", Key: headerKey("X-Tenant"), Limit: 10, Period: time.Minute},
	}, WithBackend(be), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	for _, tc := range []struct {
		limit string
		want  int
	}{{"10001", 500}, {"1000000", 500}, {"10000", 200}} {
		calls := be.calls
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("X-Limit", tc.limit)
		if w := serve(t, h, r); w.Code != tc.want {
			t.Errorf("sliding log limit %s from Limits: status %d, want %d", tc.limit, w.Code, tc.want)
		}
		if tc.want == 500 && be.calls != calls {
			t.Errorf("sliding log limit %s from Limits reached the backend", tc.limit)
		}
	}

	for _, tc := range []struct {
		in      Input
		refused bool
	}{
		{Input{Rule: "log", Key: "k", Limit: MaxSlidingLogLimit + 1}, true},
		{Input{Rule: "log", Key: "k", Limit: MaxSlidingLogLimit}, false},
		{Input{Rule: "rolling", Key: "k", Limit: 50_000}, false},
	} {
		calls := be.calls
		_, err := l.Decide(t.Context(), tc.in)
		var le *LimitError
		switch {
		case tc.refused && (!errors.As(err, &le) || le.Rule != "log" || le.Limit != tc.in.Limit || !errors.Is(err, backend.ErrInvalidRequest)):
			t.Errorf("Decide %+v: %v, want a *LimitError for rule log wrapping backend.ErrInvalidRequest", tc.in, err)
		case tc.refused && be.calls != calls:
			t.Errorf("Decide %+v reached the backend", tc.in)
		case !tc.refused && err != nil:
			t.Errorf("Decide %+v: %v", tc.in, err)
		}
	}
	err := l.Charge(t.Context(), Input{Rule: "log", Key: "k", Cost: 5, Limit: MaxSlidingLogLimit + 1})
	if le := (*LimitError)(nil); !errors.As(err, &le) || !strings.Contains(err.Error(), "at most 10000") {
		t.Errorf("Charge under a sliding log of %d: %v, want a *LimitError naming the bound", MaxSlidingLogLimit+1, err)
	}
}

// The per-plan pattern must not leave a token without a plan unlimited: a
// Limits function that passes on its lookup's ErrNoKey (JWTClaim's answer
// for a missing claim, or one that is an object, an array or a boolean)
// gets the rule's own limit. Leaving the rule out is said in its Key.
func TestLimitsErrNoKeyGetsTheRulesLimit_UnlimitedPlanRegression(t *testing.T) {
	plan := Must(JWTClaim("plan", hmacKey, []string{"HS256"}))
	sub := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	l := MustNew([]Rule{{Name: "api", Limit: 2, Period: time.Minute, Algorithm: SlidingLog,
		Key: func(r *http.Request) (string, error) {
			if p, _ := plan(r); p == "internal" {
				return "", ErrNoKey // explicitly unlimited
			}
			return sub(r)
		},
		Limits: func(r *http.Request) (int64, int64, error) {
			p, err := plan(r)
			if err != nil {
				return 0, 0, err
			}
			return map[string]int64{"pro": 5}[p], 0, nil
		}}})
	defer l.Close()
	h := l.Handler(okHandler)
	for _, tc := range []struct {
		name   string
		claims jwt.MapClaims
		want   int
	}{
		{"no plan", jwt.MapClaims{"sub": "eve"}, 2},
		{"plan object", jwt.MapClaims{"sub": "obj", "plan": map[string]any{"tier": "pro"}}, 2},
		{"plan array", jwt.MapClaims{"sub": "arr", "plan": []any{"pro"}}, 2},
		{"plan boolean", jwt.MapClaims{"sub": "bool", "plan": true}, 2},
		{"unknown plan", jwt.MapClaims{"sub": "unk", "plan": "gold"}, 2},
		{"pro", jwt.MapClaims{"sub": "bo", "plan": "pro"}, 5},
		{"internal", jwt.MapClaims{"sub": "ops", "plan": "internal"}, 20},
	} {
		token := sign(t, jwt.SigningMethodHS256, testJWTSecret, tc.claims)
		admitted := 0
		for range 20 {
			if w := serve(t, h, bearerRequest(token)); w.Code == 200 {
				admitted++
			}
		}
		if admitted != tc.want {
			t.Errorf("%s: %d of 20 admitted, want %d", tc.name, admitted, tc.want)
		}
	}
}

package ceiling

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// RateLimitPolicy and Decision.RateLimit say what the middleware's IETF
// headers say for the same decision: every step of a sequence, decided by
// Handler on one limiter and by Decide on its twin, gets the same
// RateLimit-Policy and RateLimit, through admissions, a per-request limit,
// a Hidden rule, a shadow rule, a rejection by a listed rule (only it
// shown) and one by the Hidden rule alone.
func TestRateLimitFieldsAreTheMiddlewaresHeaders(t *testing.T) {
	rules := func() []Rule {
		plan := func(r *http.Request) (int64, int64, error) {
			n, _ := strconv.ParseInt(r.Header.Get("X-Plan"), 10, 64)
			return n, 0, nil
		}
		return []Rule{
			{Name: "ip", Key: headerKey("X-Ip"), Limit: 3, Period: time.Minute},
			{Name: "phone", Key: headerKey("X-Phone"), Limit: 2, Period: 15 * time.Minute, Hidden: true},
			{Name: "new", Key: headerKey("X-Ip"), Limit: 1, Period: time.Minute, Shadow: true},
			{Name: "plan", Key: headerKey("X-Ip"), Limit: 10, Period: time.Hour, Limits: plan},
		}
	}
	quiet := WithLogger(slog.New(slog.DiscardHandler))
	web := MustNew(rules(), WithBackend(newCounting()), quiet)
	defer web.Close()
	twin := MustNew(rules(), WithBackend(newCounting()), quiet)
	defer twin.Close()
	h := web.Handler(okHandler)

	type step struct{ ip, phone, plan string }
	steps := []step{
		{"a", "p1", ""}, {"a", "p1", "50"}, {"a", "p1", ""}, // the phone's budget is spent
		{"b", "p1", ""},   // refused by the Hidden rule alone
		{"a", "p2", ""},   // admitted: ip's third
		{"a", "p1", "50"}, // refused by ip and the phone: only ip is shown
		{"c", "", "7"},    // the phone rule does not apply
	}
	wantStatus := []int{200, 200, 429, 429, 200, 429, 200}
	for i, s := range steps {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Ip", s.ip)
		r.Header.Set("X-Phone", s.phone)
		r.Header.Set("X-Plan", s.plan)
		w := serve(t, h, r)

		in := []Input{{Rule: "ip", Key: s.ip}, {Rule: "new", Key: s.ip}}
		if s.phone != "" {
			in = append(in, Input{Rule: "phone", Key: s.phone})
		}
		limit, _ := strconv.ParseInt(s.plan, 10, 64)
		in = append(in, Input{Rule: "plan", Key: s.ip, Limit: limit})
		d, err := twin.Decide(t.Context(), in...)
		if err != nil {
			t.Fatal(err)
		}
		policy, rateLimit := twin.RateLimitPolicy(&d), d.RateLimit()
		if w.Code != wantStatus[i] || d.Allowed != (w.Code == 200) {
			t.Fatalf("step %d %+v: status %d, Decide allowed %v; want %d", i, s, w.Code, d.Allowed, wantStatus[i])
		}
		if got := w.Header().Get("RateLimit-Policy"); got != policy {
			t.Errorf("step %d %+v: RateLimitPolicy %q, the middleware sent %q", i, s, policy, got)
		}
		if got := w.Header().Get("RateLimit"); got != rateLimit {
			t.Errorf("step %d %+v: Decision.RateLimit %q, the middleware sent %q", i, s, rateLimit, got)
		}
		if i == 1 && policy != `"ip";q=3;w=60, "plan";q=50;w=3600` {
			t.Errorf("step %d: policy %q, want the plan's limit of 50 and neither the Hidden nor the shadow rule", i, policy)
		}
		if i == 5 && rateLimit != `"ip";r=0;t=1` {
			t.Errorf("step %d: RateLimit %q, want only the listed rejecting rule", i, rateLimit)
		}
	}

	// Only the named rules, and no decision: their own limits.
	if got, want := twin.RateLimitPolicy(nil, "plan", "phone"), `"plan";q=10;w=3600`; got != want {
		t.Errorf("RateLimitPolicy(nil, plan, phone) = %q, want %q (the Hidden rule left out)", got, want)
	}
	if got, want := twin.RateLimitPolicy(nil), `"ip";q=3;w=60, "plan";q=10;w=3600`; got != want {
		t.Errorf("RateLimitPolicy(nil) = %q, want %q", got, want)
	}
}

package ceiling

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// unitRules are one rule of each kind a policy item can describe: a count
// of requests (no qu), a token budget (qu="tokens"), a concurrency rule
// (qu="concurrent-requests", no w), a per-request limit (the policy is
// built per request), and shadow and hidden rules, which are never
// advertised.
func unitRules() []Rule {
	return []Rule{
		{Name: "chat:minute", Key: Static("s"), Limit: 3, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "chat:tokens", Key: Static("s"), Limit: 100, Period: 24 * time.Hour, Algorithm: FixedWindow, Cost: 40, Unit: "tokens"},
		{Name: "chat:inflight", Key: Static("s"), Limit: 2, Period: time.Minute, Algorithm: Concurrency},
		{Name: "chat:plan", Key: Static("s"), Limit: 5, Period: time.Hour, Unit: "content-bytes",
			Limits: func(*http.Request) (int64, int64, error) { return 7, 0, nil }},
		{Name: "chat:new", Key: Static("s"), Limit: 1, Period: time.Hour, Shadow: true},
		{Name: "chat:dest", Key: Static("d"), Limit: 9, Period: time.Hour, Hidden: true},
	}
}

// Every rate-limit field ceiling sends is a valid Structured Field list
// (RFC 8941) of the shape the draft gives it, on admissions and on the 429
// that follows, and RateLimit-Policy says each rule's unit: qu is a String
// for a rule that does not count requests and absent for one that does.
// Retry-After is delta-seconds (RFC 9110).
func TestHeaderValuesAreStructuredFields(t *testing.T) {
	l := MustNew(unitRules(), WithShadowHeader(), WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	wantUnit := map[string]string{"chat:minute": "", "chat:tokens": "tokens", "chat:inflight": "concurrent-requests", "chat:plan": "content-bytes"}
	var codes []int
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		codes = append(codes, w.Code)
		hd := w.Header()

		policy := sfField(t, hd, "RateLimit-Policy")
		seen := map[string]bool{}
		for _, m := range policy {
			name, ok := m.value.(string)
			if !ok {
				t.Fatalf("RateLimit-Policy member %+v is not a String", m)
			}
			seen[name] = true
			want, known := wantUnit[name]
			if !known {
				t.Errorf("RateLimit-Policy advertises %q", name)
				continue
			}
			if q, ok := m.param("q"); !ok || !isNonNegInt(q) {
				t.Errorf("%s: q = %v, want a non-negative Integer", name, q)
			}
			qu, hasQU := m.param("qu")
			if s, isString := qu.(string); want == "" && hasQU || want != "" && (!isString || s != want) {
				t.Errorf("%s: qu = %#v (present %v), want %q", name, qu, hasQU, want)
			}
			w, hasW := m.param("w")
			if concurrency := name == "chat:inflight"; concurrency == hasW || hasW && !isNonNegInt(w) {
				t.Errorf("%s: w = %#v (present %v)", name, w, hasW)
			}
		}
		if len(seen) != len(wantUnit) {
			t.Errorf("RateLimit-Policy %q names %v, want every advertised rule", hd.Get("RateLimit-Policy"), seen)
		}
		for _, m := range sfField(t, hd, "RateLimit") {
			r, rok := m.param("r")
			tt, tok := m.param("t")
			if _, ok := m.value.(string); !ok || !rok || !tok || !isNonNegInt(r) || !isNonNegInt(tt) {
				t.Errorf("RateLimit member %+v: want a String with non-negative Integer r and t", m)
			}
		}
		for _, m := range sfField(t, hd, "RateLimit-Shadow") {
			if _, ok := m.value.(string); !ok || len(m.params) > 0 {
				t.Errorf("RateLimit-Shadow member %+v: want a bare String", m)
			}
		}
		if ra := hd.Get("Retry-After"); ra != "" {
			if n, err := strconv.ParseUint(ra, 10, 63); err != nil || strconv.FormatUint(n, 10) != ra {
				t.Errorf("Retry-After %q is not delta-seconds", ra)
			}
		}
	}
	// The token rule's cost of 40 in 100 rejects the third request.
	if got, want := codes, []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("codes %v, want %v", got, want)
	}
}

// The policy field reads q in the rule's unit: the token budget's item is
// exactly its quota, unit and window.
func TestPolicyNamesTheUnit(t *testing.T) {
	l := MustNew([]Rule{
		{Name: "chat:tokens", Key: Static("s"), Limit: 200000, Period: 24 * time.Hour, Algorithm: FixedWindow, Unit: "tokens"},
		{Name: "chat:minute", Key: Static("s"), Limit: 30, Period: time.Minute},
	}, WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	w := httptest.NewRecorder()
	l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if got, want := w.Header().Get("RateLimit-Policy"), `"chat:tokens";q=200000;qu="tokens";w=86400, "chat:minute";q=30;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
}

// A unit that a Structured Field string could not carry unescaped, or that
// is not a unit name, is refused when the limiter is built.
func TestRuleUnitIsValidated(t *testing.T) {
	for _, u := range []string{"Tokens", `to"ks`, `a\b`, "-x", "1k", "content bytes", "tökens"} {
		_, err := New([]Rule{{Name: "r", Key: Static("s"), Limit: 1, Period: time.Minute, Unit: u}})
		if err == nil || !strings.Contains(err.Error(), `rule "r": unit`) {
			t.Errorf("Unit %q: err = %v, want the rule's unit refused", u, err)
		}
	}
	for _, u := range []string{"", "tokens", "content-bytes", "requests", "kb2"} {
		if _, err := New([]Rule{{Name: "r", Key: Static("s"), Limit: 1, Period: time.Minute, Unit: u}}); err != nil {
			t.Errorf("Unit %q: %v", u, err)
		}
	}
}

// sfField parses header name as a Structured Field list; absent is empty.
func sfField(t *testing.T, h http.Header, name string) []sfItem {
	t.Helper()
	v := h.Get(name)
	if v == "" {
		return nil
	}
	list, err := parseSFList(v)
	if err != nil {
		t.Fatalf("%s %q: %v", name, v, err)
	}
	return list
}

func isNonNegInt(v any) bool {
	n, ok := v.(int64)
	return ok && n >= 0
}

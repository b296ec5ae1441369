package ceiling

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// answer is what one response says about the rules.
type answer struct {
	status     int
	ratelimit  string
	policy     string
	retryAfter int
	violated   []string
}

func answerOf(t *testing.T, w *httptest.ResponseRecorder) answer {
	t.Helper()
	a := answer{status: w.Code, ratelimit: w.Header().Get("RateLimit"), policy: w.Header().Get("RateLimit-Policy")}
	a.retryAfter, _ = strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code == http.StatusTooManyRequests {
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("429 body %s: %v", w.Body, err)
		}
		a.violated = p.ViolatedPolicies
		if strings.Contains(w.Body.String(), "otp:phone") && !slices.Contains(p.ViolatedPolicies, "otp:phone") {
			t.Errorf("the problem body names otp:phone without its refusal: %s", w.Body)
		}
	}
	return a
}

// rules names the rules a RateLimit field lists.
func (a answer) rules() []string {
	var names []string
	for _, m := range strings.Split(a.ratelimit, ", ") {
		if name, _, ok := strings.Cut(m, ";"); ok {
			names = append(names, strings.Trim(name, `"`))
		}
	}
	return names
}

// TestA429IsNotAnOracle pins issue 14's first finding, on memory and on a
// real Redis (whose deny cache answers the repeated rejections): a caller
// who has spent their own address budget asks for codes to a victim's
// phone, before and after the victim received codes from elsewhere, and
// learns nothing about the phone; the phone rule, Hidden, is in no header,
// and a 429 names only the rules that refused it.
func TestA429IsNotAnOracle(t *testing.T) {
	for _, be := range []struct {
		name string
		new  func(t *testing.T) backend.Backend
	}{
		{"memory", func(*testing.T) backend.Backend { return nil }},
		{"redis", func(t *testing.T) backend.Backend {
			return ceilingredis.New(redistest.Shared(t).Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
		}},
	} {
		for _, hidden := range []bool{true, false} {
			t.Run(be.name+"/hidden="+strconv.FormatBool(hidden), func(t *testing.T) {
				oracleScenario(t, be.new(t), hidden)
			})
		}
	}
}

// oracleScenario is TestA429IsNotAnOracle on one backend (nil: memory).
// Without Hidden the phone's state shows on the caller's own admitted
// requests and on a refusal by the phone alone, but never on a 429 the
// address rule decided.
func oracleScenario(t *testing.T, b backend.Backend, hidden bool) {
	var opts []Option
	if b != nil {
		opts = append(opts, WithBackend(b), WithTimeout(5*time.Second))
	}
	l := MustNew([]Rule{
		{Name: "otp:phone", Key: Header("X-Phone"), Limit: 3, Period: time.Hour, Algorithm: SlidingLog, Hidden: hidden},
		{Name: "otp:ip", Key: RemoteAddr, Limit: 2, Period: 15 * time.Minute, Algorithm: SlidingLog},
	}, opts...)
	defer l.Close()
	h := l.Handler(okHandler)
	ask := func(peer, phone string) answer {
		r := httptest.NewRequest("POST", "/otp", nil)
		r.RemoteAddr, r.Header["X-Phone"] = peer+":1", []string{phone}
		return answerOf(t, serve(t, h, r))
	}
	const attacker, victim = "203.0.113.66", "+447700900777"

	for _, p := range []string{"+447700900001", "+447700900002"} {
		if a := ask(attacker, p); a.status != 200 || hidden == slices.Contains(a.rules(), "otp:phone") || hidden == strings.Contains(a.policy, "otp:phone") {
			t.Fatalf("admitted: %+v; want 200, otp:phone in the headers only when not hidden", a)
		}
	}
	before := ask(attacker, victim)
	// The victim gets codes from elsewhere, up to the phone's limit.
	for i := range 3 {
		if a := ask("198.51.100."+strconv.Itoa(i), victim); a.status != 200 || hidden == slices.Contains(a.rules(), "otp:phone") {
			t.Fatalf("the victim's own request: %+v", a)
		}
	}
	// The phone alone refuses: the refusal names it (that cannot be
	// hidden), and only a listed rule shows its state.
	if a := ask("198.51.100.9", victim); a.status != 429 || !slices.Equal(a.violated, []string{"otp:phone"}) || hidden != (a.ratelimit == "") || a.retryAfter < 3000 {
		t.Errorf("the phone at its limit: %+v; want 429 naming otp:phone, a RateLimit field only when not hidden, Retry-After about an hour", a)
	}
	after, again := ask(attacker, victim), ask(attacker, victim)
	// Before the victim's codes only the address rule refuses: the phone's
	// state is not shown, hidden or not.
	if !slices.Equal(before.rules(), []string{"otp:ip"}) || !slices.Equal(before.violated, []string{"otp:ip"}) || before.retryAfter > 900 {
		t.Errorf("the attacker's first 429: %+v; want only otp:ip, Retry-After within its 15 minutes", before)
	}
	for _, a := range []answer{after, again} {
		if !hidden {
			// Both rules refuse now, and both are listed: what Hidden is for.
			if !slices.Equal(a.violated, []string{"otp:phone", "otp:ip"}) {
				t.Errorf("without Hidden, the 429 names %v, want both rules", a.violated)
			}
			continue
		}
		if a.status != 429 || !slices.Equal(a.rules(), before.rules()) || !slices.Equal(a.violated, before.violated) || a.retryAfter > 900 {
			t.Errorf("the attacker's 429 after the victim's codes: %+v; want what it was before: %+v", a, before)
		}
	}
}

// Hidden rules are in no header style, and a shadow Hidden rule in no
// RateLimit-Shadow field: the single-policy styles report the listed rule
// even when a hidden one has less left, and nothing when only hidden rules
// refuse (Retry-After still says when to come back).
func TestHiddenRuleInNoHeaderStyle(t *testing.T) {
	for _, style := range []HeaderStyle{HeadersIETF, HeadersRateLimit, HeadersXRateLimit} {
		l := MustNew([]Rule{
			{Name: "third", Key: Static("x"), Limit: 1, Period: time.Minute, Hidden: true},
			{Name: "probe", Key: Static("x"), Limit: 1, Period: time.Minute, Hidden: true, Shadow: true},
			{Name: "own", Key: Static("y"), Limit: 50, Period: time.Minute},
		}, WithHeaders(style), WithShadowHeader())
		h := l.Handler(okHandler)
		admitted, refused := serve(t, h, httptest.NewRequest("GET", "/", nil)), serve(t, h, httptest.NewRequest("GET", "/", nil))
		for i, w := range []*httptest.ResponseRecorder{admitted, refused} {
			for name, vs := range w.Header() {
				if v := strings.Join(vs, ","); strings.Contains(v, "third") || strings.Contains(v, "probe") {
					t.Errorf("style %d, request %d: %s: %q names a hidden rule", style, i, name, v)
				}
			}
		}
		if style != HeadersIETF {
			prefix := map[HeaderStyle]string{HeadersRateLimit: "RateLimit-", HeadersXRateLimit: "X-RateLimit-"}[style]
			if got := admitted.Header().Get(prefix + "Limit"); got != "50" {
				t.Errorf("style %d: %sLimit %q, want 50 (the listed rule, not the hidden one with less left)", style, prefix, got)
			}
			if got := refused.Header().Get(prefix + "Limit"); got != "" {
				t.Errorf("style %d: refused by the hidden rule alone: %sLimit %q, want none", style, prefix, got)
			}
		}
		if refused.Code != 429 || refused.Header().Get("Retry-After") == "" {
			t.Errorf("style %d: %d (Retry-After %q), want a 429 with Retry-After", style, refused.Code, refused.Header().Get("Retry-After"))
		}
		l.Close()
	}
}

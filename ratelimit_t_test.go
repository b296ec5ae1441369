package ceiling

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// rateLimitField parses the RateLimit field as a Structured Field list and
// returns each policy's r and t by name; the test fails on a field that is
// not a valid list of strings with integer r and t.
func rateLimitField(t *testing.T, h http.Header) map[string][2]int64 {
	t.Helper()
	list, err := parseSFList(h.Get("RateLimit"))
	if err != nil {
		t.Fatalf("RateLimit %q: %v", h.Get("RateLimit"), err)
	}
	out := map[string][2]int64{}
	for _, m := range list {
		name, ok := m.value.(string)
		r, rok := m.param("r")
		tt, tok := m.param("t")
		ri, rint := r.(int64)
		ti, tint := tt.(int64)
		if !ok || !rok || !tok || !rint || !tint || ri < 0 || ti < 0 {
			t.Fatalf("RateLimit member %+v: want a string with non-negative integer r and t", m)
		}
		out[name] = [2]int64{ri, ti}
	}
	return out
}

// TestRateLimitTIsDraft11 pins issue 19's table for every algorithm: limit
// 2 per 8 s, one unit at 0 s, one at 2 s, a third at 2 s. t is the seconds
// until one more unit is available (draft-11), not until the quota is whole
// again (draft-08), and the 429's Retry-After equals the rejecting rule's t.
func TestRateLimitTIsDraft11(t *testing.T) {
	for _, alg := range backend.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			store, clock := fakeMemory(t)
			checkDraft11(t, alg, clock, WithBackend(store))
		})
	}
}

// draft11T is issue 19's table: t after the second unit, in seconds,
// rounded up; the third request's Retry-After is the same. The working,
// per ALGORITHMS.md, is in the comments.
var draft11T = map[backend.Algorithm]int64{
	// T = 4 s, tau = 8 s: tat 8 s at 2 s, one more at tat + T - tau.
	GCRA: 2,
	// the unit of 0 s leaves at 8 s.
	SlidingLog: 6,
	// W = 0.5 s: bucket 0 counts until 17W = 8.5 s.
	RollingWindow: 7,
	// the window [0, 8 s) ends.
	FixedWindow: 6,
	// cur = 2 becomes prev = 2 at 8 s and must weigh at most 0.5:
	// remm <= 4000 ms, at 9.999001 s.
	SlidingWindow: 10,
}

// checkDraft11 runs issue 19's sequence through a limiter of one rule of
// alg (limit 2 per 8 s) built with opts, whose backend reads clock:
// requests at 0 s and 2 s are admitted with t = 0 then the table's t, and
// a third at 2 s is a 429 whose Retry-After is that t and whose RateLimit
// says the same. It returns the handler, for more requests at later
// instants (see draft11Get).
func checkDraft11(t *testing.T, alg backend.Algorithm, clock *backendtest.Clock, opts ...Option) http.Handler {
	t.Helper()
	want, ok := draft11T[alg]
	if !ok {
		t.Fatalf("no expectation for %v", alg)
	}
	l := MustNew([]Rule{{Name: "r", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: alg}}, opts...)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	w := draft11Get(t, h, clock, 0)
	if got := rateLimitField(t, w.Header())["r"]; w.Code != 200 || got != [2]int64{1, 0} {
		t.Errorf("first: %d r,t = %v, want 200 and 1,0 (a unit is available now)", w.Code, got)
	}
	w = draft11Get(t, h, clock, 2*time.Second)
	if got := rateLimitField(t, w.Header())["r"]; w.Code != 200 || got != [2]int64{0, want} {
		t.Errorf("second: %d r,t = %v, want 200 and 0,%d", w.Code, got, want)
	}
	checkDraft11Refusal(t, "third", draft11Get(t, h, clock, 2*time.Second), want)
	return h
}

// draft11Get sends one request to h at Epoch+at on clock.
func draft11Get(t *testing.T, h http.Handler, clock *backendtest.Clock, at time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	clock.Set(backendtest.Epoch.Add(at))
	return serve(t, h, httptest.NewRequest("GET", "/", nil))
}

// checkDraft11Refusal checks that w is a 429 with Retry-After want and
// rule r's RateLimit member at r=0, t=Retry-After.
func checkDraft11Refusal(t *testing.T, which string, w *httptest.ResponseRecorder, want int64) {
	t.Helper()
	retry, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if w.Code != http.StatusTooManyRequests || err != nil || retry != want {
		t.Errorf("%s: %d Retry-After %q, want 429 and %d", which, w.Code, w.Header().Get("Retry-After"), want)
	}
	if got := rateLimitField(t, w.Header())["r"]; got != [2]int64{0, retry} {
		t.Errorf("%s: r,t = %v, want 0,%d: t equals Retry-After", which, got, retry)
	}
}

// With several rules on a 429, each rejecting rule's t is its own wait and
// Retry-After is the largest of them; a rule with room is not listed (a
// 429 shows only the rules that refused it, issue 14), and a request too
// costly for the rest of a rule's budget (but not for one unit) still gets
// t equal to Retry-After.
func TestRateLimitTOnA429WithSeveralRules(t *testing.T) {
	store, clock := fakeMemory(t)
	l := MustNew([]Rule{
		{Name: "log", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: SlidingLog},
		{Name: "gcra", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: GCRA},
		{Name: "roomy", Key: Static("k"), Limit: 100, Period: 8 * time.Second},
	}, WithBackend(store))
	h := l.Handler(okHandler)
	for _, at := range []time.Duration{0, 2 * time.Second, 2 * time.Second} {
		clock.Set(backendtest.Epoch.Add(at))
		w := serve(t, h, httptest.NewRequest("GET", "/", nil))
		if w.Code != http.StatusTooManyRequests {
			continue
		}
		got := rateLimitField(t, w.Header())
		if _, listed := got["roomy"]; got["log"] != [2]int64{0, 6} || got["gcra"] != [2]int64{0, 2} || listed {
			t.Errorf("RateLimit %v, want log 0,6 gcra 0,2 and no roomy", got)
		}
		if ra := w.Header().Get("Retry-After"); ra != "6" {
			t.Errorf("Retry-After %q, want 6, the largest t of the rejecting rules", ra)
		}
		return
	}
	t.Fatal("the third request was not refused")
}

// A request of cost 2 with 1 unit left is refused although one unit is
// available: the rejecting rule's t is the request's wait (Retry-After),
// never earlier, as the draft requires.
func TestRateLimitTOfACostlyRejection(t *testing.T) {
	store, clock := fakeMemory(t)
	l := MustNew([]Rule{{Name: "r", Key: Static("k"), Limit: 3, Period: 8 * time.Second, Algorithm: SlidingLog, Cost: 2}}, WithBackend(store))
	h := l.Handler(okHandler)
	if w := serve(t, h, httptest.NewRequest("GET", "/", nil)); w.Code != 200 {
		t.Fatalf("first: %d", w.Code)
	}
	clock.Set(backendtest.Epoch.Add(3 * time.Second))
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("second: %d Retry-After %q, want 429 and 5", w.Code, w.Header().Get("Retry-After"))
	}
	if got := rateLimitField(t, w.Header())["r"]; got != [2]int64{1, 5} {
		t.Errorf("r,t = %v, want 1,5", got)
	}
}

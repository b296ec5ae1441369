package ceiling_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/go-chi/chi/v5"
)

func statuses(t *testing.T, h http.Handler, method, path string, n int) []int {
	t.Helper()
	var got []int
	for i := 0; i < n; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		got = append(got, w.Code)
	}
	return got
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func perIP(name string, limit int64) *ceiling.Limiter {
	return ceiling.MustNew([]ceiling.Rule{{Name: name, Key: ceiling.RemoteAddr, Limit: limit, Period: time.Minute, Algorithm: ceiling.SlidingLog}})
}

func ok(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }

func TestServeMuxPerRouteAndGlobal(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("POST /api/otp", perIP("otp", 2).Handler(http.HandlerFunc(ok)))
	mux.HandleFunc("GET /api/items/{id}", ok)
	global := perIP("global", 4).Handler(mux)

	if got, want := statuses(t, global, "POST", "/api/otp", 3), []int{200, 200, 429}; !equal(got, want) {
		t.Errorf("POST /api/otp: %v, want %v", got, want)
	}
	// The route limit is spent; the global one has 1 left of 4.
	if got, want := statuses(t, global, "GET", "/api/items/7", 2), []int{200, 429}; !equal(got, want) {
		t.Errorf("GET /api/items/7: %v, want %v", got, want)
	}
}

func TestChiPerRouteAndGlobal(t *testing.T) {
	r := chi.NewRouter()
	r.Use(perIP("global", 4).Handler)
	r.With(perIP("otp", 2).Handler).Post("/api/otp", ok)
	r.Get("/api/items/{id}", ok)

	if got, want := statuses(t, r, "POST", "/api/otp", 3), []int{200, 200, 429}; !equal(got, want) {
		t.Errorf("POST /api/otp: %v, want %v", got, want)
	}
	if got, want := statuses(t, r, "GET", "/api/items/7", 2), []int{200, 429}; !equal(got, want) {
		t.Errorf("GET /api/items/7: %v, want %v", got, want)
	}
}

// On the memory store a stored key joins the rule and the raw value; the
// join must not let rule "a" with value "b:c" meet rule "a:b" with "c".
func TestMemoryKeysOfDifferentRulesNeverMeet(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "a", Key: ceiling.Static("b:c"), Limit: 1, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "a:b", Key: ceiling.Static("c"), Limit: 1, Period: time.Minute, Algorithm: ceiling.SlidingLog},
	})
	if got, want := statuses(t, l.Handler(http.HandlerFunc(ok)), "GET", "/", 2), []int{200, 429}; !equal(got, want) {
		t.Errorf("statuses = %v, want %v: two rules shared one key", got, want)
	}
}

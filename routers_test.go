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

// chi v5.5.0, the version in go.mod, sets r.Pattern before the route's own
// middleware: a Route rule mounted with With keys each route apart, and
// the requests of one route together, as the README says. Mounted with Use
// it runs before routing and sees no route: everything is UnmatchedRoute.
func TestChiWithKeysByRoutePattern(t *testing.T) {
	byRoute := func() *ceiling.Limiter {
		return ceiling.MustNew([]ceiling.Rule{{Name: "route", Key: ceiling.Route, Limit: 1, Period: time.Minute}})
	}
	r := chi.NewRouter()
	l := byRoute()
	r.With(l.Handler).Get("/orders/{id}", ok)
	r.With(l.Handler).Get("/users/{id}", ok)
	if got, want := statuses(t, r, "GET", "/orders/1", 1), []int{200}; !equal(got, want) {
		t.Errorf("GET /orders/1: %v, want %v", got, want)
	}
	if got, want := statuses(t, r, "GET", "/orders/2", 1), []int{429}; !equal(got, want) {
		t.Errorf("GET /orders/2 after /orders/1: %v, want %v (one route, one budget)", got, want)
	}
	if got, want := statuses(t, r, "GET", "/users/1", 1), []int{200}; !equal(got, want) {
		t.Errorf("GET /users/1: %v, want %v (another route, its own budget)", got, want)
	}

	global := chi.NewRouter()
	global.Use(byRoute().Handler)
	global.Get("/orders/{id}", ok)
	global.Get("/users/{id}", ok)
	if got, want := statuses(t, global, "GET", "/orders/1", 1), []int{200}; !equal(got, want) {
		t.Errorf("Use, GET /orders/1: %v, want %v", got, want)
	}
	if got, want := statuses(t, global, "GET", "/users/1", 1), []int{429}; !equal(got, want) {
		t.Errorf("Use, GET /users/1: %v, want %v (before routing every request is UnmatchedRoute)", got, want)
	}
}

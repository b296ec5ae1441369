package ceiling

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
)

func TestRouteOnServeMuxIsThePattern(t *testing.T) {
	var keys []string
	record := func(fn KeyFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := fn(r)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", record(Route))
	mux.Handle("/files/", record(RouteWithMethod))
	for _, target := range []string{"/users/1", "/users/2", "/users/999999"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", target, nil))
	}
	for _, m := range []string{"DELETE", "BREW", "FOO"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(m, "/files/a", nil))
	}
	want := []string{"GET /users/{id}", "GET /users/{id}", "GET /users/{id}", "DELETE /files/", "OTHER /files/", "OTHER /files/"}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("keys %q, want %q", keys, want)
	}
}

func TestRouteNeverUsesThePath(t *testing.T) {
	// Mounted outside the router, no pattern is known yet: one shared key,
	// never /users/1, /users/2, ...
	for _, target := range []string{"/users/1", "/users/2"} {
		r := httptest.NewRequest("GET", target, nil)
		if got := mustKey(t, Route, r); got != UnmatchedRoute {
			t.Errorf("%s: key %q, want %q", target, got, UnmatchedRoute)
		}
	}
}

func TestWithRouteWinsOverPattern(t *testing.T) {
	r := httptest.NewRequest("POST", "/api/v1/otp", nil)
	r.Pattern = "/api/"
	if got, want := mustKey(t, Route, r), "/api/"; got != want {
		t.Errorf("key %q, want %q", got, want)
	}
	r = WithRoute(r, "/v1/otp")
	if got, want := mustKey(t, RouteWithMethod, r), "POST /v1/otp"; got != want {
		t.Errorf("key %q, want %q (the inner router's pattern)", got, want)
	}
}

// chiRoute hands chi's matched pattern to ceiling: the documented way for
// other routers.
func chiRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, WithRoute(r, chi.RouteContext(r.Context()).RoutePattern()))
	})
}

// Per user and route on chi: each user has a budget per route, and walking
// through /users/1, /users/2, ... is one route.
func TestRouteOnChiWithUser(t *testing.T) {
	be := &quota{}
	l := MustNew([]Rule{{Name: "user:route", Key: Join(Header("X-User"), RouteWithMethod), Limit: 2, Period: time.Minute}}, WithBackend(be))
	router := chi.NewRouter()
	router.With(chiRoute, l.Handler).Get("/users/{id}", okHandler)
	router.With(chiRoute, l.Handler).Get("/orders/{id}", okHandler)
	req := func(user, target string) *http.Request {
		r := httptest.NewRequest("GET", target, nil)
		r.Header.Set("X-User", user)
		return r
	}
	got := statuses(t, router,
		req("alice", "/users/1"), req("alice", "/users/2"), req("alice", "/users/3"),
		req("alice", "/orders/1"), req("bob", "/users/1"))
	if want := []int{200, 200, 429, 200, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// A limiter mounted before routing (chi's router.Use) with a Route key is
// the issue 26 trap: every route shared the "(unmatched)" budget, silently.
// After its first routeWatchAfter requests without a pattern it names the
// rules keyed on the route, inside Join too, and the fix, once, in the log
// and in Health; a rule that ignores the route is not named, and a limiter
// that has seen a pattern never warns.
func TestRouteKeyBeforeRoutingWarnsOnce(t *testing.T) {
	var logs bytes.Buffer
	rules := []Rule{
		{Name: "per-route", Key: Route, Limit: 1 << 20, Period: time.Minute},
		{Name: "per-user-route", Key: Join(Static("u"), RouteWithMethod), Limit: 1 << 20, Period: time.Minute},
		{Name: "per-addr", Key: RemoteAddr, Limit: 1 << 20, Period: time.Minute},
	}
	l := MustNew(rules, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer l.Close()
	router := chi.NewRouter()
	router.Use(l.Handler)
	router.Get("/a", func(http.ResponseWriter, *http.Request) {})
	for i := range routeWatchAfter + 50 {
		w := httptest.NewRecorder()
		router.ServeHTTP(w, httptest.NewRequest("GET", "/a", nil))
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		if i == routeWatchAfter-2 && logs.Len() > 0 {
			t.Fatalf("warned before %d requests:\n%s", routeWatchAfter, logs.String())
		}
	}
	if n := strings.Count(logs.String(), "keyed on the route"); n != 1 {
		t.Fatalf("logged %d route warnings, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{`rules \"per-route\", \"per-user-route\" are keyed on the route`, "router.With(limiter.Handler)"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "per-addr") {
		t.Errorf("the warning names a rule that ignores the route:\n%s", logs.String())
	}
	if w := l.Health().Warnings; len(w) == 0 || !strings.Contains(strings.Join(w, "\n"), "keyed on the route") {
		t.Errorf("Health().Warnings = %q, want the route warning", w)
	}

	// Mounted on the route, the same rules see patterns: no warning.
	var quiet bytes.Buffer
	l2 := MustNew(rules, WithLogger(slog.New(slog.NewTextHandler(&quiet, nil))))
	defer l2.Close()
	onRoute := chi.NewRouter()
	onRoute.With(l2.Handler).Get("/a", func(http.ResponseWriter, *http.Request) {})
	for range routeWatchAfter + 1 {
		onRoute.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/a", nil))
	}
	if quiet.Len() > 0 || strings.Contains(strings.Join(l2.Health().Warnings, "\n"), "keyed on the route") {
		t.Errorf("a limiter on the route warned:\n%s%q", quiet.String(), l2.Health().Warnings)
	}
}

// requests is n requests for method and path.
func requests(method, path string, n int) []*http.Request {
	var rs []*http.Request
	for range n {
		rs = append(rs, httptest.NewRequest(method, path, nil))
	}
	return rs
}

func perIP(name string, limit int64) *Limiter {
	return MustNew([]Rule{{Name: name, Key: RemoteAddr, Limit: limit, Period: time.Minute, Algorithm: SlidingLog}})
}

func ok(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }

func TestServeMuxPerRouteAndGlobal(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("POST /api/otp", perIP("otp", 2).Handler(http.HandlerFunc(ok)))
	mux.HandleFunc("GET /api/items/{id}", ok)
	global := perIP("global", 4).Handler(mux)

	if got, want := statuses(t, global, requests("POST", "/api/otp", 3)...), []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("POST /api/otp: %v, want %v", got, want)
	}
	// The route limit is spent; the global one has 1 left of 4.
	if got, want := statuses(t, global, requests("GET", "/api/items/7", 2)...), []int{200, 429}; !slices.Equal(got, want) {
		t.Errorf("GET /api/items/7: %v, want %v", got, want)
	}
}

func TestChiPerRouteAndGlobal(t *testing.T) {
	r := chi.NewRouter()
	r.Use(perIP("global", 4).Handler)
	r.With(perIP("otp", 2).Handler).Post("/api/otp", ok)
	r.Get("/api/items/{id}", ok)

	if got, want := statuses(t, r, requests("POST", "/api/otp", 3)...), []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("POST /api/otp: %v, want %v", got, want)
	}
	if got, want := statuses(t, r, requests("GET", "/api/items/7", 2)...), []int{200, 429}; !slices.Equal(got, want) {
		t.Errorf("GET /api/items/7: %v, want %v", got, want)
	}
}

// On the memory store a stored key joins the rule and the raw value; the
// join must not let rule "a" with value "b:c" meet rule "a:b" with "c".
func TestMemoryKeysOfDifferentRulesNeverMeet(t *testing.T) {
	l := MustNew([]Rule{
		{Name: "a", Key: Static("b:c"), Limit: 1, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "a:b", Key: Static("c"), Limit: 1, Period: time.Minute, Algorithm: SlidingLog},
	})
	if got, want := statuses(t, l.Handler(http.HandlerFunc(ok)), requests("GET", "/", 2)...), []int{200, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses = %v, want %v: two rules shared one key", got, want)
	}
}

// chi v5.5.0, the version in go.mod, sets r.Pattern before the route's own
// middleware: a Route rule mounted with With keys each route apart, and
// the requests of one route together, as the README says. Mounted with Use
// it runs before routing and sees no route: everything is UnmatchedRoute.
func TestChiWithKeysByRoutePattern(t *testing.T) {
	byRoute := func() *Limiter {
		return MustNew([]Rule{{Name: "route", Key: Route, Limit: 1, Period: time.Minute}})
	}
	r := chi.NewRouter()
	l := byRoute()
	r.With(l.Handler).Get("/orders/{id}", ok)
	r.With(l.Handler).Get("/users/{id}", ok)
	if got, want := statuses(t, r, requests("GET", "/orders/1", 1)...), []int{200}; !slices.Equal(got, want) {
		t.Errorf("GET /orders/1: %v, want %v", got, want)
	}
	if got, want := statuses(t, r, requests("GET", "/orders/2", 1)...), []int{429}; !slices.Equal(got, want) {
		t.Errorf("GET /orders/2 after /orders/1: %v, want %v (one route, one budget)", got, want)
	}
	if got, want := statuses(t, r, requests("GET", "/users/1", 1)...), []int{200}; !slices.Equal(got, want) {
		t.Errorf("GET /users/1: %v, want %v (another route, its own budget)", got, want)
	}

	global := chi.NewRouter()
	global.Use(byRoute().Handler)
	global.Get("/orders/{id}", ok)
	global.Get("/users/{id}", ok)
	if got, want := statuses(t, global, requests("GET", "/orders/1", 1)...), []int{200}; !slices.Equal(got, want) {
		t.Errorf("Use, GET /orders/1: %v, want %v", got, want)
	}
	if got, want := statuses(t, global, requests("GET", "/users/1", 1)...), []int{429}; !slices.Equal(got, want) {
		t.Errorf("Use, GET /users/1: %v, want %v (before routing every request is UnmatchedRoute)", got, want)
	}
}

package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A NativeFunc is the work of an application's own handler in the
// [Native] checks: it gets the request as the framework hands it to its
// handlers (Echo's c.Request(), Gin's c.Request) and returns the status and
// text body that the handler writes with the framework's helpers.
type NativeFunc func(r *http.Request) (status int, body string)

// A Native builds an application in one framework from its own handlers,
// not wrapped net/http ones: method and pattern (ServeMux syntax, as for
// [Mount]) served by a handler that calls fn, and GET /open answering 200
// "open". With perRoute the limiter's middleware is attached to the first
// route alone; otherwise it is the application's middleware, in front of
// both routes and of paths no route matches.
type Native func(l *ceiling.Limiter, perRoute bool, method, pattern string, fn NativeFunc) http.Handler

// RunNative runs every check of the framework's own handlers through
// native: [RouteMiddleware], [RouteKeys] (routes spelled as in routeKey,
// the framework's spelling of "/users/{id}/orders/{order}") and
// [PrefetchAndSettle].
func RunNative(t *testing.T, native Native, routeKey string) {
	t.Helper()
	t.Run("route middleware limits only its route", func(t *testing.T) { RouteMiddleware(t, native) })
	t.Run("route key is the matched route", func(t *testing.T) { RouteKeys(t, native, routeKey) })
	t.Run("prefetch and settle from the handlers", func(t *testing.T) { PrefetchAndSettle(t, native) })
}

// RouteMiddleware checks that a limiter attached to one route limits that
// route and no other, and, attached to the application, every route.
func RouteMiddleware(t *testing.T, native Native) {
	t.Helper()
	ok := func(*http.Request) (int, string) { return http.StatusOK, "ok" }
	steps := []Step{{Method: "POST", Target: "/otp"}, {Method: "POST", Target: "/otp"}, {Method: "GET", Target: "/open"}}
	for _, tc := range []struct {
		perRoute bool
		want     []int
	}{{true, []int{200, 429, 200}}, {false, []int{200, 429, 429}}} {
		app := native(Limiter(1, ceiling.RemoteAddr), tc.perRoute, "POST", "/otp", ok)
		if got := Statuses(app, steps...); !slices.Equal(got, tc.want) {
			t.Errorf("middleware on the route only: %v; statuses = %v, want %v", tc.perRoute, got, tc.want)
		}
	}
}

// RouteKeys checks that [ceiling.Route] keys a request by the route the
// framework matched, spelled want ("/users/:id/orders/:order"), never by
// its path, and a path no route matches by [ceiling.UnmatchedRoute].
func RouteKeys(t *testing.T, native Native, want string) {
	t.Helper()
	var seen []string
	route := func(r *http.Request) (string, error) {
		k, err := ceiling.Route(r)
		seen = append(seen, k)
		return k, err
	}
	noContent := func(*http.Request) (int, string) { return http.StatusNoContent, "" }
	app := native(Limiter(100, route), false, "GET", "/users/{id}/orders/{order}", noContent)
	for _, target := range []string{"/users/1/orders/7", "/users/2/orders/8", "/nowhere"} {
		Capture(app, Step{Method: "GET", Target: target}.Request())
	}
	if want := []string{want, want, ceiling.UnmatchedRoute}; !slices.Equal(seen, want) {
		t.Errorf("route keys = %q, want %q", seen, want)
	}
}

// PrefetchAndSettle checks that the framework's own handlers reach
// prefetched work and the settlement of a rule's real cost through the
// request the framework hands them.
func PrefetchAndSettle(t *testing.T, native Native) {
	t.Helper()
	order := ceiling.Prefetch("order", func(_ context.Context, r *http.Request) (string, error) {
		return "order " + r.URL.Query().Get("id"), nil
	})
	l := ceiling.MustNew([]ceiling.Rule{{Name: "tokens", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 1, nil }}},
		ceiling.WithBackend(&Counter{}), ceiling.WithPrefetch(order))
	defer l.Close()
	app := native(l, false, "POST", "/chat", func(r *http.Request) (int, string) {
		o, err := order.Get(r)
		if err == nil {
			err = ceiling.Settle(r, "tokens", 60)
		}
		if err != nil {
			return http.StatusInternalServerError, err.Error()
		}
		return http.StatusOK, o
	})
	steps := []Step{{Method: "POST", Target: "/chat?id=7"}, {Method: "POST", Target: "/chat?id=8"}}
	var got []string
	for _, s := range steps {
		res := Capture(app, s.Request())
		got = append(got, fmt.Sprint(res.Status, " ", res.Body))
	}
	// 60 settled by the first request leaves 40, so the second one settles
	// 60 too (debt): a third is refused.
	if want := []string{"200 order 7", "200 order 8"}; !slices.Equal(got, want) {
		t.Fatalf("responses = %q, want %q", got, want)
	}
	if res := Capture(app, steps[0].Request()); res.Status != http.StatusTooManyRequests {
		t.Errorf("after settling 120 of 100 units: status %d, want 429", res.Status)
	}
}

// Spoofing is n requests to GET / from peer, each with a new
// X-Forwarded-For (203.0.113.1, .2, ...) and the same X-Real-IP: one client
// that writes its own forwarding headers.
func Spoofing(n int, peer string) []Step {
	var steps []Step
	for i := range n {
		steps = append(steps, Step{Method: "GET", Target: "/", RemoteAddr: peer,
			Header: map[string]string{"X-Forwarded-For": "203.0.113." + strconv.Itoa(i+1), "X-Real-IP": "198.51.100.9"}})
	}
	return steps
}

// FrameworkKeyOutsideMiddleware checks that key, a key function that reads
// what the framework's middleware stored in the request, is a
// configuration error (a 400, never [ceiling.ErrNoKey]) on a request that
// did not come through that middleware.
func FrameworkKeyOutsideMiddleware(t *testing.T, key ceiling.KeyFunc) {
	t.Helper()
	h := Limiter(5, key).Handler(Handler)
	if got := Capture(h, httptest.NewRequest("GET", "/", nil)); got.Status != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", got.Status)
	}
	if _, err := key(httptest.NewRequest("GET", "/", nil)); err == nil || errors.Is(err, ceiling.ErrNoKey) {
		t.Errorf("outside the middleware: err = %v, want a configuration error", err)
	}
}

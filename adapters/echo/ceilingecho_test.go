package ceilingecho_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingecho "github.com/ceiling-go/ceiling/adapters/echo"
	"github.com/ceiling-go/ceiling/internal/adaptertest"
	"github.com/labstack/echo/v4"
)

// mount is how the README tells people to set up Echo.
func mount(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
	e := echo.New()
	e.Use(ceilingecho.Middleware(l))
	for _, p := range patterns {
		e.Any(adaptertest.Colon(p), echo.WrapHandler(h))
	}
	return e
}

func TestAnswersExactlyAsNetHTTP(t *testing.T) {
	adaptertest.Run(t, mount)
}

func TestRejectionStopsTheChain(t *testing.T) {
	var ran []string
	var returned []error
	e := echo.New()
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		ran = append(ran, "error handler")
		e.DefaultHTTPErrorHandler(err, c)
	}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			returned = append(returned, err)
			return err
		}
	})
	e.Use(ceilingecho.Middleware(adaptertest.Limiter(1, ceiling.RemoteAddr)))
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ran = append(ran, "later middleware")
			return next(c)
		}
	})
	e.GET("/", func(c echo.Context) error {
		ran = append(ran, "handler")
		return c.String(http.StatusOK, "ok")
	})

	if got := adaptertest.Capture(e, httptest.NewRequest("GET", "/", nil)); got.Status != 200 || got.Body != "ok" {
		t.Fatalf("first request: %d %q, want 200 ok", got.Status, got.Body)
	}
	ran = nil
	got := adaptertest.Capture(e, httptest.NewRequest("GET", "/", nil))
	if got.Status != http.StatusTooManyRequests || got.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("second request: %d %q, want 429 problem+json", got.Status, got.Header.Get("Content-Type"))
	}
	if len(ran) != 0 {
		t.Errorf("after a rejection these ran: %v", ran)
	}
	if got, want := returned, []error{nil, nil}; !slices.Equal(got, want) {
		t.Errorf("middleware returned %v, want %v", got, want)
	}
}

func TestRouteMiddlewareRejectsOnlyItsRoute(t *testing.T) {
	e := echo.New()
	ok := func(c echo.Context) error { return c.String(http.StatusOK, "ok") }
	e.POST("/otp", ok, ceilingecho.Middleware(adaptertest.Limiter(1, ceiling.RemoteAddr)))
	e.GET("/health", ok)
	steps := []adaptertest.Step{
		{Method: "POST", Target: "/otp"}, {Method: "POST", Target: "/otp"}, {Method: "GET", Target: "/health"},
	}
	if got, want := adaptertest.Statuses(e, steps...), []int{200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses = %v, want %v", got, want)
	}
}

// The handler's error goes back up the chain to Echo's error handler, after
// the core has seen the handler return.
func TestAdmittedHandlerErrorReachesEcho(t *testing.T) {
	e := echo.New()
	e.Use(ceilingecho.Middleware(adaptertest.Limiter(5, ceiling.RemoteAddr)))
	e.GET("/", func(echo.Context) error { return echo.NewHTTPError(http.StatusTeapot, "short and stout") })
	got := adaptertest.Capture(e, httptest.NewRequest("GET", "/", nil))
	if got.Status != http.StatusTeapot || got.Header.Get("RateLimit") == "" {
		t.Errorf("got %d with RateLimit %q, want Echo's 418 carrying the rate-limit headers", got.Status, got.Header.Get("RateLimit"))
	}
}

// The handlers see the request the core handed on, not the one Echo started
// with.
func TestHandlersSeeTheCoresRequest(t *testing.T) {
	e := echo.New()
	e.Use(ceilingecho.Middleware(adaptertest.Limiter(5, ceiling.RemoteAddr)))
	var same bool
	e.GET("/", func(c echo.Context) error {
		same = ceilingecho.Context(c.Request()) == c
		return c.NoContent(http.StatusNoContent)
	})
	adaptertest.Capture(e, httptest.NewRequest("GET", "/", nil))
	if !same {
		t.Error("c.Request() in the handler is not the request the middleware passed through the core")
	}
	if c := ceilingecho.Context(httptest.NewRequest("GET", "/", nil)); c != nil {
		t.Errorf("Context of a plain request = %v, want nil", c)
	}
}

func spoofing(n int) []adaptertest.Step {
	var steps []adaptertest.Step
	for i := range n {
		steps = append(steps, adaptertest.Step{Method: "GET", Target: "/", RemoteAddr: "192.0.2.1:1234",
			Header: map[string]string{"X-Forwarded-For": "203.0.113." + string(rune('1'+i)), "X-Real-IP": "198.51.100.9"}})
	}
	return steps
}

// TestSpoofedForwardedForBuysNoQuota pins the default: a client that writes
// a new X-Forwarded-For on every request is still one client. The opt-in
// key shows what the test guards against: with Echo's default extraction the
// same requests get a fresh quota each.
func TestSpoofedForwardedForBuysNoQuota(t *testing.T) {
	for _, tc := range []struct {
		name      string
		key       ceiling.KeyFunc
		extractor echo.IPExtractor
		want      []int
	}{
		{"ceiling.RemoteAddr", ceiling.RemoteAddr, nil, []int{200, 429, 429}},
		// Since v4.16.4 Echo's extraction without an extractor is the peer.
		{"FrameworkRealIP, no extractor", ceilingecho.FrameworkRealIP, nil, []int{200, 429, 429}},
		{"FrameworkRealIP, XFF extractor trusting private ranges (opt-in, spoofable from them)", ceilingecho.FrameworkRealIP,
			echo.ExtractIPFromXFFHeader(), []int{200, 200, 200}},
		{"FrameworkRealIP, ExtractIPDirect", ceilingecho.FrameworkRealIP, echo.ExtractIPDirect(), []int{200, 429, 429}},
	} {
		e := echo.New()
		e.IPExtractor = tc.extractor
		e.Use(ceilingecho.Middleware(adaptertest.Limiter(1, tc.key)))
		e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		steps := spoofing(3)
		if tc.extractor != nil {
			for i := range steps {
				steps[i].RemoteAddr = "10.0.0.7:1234" // a private peer, trusted by default
			}
		}
		if got := adaptertest.Statuses(e, steps...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: statuses = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFrameworkRealIPOutsideTheMiddlewareIsLoud(t *testing.T) {
	h := adaptertest.Limiter(5, ceilingecho.FrameworkRealIP).Handler(adaptertest.Handler)
	got := adaptertest.Capture(h, httptest.NewRequest("GET", "/", nil))
	if got.Status != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", got.Status)
	}
	if _, err := ceilingecho.FrameworkRealIP(httptest.NewRequest("GET", "/", nil)); err == nil || errors.Is(err, ceiling.ErrNoKey) {
		t.Errorf("FrameworkRealIP outside the middleware: err = %v, want a configuration error", err)
	}
}

// Route keys are Echo's matched route, never the raw path.
func TestRouteKeyIsTheMatchedRoute(t *testing.T) {
	var seen []string
	route := func(r *http.Request) (string, error) {
		k, err := ceiling.Route(r)
		seen = append(seen, k)
		return k, err
	}
	e := echo.New()
	e.Use(ceilingecho.Middleware(adaptertest.Limiter(100, route)))
	e.GET("/users/:id/orders/:order", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	for _, target := range []string{"/users/1/orders/7", "/users/2/orders/8", "/nowhere"} {
		adaptertest.Capture(e, httptest.NewRequest("GET", target, nil))
	}
	if want := []string{"/users/:id/orders/:order", "/users/:id/orders/:order", ceiling.UnmatchedRoute}; !slices.Equal(seen, want) {
		t.Errorf("route keys = %q, want %q", seen, want)
	}
}

// Prefetched work and the post-work settlement are reached from an Echo
// handler through c.Request().
func TestPrefetchAndSettleFromEchoHandlers(t *testing.T) {
	order := ceiling.Prefetch("order", func(_ context.Context, r *http.Request) (string, error) {
		return "order " + r.URL.Query().Get("id"), nil
	})
	l := ceiling.MustNew([]ceiling.Rule{{Name: "tokens", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 1, nil }}},
		ceiling.WithBackend(&adaptertest.Counter{}), ceiling.WithPrefetch(order))
	e := echo.New()
	e.Use(ceilingecho.Middleware(l))
	e.POST("/chat", func(c echo.Context) error {
		o, err := order.Get(c.Request())
		if err != nil {
			return err
		}
		if err := ceiling.Settle(c.Request(), "tokens", 60); err != nil {
			return err
		}
		return c.String(http.StatusOK, o)
	})
	steps := []adaptertest.Step{{Method: "POST", Target: "/chat?id=7"}, {Method: "POST", Target: "/chat?id=8"}}
	var got []string
	for _, s := range steps {
		res := adaptertest.Capture(e, s.Request())
		got = append(got, fmt.Sprint(res.Status, " ", res.Body))
	}
	// 60 settled by the first request leaves 40, so the second one settles
	// 60 too (debt): a third would be refused.
	if want := []string{"200 order 7", "200 order 8"}; !slices.Equal(got, want) {
		t.Fatalf("responses = %q, want %q", got, want)
	}
	if res := adaptertest.Capture(e, steps[0].Request()); res.Status != http.StatusTooManyRequests {
		t.Errorf("after settling 120 of 100 units: status %d, want 429", res.Status)
	}
}

// Echo's Response unwraps to net/http's ResponseWriter, so BodyField's own
// read-time bound reaches the connection: a slow body is a 408 through
// Echo too.
func TestSlowBodyIs408ThroughEcho(t *testing.T) {
	adaptertest.SlowBody(t, mount)
}

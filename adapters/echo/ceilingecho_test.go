package ceilingecho_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

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

// native is mount with Echo's own handlers, for the checks of what
// handlers reach through c.Request().
func native(l *ceiling.Limiter, perRoute bool, method, pattern string, fn adaptertest.NativeFunc) http.Handler {
	e := echo.New()
	mw := ceilingecho.Middleware(l)
	var routeMW []echo.MiddlewareFunc
	if perRoute {
		routeMW = append(routeMW, mw)
	} else {
		e.Use(mw)
	}
	e.Add(method, adaptertest.Colon(pattern), func(c echo.Context) error {
		status, body := fn(c.Request())
		return c.String(status, body)
	}, routeMW...)
	e.GET("/open", func(c echo.Context) error { return c.String(http.StatusOK, "open") })
	return e
}

func TestAnswersExactlyAsNetHTTP(t *testing.T) {
	adaptertest.Run(t, mount)
}

// Echo's own handlers: route-level middleware, route keys as Echo spells
// them, and prefetched work and settlement reached through the request.
func TestEchoHandlers(t *testing.T) {
	adaptertest.RunNative(t, native, "/users/:id/orders/:order")
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
		peer := "192.0.2.1:1234"
		if tc.extractor != nil {
			peer = "10.0.0.7:1234" // a private peer, trusted by default
		}
		steps := adaptertest.Spoofing(3, peer)
		if got := adaptertest.Statuses(e, steps...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: statuses = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFrameworkRealIPOutsideTheMiddlewareIsLoud(t *testing.T) {
	adaptertest.FrameworkKeyOutsideMiddleware(t, ceilingecho.FrameworkRealIP)
}

// Echo's Response unwraps to net/http's ResponseWriter, so BodyField's own
// read-time bound reaches the connection: a slow body is a 408 through
// Echo too.
func TestSlowBodyIs408ThroughEcho(t *testing.T) {
	adaptertest.SlowBody(t, mount)
}

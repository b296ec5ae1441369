package ceilinggin_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"

	"github.com/ceiling-go/ceiling"
	ceilinggin "github.com/ceiling-go/ceiling/adapters/gin"
	"github.com/ceiling-go/ceiling/internal/adaptertest"
	"github.com/gin-gonic/gin"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

// mount is how the README tells people to set up Gin.
func mount(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
	r := gin.New()
	r.Use(ceilinggin.Middleware(l))
	for _, p := range patterns {
		r.Any(adaptertest.Colon(p), gin.WrapH(h))
	}
	return r
}

// native is mount with Gin's own handlers, for the checks of what
// handlers reach through c.Request.
func native(l *ceiling.Limiter, perRoute bool, method, pattern string, fn adaptertest.NativeFunc) http.Handler {
	r := gin.New()
	mw := ceilinggin.Middleware(l)
	var handlers []gin.HandlerFunc
	if perRoute {
		handlers = append(handlers, mw)
	} else {
		r.Use(mw)
	}
	handlers = append(handlers, func(c *gin.Context) {
		status, body := fn(c.Request)
		c.String(status, body)
	})
	r.Handle(method, adaptertest.Colon(pattern), handlers...)
	r.GET("/open", func(c *gin.Context) { c.String(http.StatusOK, "open") })
	return r
}

func TestAnswersExactlyAsNetHTTP(t *testing.T) {
	adaptertest.Run(t, mount)
}

// Gin's own handlers: route-level middleware, route keys as Gin spells
// them, and prefetched work and settlement reached through the request.
func TestGinHandlers(t *testing.T) {
	adaptertest.RunNative(t, native, "/users/:id/orders/:order")
}

func TestRejectionAbortsTheChain(t *testing.T) {
	var ran []string
	var aborted []bool
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		aborted = append(aborted, c.IsAborted())
	})
	r.Use(ceilinggin.Middleware(adaptertest.Limiter(1, ceiling.RemoteAddr)))
	r.Use(func(c *gin.Context) { ran = append(ran, "later middleware") })
	r.GET("/", func(c *gin.Context) {
		ran = append(ran, "handler")
		c.String(http.StatusOK, "ok")
	})

	if got := adaptertest.Capture(r, httptest.NewRequest("GET", "/", nil)); got.Status != 200 || got.Body != "ok" {
		t.Fatalf("first request: %d %q, want 200 ok", got.Status, got.Body)
	}
	if got, want := ran, []string{"later middleware", "handler"}; !slices.Equal(got, want) {
		t.Fatalf("an admitted request ran %v, want %v, each once", got, want)
	}
	ran = nil
	got := adaptertest.Capture(r, httptest.NewRequest("GET", "/", nil))
	if got.Status != http.StatusTooManyRequests || got.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("second request: %d %q, want 429 problem+json", got.Status, got.Header.Get("Content-Type"))
	}
	if len(ran) != 0 {
		t.Errorf("after a rejection these ran: %v", ran)
	}
	if got, want := aborted, []bool{false, true}; !slices.Equal(got, want) {
		t.Errorf("c.IsAborted() = %v, want %v", got, want)
	}
}

// The handlers see the request the core handed on, not the one Gin started
// with.
func TestHandlersSeeTheCoresRequest(t *testing.T) {
	r := gin.New()
	r.Use(ceilinggin.Middleware(adaptertest.Limiter(5, ceiling.RemoteAddr)))
	var same bool
	r.GET("/", func(c *gin.Context) {
		same = ceilinggin.Context(c.Request) == c
		c.Status(http.StatusNoContent)
	})
	adaptertest.Capture(r, httptest.NewRequest("GET", "/", nil))
	if !same {
		t.Error("c.Request in the handler is not the request the middleware passed through the core")
	}
	if c := ceilinggin.Context(httptest.NewRequest("GET", "/", nil)); c != nil {
		t.Errorf("Context of a plain request = %v, want nil", c)
	}
}

// TestSpoofedForwardedForBuysNoQuota pins the default: a client that writes
// a new X-Forwarded-For on every request is still one client. The opt-in
// key shows what the test guards against: Gin's default engine trusts every
// proxy, so the same requests get a fresh quota each.
func TestSpoofedForwardedForBuysNoQuota(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     ceiling.KeyFunc
		proxies []string
		want    []int
	}{
		{"ceiling.RemoteAddr", ceiling.RemoteAddr, nil, []int{200, 429, 429}},
		{"FrameworkClientIP, Gin's default trust (opt-in, spoofable)", ceilinggin.FrameworkClientIP, nil, []int{200, 200, 200}},
		{"FrameworkClientIP, no trusted proxies", ceilinggin.FrameworkClientIP, []string{}, []int{200, 429, 429}},
	} {
		r := gin.New()
		if tc.proxies != nil {
			if err := r.SetTrustedProxies(tc.proxies); err != nil {
				t.Fatal(err)
			}
		}
		r.Use(ceilinggin.Middleware(adaptertest.Limiter(1, tc.key)))
		r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		if got := adaptertest.Statuses(r, adaptertest.Spoofing(3, "192.0.2.1:1234")...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: statuses = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFrameworkClientIPOutsideTheMiddlewareIsLoud(t *testing.T) {
	adaptertest.FrameworkKeyOutsideMiddleware(t, ceilinggin.FrameworkClientIP)
}

// Gin's ResponseWriter unwraps to net/http's, so BodyField's own read-time
// bound reaches the connection: a slow body is a 408 through Gin too.
func TestSlowBodyIs408ThroughGin(t *testing.T) {
	adaptertest.SlowBody(t, mount)
}

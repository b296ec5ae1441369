package ceilinggin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

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

func TestAnswersExactlyAsNetHTTP(t *testing.T) {
	adaptertest.Run(t, mount)
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

func TestRouteMiddlewareRejectsOnlyItsRoute(t *testing.T) {
	r := gin.New()
	ok := func(c *gin.Context) { c.String(http.StatusOK, "ok") }
	r.POST("/otp", ceilinggin.Middleware(adaptertest.Limiter(1, ceiling.RemoteAddr)), ok)
	r.GET("/health", ok)
	steps := []adaptertest.Step{
		{Method: "POST", Target: "/otp"}, {Method: "POST", Target: "/otp"}, {Method: "GET", Target: "/health"},
	}
	if got, want := adaptertest.Statuses(r, steps...), []int{200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses = %v, want %v", got, want)
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

func spoofing(n int, peer string) []adaptertest.Step {
	var steps []adaptertest.Step
	for i := range n {
		steps = append(steps, adaptertest.Step{Method: "GET", Target: "/", RemoteAddr: peer,
			Header: map[string]string{"X-Forwarded-For": "203.0.113." + string(rune('1'+i)), "X-Real-IP": "198.51.100.9"}})
	}
	return steps
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
		if got := adaptertest.Statuses(r, spoofing(3, "192.0.2.1:1234")...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: statuses = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFrameworkClientIPOutsideTheMiddlewareIsLoud(t *testing.T) {
	h := adaptertest.Limiter(5, ceilinggin.FrameworkClientIP).Handler(adaptertest.Handler)
	got := adaptertest.Capture(h, httptest.NewRequest("GET", "/", nil))
	if got.Status != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", got.Status)
	}
	if _, err := ceilinggin.FrameworkClientIP(httptest.NewRequest("GET", "/", nil)); err == nil || errors.Is(err, ceiling.ErrNoKey) {
		t.Errorf("FrameworkClientIP outside the middleware: err = %v, want a configuration error", err)
	}
}

// Route keys are Gin's matched route, never the raw path.
func TestRouteKeyIsTheMatchedRoute(t *testing.T) {
	var seen []string
	route := func(r *http.Request) (string, error) {
		k, err := ceiling.Route(r)
		seen = append(seen, k)
		return k, err
	}
	r := gin.New()
	r.Use(ceilinggin.Middleware(adaptertest.Limiter(100, route)))
	r.GET("/users/:id/orders/:order", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	for _, target := range []string{"/users/1/orders/7", "/users/2/orders/8", "/nowhere"} {
		adaptertest.Capture(r, httptest.NewRequest("GET", target, nil))
	}
	if want := []string{"/users/:id/orders/:order", "/users/:id/orders/:order", ceiling.UnmatchedRoute}; !slices.Equal(seen, want) {
		t.Errorf("route keys = %q, want %q", seen, want)
	}
}

// Prefetched work and the post-work settlement are reached from a Gin
// handler through c.Request.
func TestPrefetchAndSettleFromGinHandlers(t *testing.T) {
	order := ceiling.Prefetch("order", func(_ context.Context, r *http.Request) (string, error) {
		return "order " + r.URL.Query().Get("id"), nil
	})
	l := ceiling.MustNew([]ceiling.Rule{{Name: "tokens", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 1, nil }}},
		ceiling.WithBackend(&adaptertest.Counter{}), ceiling.WithPrefetch(order))
	r := gin.New()
	r.Use(ceilinggin.Middleware(l))
	r.POST("/chat", func(c *gin.Context) {
		o, err := order.Get(c.Request)
		if err == nil {
			err = ceiling.Settle(c.Request, "tokens", 60)
		}
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.String(http.StatusOK, o)
	})
	steps := []adaptertest.Step{{Method: "POST", Target: "/chat?id=7"}, {Method: "POST", Target: "/chat?id=8"}}
	var got []string
	for _, s := range steps {
		res := adaptertest.Capture(r, s.Request())
		got = append(got, fmt.Sprint(res.Status, " ", res.Body))
	}
	// 60 settled by the first request leaves 40, so the second one settles
	// 60 too (debt): a third would be refused.
	if want := []string{"200 order 7", "200 order 8"}; !slices.Equal(got, want) {
		t.Fatalf("responses = %q, want %q", got, want)
	}
	if res := adaptertest.Capture(r, steps[0].Request()); res.Status != http.StatusTooManyRequests {
		t.Errorf("after settling 120 of 100 units: status %d, want 429", res.Status)
	}
}

// Gin's ResponseWriter unwraps to net/http's, so BodyField's own read-time
// bound reaches the connection: a slow body is a 408 through Gin too.
func TestSlowBodyIs408ThroughGin(t *testing.T) {
	adaptertest.SlowBody(t, mount)
}

package bench

import (
	"net"
	"net/http"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/didip/tollbooth/v7"
	"github.com/go-chi/httprate"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	ulule "github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
)

// bare is the handler every middleware wraps: it does nothing, so what is
// timed is the middleware.
var bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})

// httpLib is a library's net/http middleware (or, for Echo, the Echo
// router with its middleware) keyed by the connection's address, with
// limit per period per client. base names the row whose time is the
// framework's own: the overhead of the middleware is the difference.
type httpLib struct {
	name string
	base string
	new  func(limit int, period time.Duration) http.Handler
}

// httpBases are the frameworks without a limiter.
var httpBases = []httpLib{
	{"bare", "", func(int, time.Duration) http.Handler { return bare }},
	{"echo-bare", "", func(int, time.Duration) http.Handler { return echoServer(nil) }},
}

// httpLibs key every request by r.RemoteAddr's address, never by a header:
// where a library's default reads X-Forwarded-For, it is told not to.
var httpLibs = []httpLib{
	{"ceiling", "bare", func(limit int, period time.Duration) http.Handler {
		l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: int64(limit), Period: period}})
		return l.Handler(bare)
	}},
	{"ceiling-noheaders", "bare", func(limit int, period time.Duration) http.Handler {
		l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: int64(limit), Period: period}}, ceiling.WithHeaders(ceiling.HeadersNone))
		return l.Handler(bare)
	}},
	{"ulule", "bare", func(limit int, period time.Duration) http.Handler {
		l := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: period, Limit: int64(limit)})
		return stdlib.NewMiddleware(l).Handler(bare)
	}},
	{"httprate", "bare", func(limit int, period time.Duration) http.Handler {
		return httprate.LimitBy(limit, period, func(r *http.Request) (string, error) {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			return httprate.CanonicalizeIP(host), err
		})(bare)
	}},
	{"golimiter", "bare", func(limit int, period time.Duration) http.Handler {
		store, err := memorystore.New(&memorystore.Config{Tokens: uint64(limit), Interval: period})
		if err != nil {
			panic(err)
		}
		m, err := httplimit.NewMiddleware(store, httplimit.IPKeyFunc())
		if err != nil {
			panic(err)
		}
		return m.Handle(bare)
	}},
	{"throttled", "bare", func(limit int, period time.Duration) http.Handler {
		h := &throttled.HTTPRateLimiterCtx{
			RateLimiter: throttledGCRA(throttledMemStore(), limit, period),
			VaryBy:      &throttled.VaryBy{RemoteAddr: true},
		}
		return h.RateLimit(bare)
	}},
	{"echo", "echo-bare", func(limit int, period time.Duration) http.Handler {
		store := echoStore(limit, period, 0)
		return echoServer(middleware.RateLimiter(store))
	}},
	{"xtimerate", "bare", func(limit int, period time.Duration) http.Handler {
		m := newRateMap(limit, period)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				http.Error(w, "bad address", http.StatusBadRequest)
				return
			}
			if !m.allow(host) {
				http.Error(w, "too many requests", http.StatusTooManyRequests)
				return
			}
			bare.ServeHTTP(w, r)
		})
	}},
	{"tollbooth", "bare", func(limit int, period time.Duration) http.Handler {
		return tollbooth.LimitHandler(tollboothLimiter(limit, period, 0), bare)
	}},
}

// echoServer is an Echo router with one route, GET /, that does nothing,
// behind mw when it is not nil. The client address is the connection's.
func echoServer(mw echo.MiddlewareFunc) *echo.Echo {
	e := echo.New()
	e.IPExtractor = echo.ExtractIPDirect()
	if mw != nil {
		e.Use(mw)
	}
	e.GET("/", func(c echo.Context) error { return nil })
	return e
}

// addrs returns n distinct client addresses, "ip:port".
func addrs(n int) []string {
	out := keys(n)
	for i := range out {
		out[i] += ":1234"
	}
	return out
}

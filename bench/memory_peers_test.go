package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	cmemory "github.com/ceiling-go/ceiling/backend/memory"
	"github.com/didip/tollbooth/v7"
	tblimiter "github.com/didip/tollbooth/v7/limiter"
	"github.com/go-chi/httprate"
	"github.com/labstack/echo/v4/middleware"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

var ctx = context.Background()

// allowFunc decides one request for key: admitted or not. An error is a
// limiter that could not decide.
type allowFunc func(key string) (bool, error)

// memLimiter is one in-memory limiter configured for limit per period.
// worker returns the decision function for one goroutine (most libraries
// hand every goroutine the same one); close releases background goroutines.
type memLimiter struct {
	worker func() allowFunc
	close  func()
}

// memLib is a library with an in-memory store.
type memLib struct {
	name string
	algo string
	// addrs: the library is keyed by the connection's address, so the
	// timed benchmarks hand it "ip:port" addresses, as a server would,
	// rather than bare keys (it accepts those too).
	addrs bool
	// variant: another way of calling ceiling than its public path (the
	// store alone, Limiter.Decide), timed beside it and left out of the
	// experiments, whose answers it would only repeat.
	variant bool
	// new builds a limiter admitting limit per period per key. idle is how
	// long a key must stay unused before the library may forget it, where
	// the library lets one say so (the Keys1M benchmark sets it short).
	new func(limit int, period, idle time.Duration) memLimiter
}

func same(f allowFunc) func() allowFunc { return func() allowFunc { return f } }

func noClose() {}

// memLibs are ceiling and every in-memory peer, each used the way its
// documentation shows, keyed by a string. ceiling is there three times: as
// a user runs it (ceiling: the middleware with a key function and its
// headers), through Limiter.Decide (ceiling-decide), and its store alone
// (ceiling-store, which no user calls), all under the default algorithm,
// so that what the limiter adds to the store is visible; ceiling-gcra is the
// middleware with the GCRA algorithm.
var memLibs = []memLib{
	{name: "ceiling", algo: "rolling window", addrs: true, new: ceilingHandler(backend.RollingWindow)},
	{name: "ceiling-gcra", algo: "GCRA", addrs: true, variant: true, new: ceilingHandler(backend.GCRA)},
	{name: "ceiling-decide", algo: "rolling window", variant: true, new: ceilingDecide},
	{name: "ceiling-store", algo: "rolling window", variant: true, new: func(limit int, period, idle time.Duration) memLimiter {
		return ceilingMem(backend.RollingWindow, limit, period, idle)
	}},
	{"ulule", "fixed window", false, false, func(limit int, period, idle time.Duration) memLimiter {
		store := ulmemory.NewStoreWithOptions(ulule.StoreOptions{Prefix: "bench", CleanUpInterval: idle})
		l := ulule.New(store, ulule.Rate{Period: period, Limit: int64(limit)})
		return memLimiter{worker: same(func(key string) (bool, error) {
			c, err := l.Get(ctx, key)
			return err == nil && !c.Reached, err
		}), close: noClose}
	}},
	{"httprate", "sliding window", false, false, func(limit int, period, idle time.Duration) memLimiter {
		l := httprate.NewRateLimiter(limit, period)
		// OnLimit is httprate's only decision call; it writes its headers
		// on the ResponseWriter, so each goroutine gets one to reuse.
		return memLimiter{worker: func() allowFunc {
			w := newSink()
			r := httptest.NewRequest("GET", "/", nil)
			return func(key string) (bool, error) {
				clear(w.h)
				return !l.OnLimit(w, r, key), nil
			}
		}, close: noClose}
	}},
	{"golimiter", "fixed window", false, false, func(limit int, period, idle time.Duration) memLimiter {
		store, err := memorystore.New(&memorystore.Config{Tokens: uint64(limit), Interval: period, SweepInterval: idle, SweepMinTTL: idle})
		if err != nil {
			panic(err)
		}
		return memLimiter{worker: same(func(key string) (bool, error) {
			_, _, _, ok, err := store.Take(ctx, key)
			return ok, err
		}), close: func() { store.Close(ctx) }}
	}},
	{"throttled", "GCRA", false, false, func(limit int, period, idle time.Duration) memLimiter {
		l := throttledGCRA(throttledMemStore(), limit, period)
		return memLimiter{worker: same(func(key string) (bool, error) {
			limited, _, err := l.RateLimitCtx(ctx, key, 1)
			return !limited && err == nil, err
		}), close: noClose}
	}},
	{"echo", "token bucket", false, false, func(limit int, period, idle time.Duration) memLimiter {
		store := echoStore(limit, period, idle)
		return memLimiter{worker: same(store.Allow), close: noClose}
	}},
	{"xtimerate", "token bucket", false, false, func(limit int, period, idle time.Duration) memLimiter {
		m := newRateMap(limit, period)
		return memLimiter{worker: same(func(key string) (bool, error) { return m.allow(key), nil }), close: noClose}
	}},
	{"tollbooth", "token bucket", false, false, func(limit int, period, idle time.Duration) memLimiter {
		l := tollboothLimiter(limit, period, idle)
		return memLimiter{worker: same(func(key string) (bool, error) { return !l.LimitReached(key), nil }), close: noClose}
	}},
}

// ceilingStore is the memory store the limiter is given: its default,
// sweeping idle keys every idle when the benchmark says so.
func ceilingStore(idle time.Duration) *cmemory.Store {
	sweep := cmemory.DefaultSweepInterval
	if idle > 0 {
		sweep = idle
	}
	return cmemory.New(cmemory.WithSweepInterval(sweep))
}

// ceilingHandler is ceiling as a user of the middleware runs it:
// ceiling.MustNew with one rule under algo keyed by ceiling.RemoteAddr on
// the memory store, limiter.Handler over a handler that does nothing, the
// default IETF headers. Each goroutine reuses its own request and
// ResponseWriter; the key is the request's RemoteAddr.
func ceilingHandler(algo backend.Algorithm) func(limit int, period, idle time.Duration) memLimiter {
	return func(limit int, period, idle time.Duration) memLimiter {
		s := ceilingStore(idle)
		l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: int64(limit), Period: period, Algorithm: algo}}, ceiling.WithBackend(s))
		return memLimiter{worker: handlerWorker(l.Handler(bare)), close: func() { l.Close(); s.Close() }}
	}
}

// handlerWorker returns, per goroutine, a decision function that serves one
// request from the key as its RemoteAddr through h: admitted on 200,
// rejected on 429, an error on any other status (a limiter that could not
// decide).
func handlerWorker(h http.Handler) func() allowFunc {
	return func() allowFunc {
		r := httptest.NewRequest("GET", "/", nil)
		w := newSink()
		return func(addr string) (bool, error) {
			w.reset()
			r.RemoteAddr = addr
			h.ServeHTTP(w, r)
			switch code := w.status(); code {
			case http.StatusOK:
				return true, nil
			case http.StatusTooManyRequests:
				return false, nil
			default:
				return false, fmt.Errorf("status %d", code)
			}
		}
	}
}

// ceilingDecide is ceiling's decision call without HTTP, Limiter.Decide,
// with one rule on the memory store.
func ceilingDecide(limit int, period, idle time.Duration) memLimiter {
	s := ceilingStore(idle)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Limit: int64(limit), Period: period}}, ceiling.WithBackend(s))
	return memLimiter{worker: func() allowFunc {
		in := []ceiling.Input{{Rule: "ip"}}
		return func(key string) (bool, error) {
			in[0].Key = key
			d, err := l.Decide(ctx, in...)
			return err == nil && d.Allowed, err
		}
	}, close: func() { l.Close(); s.Close() }}
}

// ceilingMem is ceiling's memory store alone deciding one rule per call
// through DecideInto, the call the limiter makes, with a key built in
// advance.
func ceilingMem(algo backend.Algorithm, limit int, period, idle time.Duration) memLimiter {
	s := ceilingStore(idle)
	return memLimiter{worker: func() allowFunc {
		reqs := []backend.Request{{Algorithm: algo, Limit: int64(limit), Period: period, Cost: 1}}
		res := make([]backend.Result, 1)
		return func(key string) (bool, error) {
			reqs[0].Key = key
			err := s.DecideInto(ctx, reqs, res)
			return err == nil && res[0].Allowed, err
		}
	}, close: func() { s.Close() }}
}

// throttledKeys bounds throttled's LRU store: room for the million keys of
// the Keys1M benchmark, like ceiling's default bound.
const throttledKeys = 1 << 20

func throttledMemStore() throttled.GCRAStoreCtx {
	st, err := memstore.NewCtx(throttledKeys)
	if err != nil {
		panic(err)
	}
	return st
}

// throttledGCRA admits a burst of limit, then limit per period: throttled's
// MaxBurst counts the requests beyond the first.
func throttledGCRA(st throttled.GCRAStoreCtx, limit int, period time.Duration) *throttled.GCRARateLimiterCtx {
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerDuration(limit, period), MaxBurst: limit - 1})
	if err != nil {
		panic(err)
	}
	return l
}

func echoStore(limit int, period, idle time.Duration) *middleware.RateLimiterMemoryStore {
	cfg := middleware.RateLimiterMemoryStoreConfig{Rate: perSecond(limit, period), Burst: limit}
	if idle > 0 {
		cfg.ExpiresIn = idle
	}
	return middleware.NewRateLimiterMemoryStoreWithConfig(cfg)
}

func tollboothLimiter(limit int, period, idle time.Duration) *tblimiter.Limiter {
	l := tollbooth.NewLimiter(float64(perSecond(limit, period)), nil)
	l.SetBurst(limit)
	l.SetIPLookups([]string{"RemoteAddr"})
	if idle > 0 {
		l.SetTokenBucketExpirationTTL(idle)
	}
	return l
}

// perSecond converts limit per period to the events per second that
// token-bucket libraries take.
func perSecond(limit int, period time.Duration) rate.Limit {
	return rate.Limit(float64(limit) / period.Seconds())
}

// rateMap is the hand-written limiter found in countless services: one
// x/time/rate token bucket per key in a map under a mutex, never swept.
type rateMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

func newRateMap(limit int, period time.Duration) *rateMap {
	return &rateMap{m: make(map[string]*rate.Limiter), limit: perSecond(limit, period), burst: limit}
}

func (m *rateMap) allow(key string) bool {
	m.mu.Lock()
	l, ok := m.m[key]
	if !ok {
		l = rate.NewLimiter(m.limit, m.burst)
		m.m[key] = l
	}
	m.mu.Unlock()
	return l.Allow()
}

// sink is a ResponseWriter that keeps only the header map and the status,
// reused across requests so that benchmarks time the limiter, not the
// recorder.
type sink struct {
	h    http.Header
	code int
}

func newSink() *sink { return &sink{h: make(http.Header)} }

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(p []byte) (int, error) { return len(p), nil }
func (s *sink) WriteHeader(code int)        { s.code = code }

func (s *sink) reset() {
	clear(s.h)
	s.code = 0
}

// status is the response's status code as a client would see it.
func (s *sink) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

// keys returns n distinct keys shaped like IPv4 addresses.
func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = ip(i)
	}
	return out
}

func ip(i int) string {
	return "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
}

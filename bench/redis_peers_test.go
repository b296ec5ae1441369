package bench

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	credis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// AddrEnv names the redis-server run.sh starts; without it the benchmarks
// and tests start their own through internal/redistest (skipping without
// redis-server unless CEILING_REQUIRE_REDIS=1).
const AddrEnv = "CEILING_BENCH_REDIS"

// redisAddr returns the address of the Redis to measure against.
func redisAddr(tb testing.TB) string {
	tb.Helper()
	if addr := os.Getenv(AddrEnv); addr != "" {
		return addr
	}
	return redistest.Shared(tb).Addr
}

// poolSize holds a connection for each of the 64 goroutines of the
// throughput benchmark, the same for every library.
const poolSize = 64

// newClient returns a client of its own (one "instance") that counts what
// it sends, closed when the test ends. It bounds a command by its
// context's deadline (ContextTimeoutEnabled), as ceiling's Store asks and
// ceilingredis.ParseURL sets, so that a lone decision is sent by its
// caller; the peers' calls carry no deadline, so it changes nothing for
// them.
func newClient(tb testing.TB, addr string) (*redis.Client, *counter) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize, DisableIdentity: true, ContextTimeoutEnabled: true})
	n := &counter{}
	c.AddHook(n)
	tb.Cleanup(func() { c.Close() })
	return c, n
}

// counter is a go-redis hook counting commands (each command of a
// pipeline counts) and round trips.
type counter struct {
	cmds, trips atomic.Int64
}

func (n *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (n *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n.cmds.Add(1)
		n.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (n *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n.cmds.Add(int64(len(cmds)))
		n.trips.Add(1)
		return next(ctx, cmds)
	}
}

// serverCalls sums the calls of every command in INFO commandstats,
// commands run inside Lua scripts included, except the connection
// handshakes and INFO itself, so that a difference of two readings is the
// work the limiters asked of Redis.
func serverCalls(tb testing.TB, c *redis.Client) int64 {
	tb.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "cmdstat_")
		if !ok {
			continue
		}
		name, stats, _ := strings.Cut(line, ":")
		switch name {
		case "info", "hello", "client|setinfo", "ping", "select":
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			tb.Fatalf("INFO commandstats line %q: %v", sc.Text(), err)
		}
		total += n
	}
	return total
}

// rule is one limit: limit per period.
type rule struct {
	limit  int
	period time.Duration
}

// redisDecider decides one request for key against every rule of the
// limiter: admitted or not.
type redisDecider func(ctx context.Context, key string) (bool, error)

// redisLib is a library with a Redis store. new returns, for one instance
// (its own client), a factory of decision functions, one per goroutine.
type redisLib struct {
	name string
	algo string
	// addrs and variant are memLib's.
	addrs, variant bool
	new            func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider
}

// redisLibs are ceiling's Redis backend and the Redis peers. A request
// under several rules is one ceiling call; the peers, which decide one
// limit per call, check the rules one after the other and stop at the
// first rejection, as their documentation shows for several limits.
//
// ceiling is there three times, as in memLibs: the middleware over the Redis
// store (ceiling), Limiter.Decide (ceiling-decide), the store alone
// (ceiling-store), under the default algorithm; ceiling-gcra is the
// middleware with the GCRA algorithm.
var redisLibs = []redisLib{
	{name: "ceiling", algo: "rolling window", addrs: true, new: ceilingRedisHandler(backend.RollingWindow)},
	{name: "ceiling-gcra", algo: "GCRA", addrs: true, variant: true, new: ceilingRedisHandler(backend.GCRA)},
	{name: "ceiling-decide", algo: "rolling window", variant: true, new: ceilingRedisDecide},
	{name: "ceiling-store", algo: "rolling window", variant: true, new: ceilingRedis(backend.RollingWindow)},
	{"ulule", "fixed window", false, false, func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		store, err := ulredis.NewStoreWithOptions(c, ulule.StoreOptions{Prefix: prefix})
		if err != nil {
			tb.Fatalf("ulule redis store: %v", err)
		}
		ls := make([]*ulule.Limiter, len(rules))
		for i, r := range rules {
			ls[i] = ulule.New(store, ulule.Rate{Period: r.period, Limit: int64(r.limit)})
		}
		return sameRedis(func(ctx context.Context, key string) (bool, error) {
			for i, l := range ls {
				res, err := l.Get(ctx, key+ruleSuffix[i])
				if err != nil || res.Reached {
					return false, err
				}
			}
			return true, nil
		})
	}},
	{"redisrate", "GCRA", false, false, func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		l := redis_rate.NewLimiter(c)
		limits := make([]redis_rate.Limit, len(rules))
		for i, r := range rules {
			limits[i] = redis_rate.Limit{Rate: r.limit, Burst: r.limit, Period: r.period}
		}
		return sameRedis(func(ctx context.Context, key string) (bool, error) {
			for i, lim := range limits {
				res, err := l.Allow(ctx, prefix+":"+key+ruleSuffix[i], lim)
				if err != nil || res.Allowed == 0 {
					return false, err
				}
			}
			return true, nil
		})
	}},
	{"throttled", "GCRA", false, false, func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		st, err := goredisstore.NewCtx(c, prefix+":")
		if err != nil {
			tb.Fatalf("throttled redis store: %v", err)
		}
		ls := make([]*throttled.GCRARateLimiterCtx, len(rules))
		for i, r := range rules {
			ls[i] = throttledGCRA(st, r.limit, r.period)
		}
		return sameRedis(func(ctx context.Context, key string) (bool, error) {
			for i, l := range ls {
				limited, _, err := l.RateLimitCtx(ctx, key+ruleSuffix[i], 1)
				if err != nil || limited {
					return false, err
				}
			}
			return true, nil
		})
	}},
}

// ruleSuffix keeps the rules of a peer apart on one key; ceiling names its
// stored keys by rule itself.
var ruleSuffix = []string{":r0", ":r1", ":r2"}

func sameRedis(f redisDecider) func() redisDecider { return func() redisDecider { return f } }

// ceilingRedis is ceiling's Redis backend with every rule under algo, all
// rules of a request decided by one call (one script). Each goroutine
// reuses its request slice, as the middleware does.
func ceilingRedis(algo backend.Algorithm) func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
	return func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		s := credis.New(c, credis.WithPrefix(prefix))
		return func() redisDecider {
			reqs := make([]backend.Request, len(rules))
			for i, r := range rules {
				reqs[i] = backend.Request{Algorithm: algo, Limit: int64(r.limit), Period: r.period, Cost: 1}
			}
			return func(ctx context.Context, key string) (bool, error) {
				for i := range reqs {
					reqs[i].Key = key + ruleSuffix[i]
				}
				res, err := s.Decide(ctx, reqs)
				if err != nil {
					return false, err
				}
				for _, r := range res {
					if !r.Allowed {
						return false, nil
					}
				}
				return true, nil
			}
		}
	}
}

// benchSecret is the key secret of the limiters on Redis: what a service
// configures (without one the limiter warns), so the HMAC of each key is
// part of what is timed.
var benchSecret = []byte("bench-secret-bench-secret-bench-secret")

// ceilingRedisLimiter is ceiling.New over the Redis store with one rule per
// rule (r0, r1...), keyed by RemoteAddr when keyed, else left to
// Limiter.Decide's inputs. The defaults stay (fail mode FailLocal, 100ms
// timeout, circuit breaker): a decision the backend could not make is
// decided locally and admitted, so the limiter is registered for
// fallbacks to count those as errors.
func ceilingRedisLimiter(tb testing.TB, c *redis.Client, prefix string, rules []rule, algo backend.Algorithm, keyed bool) *ceiling.Limiter {
	rs := make([]ceiling.Rule, len(rules))
	for i, r := range rules {
		rs[i] = ceiling.Rule{Name: "r" + itoa(i), Limit: int64(r.limit), Period: r.period, Algorithm: algo}
		if keyed {
			rs[i].Key = ceiling.RemoteAddr
		}
	}
	opts := []ceiling.Option{ceiling.WithBackend(credis.New(c, credis.WithPrefix(prefix))), ceiling.WithKeySecret(benchSecret)}
	if _, test := tb.(*testing.T); test {
		// The sanity tests count what is admitted, not how fast: on a loaded
		// machine a decision past 100 ms would be shed, and that is not
		// what they check. The benchmarks keep the default.
		opts = append(opts, ceiling.WithTimeout(2*time.Second))
	}
	l, err := ceiling.New(rs, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	limiters.Store(prefix, l)
	return l
}

// limiters holds the limiters of the Redis benchmarks by prefix, for
// fallbacks.
var limiters sync.Map

// fallbacks counts the admissions the limiter of prefix made without the
// backend (its fail mode's), if prefix is a limiter's.
func fallbacks(prefix string) int64 {
	l, ok := limiters.Load(prefix)
	if !ok {
		return 0
	}
	var n int64
	for _, r := range l.(*ceiling.Limiter).Health().Rules {
		n += r.FailOpenAdmissions + r.FailLocalAdmissions
	}
	return n
}

// ceilingRedisHandler is the middleware over the Redis store, as a service
// runs it, every rule under algo: the key is the request's RemoteAddr, the
// IETF headers are written, the handler does nothing.
func ceilingRedisHandler(algo backend.Algorithm) func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
	return func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		worker := handlerWorker(ceilingRedisLimiter(tb, c, prefix, rules, algo, true).Handler(bare))
		return func() redisDecider {
			allow := worker()
			return func(_ context.Context, key string) (bool, error) { return allow(key) }
		}
	}
}

// ceilingRedisDecide is Limiter.Decide over the Redis store, every rule on
// the key.
func ceilingRedisDecide(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
	l := ceilingRedisLimiter(tb, c, prefix, rules, backend.RollingWindow, false)
	return func() redisDecider {
		in := make([]ceiling.Input, len(rules))
		for i := range in {
			in[i].Rule = "r" + itoa(i)
		}
		return func(ctx context.Context, key string) (bool, error) {
			for i := range in {
				in[i].Key = key
			}
			d, err := l.Decide(ctx, in...)
			return err == nil && d.Allowed, err
		}
	}
}

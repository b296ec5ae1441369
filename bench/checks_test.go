package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every benchmark first checks that what it is about to time is what it
// claims to time: the limit is really enforced (10 of 15 admitted against a
// limit of 10) and distinct keys are really distinct (a limit of 1 admits
// each key once). The plain tests run the same checks.

// enforceLimit and enforceTries: an adapter that admits 15 of 15 against a
// limit of 10 fails.
const (
	enforceLimit = 10
	enforceTries = 15
)

// checkMem fails tb unless lib admits exactly enforceLimit of enforceTries
// on one key, and, over ks with a limit of 1, admits every key once and
// then rejects them.
func checkMem(tb testing.TB, lib memLib, ks []string) {
	tb.Helper()
	l := lib.new(enforceLimit, time.Minute, 0)
	defer l.close()
	allow := l.worker()
	admitted := 0
	for range enforceTries {
		ok, err := allow("10.0.0.1")
		if err != nil {
			tb.Fatalf("%s: %v", lib.name, err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != enforceLimit {
		tb.Fatalf("%s admitted %d of %d requests on one key against a limit of %d", lib.name, admitted, enforceTries, enforceLimit)
	}
	if len(ks) < 2 {
		return
	}
	one := lib.new(1, time.Minute, 0)
	defer one.close()
	allow = one.worker()
	for i, k := range ks {
		if ok, err := allow(k); !ok || err != nil {
			tb.Fatalf("%s: key %d of %d (%q) was rejected (err %v) under a limit of 1: keys are not distinct", lib.name, i, len(ks), k, err)
		}
	}
	for _, k := range []string{ks[0], ks[len(ks)/2], ks[len(ks)-1]} {
		if ok, _ := allow(k); ok {
			tb.Fatalf("%s: key %q admitted twice under a limit of 1: its state was not kept", lib.name, k)
		}
	}
}

// checkHTTP fails tb unless the middleware answers [200×10, 429×5] to 15
// requests from one address while another address still gets 200, and,
// over addrs with a limit of 1, admits each address once and then rejects it.
func checkHTTP(tb testing.TB, lib httpLib, addrs []string) {
	tb.Helper()
	h := lib.new(enforceLimit, time.Minute)
	var got []int
	for range enforceTries {
		got = append(got, serve(h, "10.0.0.1:1234"))
	}
	for i, code := range got {
		want := http.StatusOK
		if i >= enforceLimit {
			want = http.StatusTooManyRequests
		}
		if code != want {
			tb.Fatalf("%s: statuses %v for %d requests from one address under a limit of %d", lib.name, got, enforceTries, enforceLimit)
		}
	}
	if code := serve(h, "10.0.0.2:1234"); code != http.StatusOK {
		tb.Fatalf("%s: another address got %d: the limit is not per client", lib.name, code)
	}
	if len(addrs) < 2 {
		return
	}
	h = lib.new(1, time.Minute)
	for i, a := range addrs {
		if code := serve(h, a); code != http.StatusOK {
			tb.Fatalf("%s: address %d of %d (%s) got %d under a limit of 1: clients are not distinct", lib.name, i, len(addrs), a, code)
		}
	}
	if code := serve(h, addrs[len(addrs)-1]); code != http.StatusTooManyRequests {
		tb.Fatalf("%s: address %s admitted twice under a limit of 1 (status %d)", lib.name, addrs[len(addrs)-1], code)
	}
}

// serve sends one GET / from addr through h and returns the status.
func serve(h http.Handler, addr string) int {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr
	w := newSink()
	h.ServeHTTP(w, r)
	return w.status()
}

// enforceRules are the rules of the Redis checks: the tight one last, so
// that a limiter that looks only at its first rule fails.
func enforceRules(n int) []rule {
	rules := []rule{{1_000_000, time.Hour}, {1_000_000, 24 * time.Hour}}[:n-1]
	return append(rules, rule{enforceLimit, time.Minute})
}

// checkRedis fails tb unless lib, under nRules rules, admits exactly
// enforceLimit of enforceTries on one key, and, with a limit of 1, admits
// each of nKeys keys once and then rejects them.
func checkRedis(tb testing.TB, lib redisLib, addr string, nRules, nKeys int) {
	tb.Helper()
	c, _ := newClient(tb, addr)
	decide := lib.new(tb, c, prefix(tb), enforceRules(nRules))()
	admitted := 0
	for range enforceTries {
		ok, err := decide(ctx, "10.0.0.1")
		if err != nil {
			tb.Fatalf("%s: %v", lib.name, err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != enforceLimit {
		tb.Fatalf("%s admitted %d of %d on one key against a limit of %d under %d rules", lib.name, admitted, enforceTries, enforceLimit, nRules)
	}
	one := lib.new(tb, c, prefix(tb), []rule{{1, time.Minute}})
	ks := keys(nKeys)
	var wg sync.WaitGroup
	errs := make(chan error, nKeys)
	for g := range 16 {
		wg.Go(func() {
			decide := one()
			for i := g; i < nKeys; i += 16 {
				ok, err := decide(ctx, ks[i])
				if err == nil && !ok {
					err = errNotDistinct(ks[i])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatalf("%s: %v", lib.name, err)
	}
	if ok, _ := one()(ctx, ks[0]); ok {
		tb.Fatalf("%s: key %q admitted twice under a limit of 1", lib.name, ks[0])
	}
}

type errNotDistinct string

func (e errNotDistinct) Error() string {
	return "key " + string(e) + " rejected under a limit of 1: keys are not distinct"
}

// prefix is a key prefix of the calling test's own on the shared Redis.
var prefixes struct {
	sync.Mutex
	n int
}

func prefix(tb testing.TB) string {
	prefixes.Lock()
	defer prefixes.Unlock()
	prefixes.n++
	return "bench" + itoa(prefixes.n) + "_" + itoa(int(time.Now().UnixNano()%1e9))
}

// exactLimit, exactCalls and exactInstances are the exactness experiment:
// 1000 concurrent decisions on one key from 4 instances, limit 100 per
// minute.
const (
	exactLimit     = 100
	exactCalls     = 1000
	exactInstances = 4
)

// exactOutcome is what the instances were told.
type exactOutcome struct {
	admitted, rejected, errors int
	elapsed                    time.Duration
}

// runExact starts exactInstances instances of lib (each its own client and
// limiter) on addr, releases exactCalls goroutines at once on one key, and
// counts the answers.
func runExact(tb testing.TB, lib redisLib, addr string) exactOutcome {
	tb.Helper()
	p := prefix(tb)
	var deciders []func() redisDecider
	for range exactInstances {
		c, _ := newClient(tb, addr)
		if err := c.Ping(ctx).Err(); err != nil {
			tb.Fatal(err)
		}
		deciders = append(deciders, lib.new(tb, c, p, []rule{{exactLimit, time.Minute}}))
	}
	var (
		mu    sync.Mutex
		out   exactOutcome
		start = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i := range exactCalls {
		decide := deciders[i%exactInstances]()
		wg.Go(func() {
			<-start
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			ok, err := decide(cctx, "victim")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				out.errors++
			case ok:
				out.admitted++
			default:
				out.rejected++
			}
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	out.elapsed = time.Since(t0)
	return out
}

// redisFor returns a client on addr without hooks, for INFO.
func redisFor(tb testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	tb.Cleanup(func() { c.Close() })
	return c
}

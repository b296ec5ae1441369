package ceiling

import (
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// instances returns n limiters with rule, each on its own Redis client
// (separate processes, as far as Redis can tell), sharing one key space.
func instances(t *testing.T, n int, rule Rule) ([]*Limiter, []*redis.Client) {
	t.Helper()
	srv := redistest.Shared(t)
	prefix := redistest.KeyPrefix(t)
	var ls []*Limiter
	var cs []*redis.Client
	for range n {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		l := MustNew([]Rule{rule}, WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(prefix))),
			WithTimeout(2*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
		t.Cleanup(func() { l.Close() })
		ls, cs = append(ls, l), append(cs, c)
	}
	return ls, cs
}

// 20 requests for one shop race through 3 instances with a limit of 3 in
// flight: never more than 3 are inside a handler at once, 3 are at some
// point, and every request gets its turn (a refused one retries).
func TestConcurrencyExactAcrossInstancesOnRedis(t *testing.T) {
	ls, _ := instances(t, 3, Rule{Name: "answers", Key: headerKey("X-Shop"), Limit: 3, Period: 5 * time.Second, Algorithm: Concurrency})
	var inside, peak atomic.Int64
	work := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		n := inside.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond) // a handler's real work, so that requests overlap on redis-server
		inside.Add(-1)
	})
	hs := make([]http.Handler, len(ls))
	for i, l := range ls {
		hs[i] = l.Handler(work)
	}
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			for attempt := range 2000 {
				w := serve(t, hs[(i+attempt)%len(hs)], inflightRequest("acme"))
				if w.Code == 200 {
					served.Add(1)
					return
				}
				if w.Code != 429 {
					t.Errorf("status %d: %s", w.Code, w.Body)
					return
				}
				refused.Add(1)
				time.Sleep(2 * time.Millisecond) // a refused client's pace before it retries
			}
		})
	}
	wg.Wait()
	if got := peak.Load(); got != 3 {
		t.Errorf("at most %d requests were in flight at once, want exactly 3", got)
	}
	if served.Load() != 20 || refused.Load() == 0 {
		t.Errorf("%d served, %d refused: want all 20 served after some refusals", served.Load(), refused.Load())
	}
	t.Logf("20 requests served through 3 instances, %d refusals on the way, peak %d in flight", refused.Load(), peak.Load())
}

// A long request keeps its slot past the lease (it is renewed); when its
// instance dies (its Redis client is gone, nothing renews or releases),
// the slots come back to the other instances once the lease expires.
func TestConcurrencyLeasesOfAKilledInstanceExpire(t *testing.T) {
	const lease = time.Second
	ls, cs := instances(t, 2, Rule{Name: "exports", Key: headerKey("X-Shop"), Limit: 2, Period: lease, Algorithm: Concurrency})
	g := newGate()
	doomed := ls[0].Handler(g)
	var dones []chan struct{}
	for range 2 {
		_, done := start(doomed, inflightRequest("acme"))
		dones = append(dones, done)
		<-g.entered
	}
	t.Cleanup(func() {
		for range dones {
			g.leave <- struct{}{}
		}
		for _, d := range dones {
			<-d
		}
	})
	other := ls[1].Handler(okHandler)
	// Twice the lease later the slots are still held: they were renewed.
	time.Sleep(2 * lease) // redis-server's clock: the lease must pass there
	if w := serve(t, other, inflightRequest("acme")); w.Code != 429 {
		t.Fatalf("2 leases after the slots were taken: %d, want 429 (renewed)", w.Code)
	}

	cs[0].Close() // the instance dies: no renewal, no release
	killed := time.Now()
	if w := serve(t, other, inflightRequest("acme")); w.Code != 429 {
		t.Fatalf("right after the holder died: %d, want 429", w.Code)
	}
	for {
		w := serve(t, other, inflightRequest("acme"))
		if w.Code == 200 {
			t.Logf("slots back %v after the holder died (lease %v)", time.Since(killed).Round(10*time.Millisecond), lease)
			break
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("the dead instance's slots never came back (last %d)", w.Code)
		}
		time.Sleep(50 * time.Millisecond) // polling redis-server until the lease expires on its clock
	}
}

package ceiling

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// These tests break a real redis-server (redistest.Server: a process of
// the test's own on a free loopback port) under the limiter: killed,
// frozen with SIGSTOP, restarted. Without redis-server they skip, unless
// CEILING_REQUIRE_REDIS=1.

// countingObserver counts backend calls, for "the backend sees no calls".
type countingObserver struct {
	NopObserver
	calls atomic.Int64
}

func (o *countingObserver) ObserveBackend(time.Duration, error) { o.calls.Add(1) }

// redisStore returns a Store on a plain go-redis client with default
// options: it does not honour context deadlines (ContextTimeoutEnabled is
// off), so the middleware's own timeout is what holds.
func redisStore(t *testing.T, inst *redistest.Instance) *ceilingredis.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: inst.Addr})
	t.Cleanup(func() { c.Close() })
	return ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
}

// loadedTimeout is the backend timeout of the Redis tests that are not
// about the timeout: at the default 100 ms a scheduler delay on a loaded
// machine alone can pass it on a healthy Redis, and the limiter then sheds
// the request by design (docs/failure.md), which such a test would take
// for the failure it looks for. A killed Redis still fails at once.
const loadedTimeout = 2 * time.Second

// load runs workers that send requests with distinct client addresses until
// stop is closed (or each has sent max), recording every status.
type load struct {
	mu       sync.Mutex
	statuses map[int]int
	wg       sync.WaitGroup
	stop     chan struct{}
}

func startLoad(h http.Handler, workers, max int) *load {
	ld := &load{statuses: map[int]int{}, stop: make(chan struct{})}
	for w := range workers {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for i := range max {
				select {
				case <-ld.stop:
					return
				default:
				}
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = "10.0." + strconv.Itoa(w) + "." + strconv.Itoa(i%250) + ":1"
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				ld.mu.Lock()
				ld.statuses[rec.Code]++
				ld.mu.Unlock()
			}
		}()
	}
	return ld
}

func (ld *load) finish() map[int]int {
	close(ld.stop)
	ld.wg.Wait()
	return ld.statuses
}

// Killed under load, failing open: no request sees a 5xx, and the
// degradation is reported within a second of the kill.
func TestRedisKilledUnderLoadFailOpen(t *testing.T) {
	inst := redistest.Server(t)
	events := make(chan DegradedEvent, 4)
	l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 1_000_000, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithTimeout(loadedTimeout), WithLogger(slog.New(slog.DiscardHandler)),
		onDegraded(func(e DegradedEvent) { events <- e }))
	defer l.Close()
	if err := l.Check(t.Context()); err != nil {
		t.Fatalf("start-up check on a live Redis: %v", err)
	}
	ld := startLoad(l.Handler(okHandler), 4, 5000)
	// Let the load reach Redis before killing it.
	for ld.count(200) < 100 {
		time.Sleep(time.Millisecond) // real load reaching redis-server before it is killed
	}
	inst.Kill()
	killed := time.Now()
	select {
	case e := <-events:
		if !e.Degraded {
			t.Fatalf("first event %+v, want degraded", e)
		}
		t.Logf("degraded reported %v after the kill: %v", time.Since(killed), e.Cause)
	case <-time.After(time.Second):
		t.Fatal("no degraded event within a second of killing Redis under load")
	}
	statuses := ld.finish()
	for code, n := range statuses {
		if code != 200 {
			t.Errorf("%d requests answered %d; failing open must answer 200", n, code)
		}
	}
	h := get(t, l.HealthHandler())
	if h.Code != 503 {
		t.Errorf("health while Redis is down: %d, want 503", h.Code)
	}
	if l.Health().Rules[0].FailOpenAdmissions == 0 {
		t.Error("no fail-open admission was counted")
	}
}

func (ld *load) count(code int) int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.statuses[code]
}

// Killed, failing closed: 503 with Retry-After, never a 200 that nobody
// counted.
func TestRedisKilledFailClosed(t *testing.T) {
	inst := redistest.Server(t)
	l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 1000, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailClosed), WithTimeout(loadedTimeout), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	if w := get(t, h); w.Code != 200 {
		t.Fatalf("with Redis up: %d", w.Code)
	}
	inst.Kill()
	for i := range 20 {
		w := get(t, h)
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with Redis down: %d, want 503", i, w.Code)
		}
		if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("request %d: Retry-After %q, want whole seconds ≥ 1", i, w.Header().Get("Retry-After"))
		}
	}
	if got := l.Health().Status; got != "degraded" {
		t.Errorf("health %q, want degraded", got)
	}
}

// Frozen with SIGSTOP (a hung server: connections open, no answers), on a
// client that ignores context deadlines: each request waits at most about
// the timeout, and is shed (503) rather than failed open until a probe
// confirms that Redis, not this process, is at fault; then the breaker
// opens, the backend is not called at all and requests do not wait.
func TestRedisFrozenTimeoutsThenBreaker(t *testing.T) {
	// How fast a frozen Redis is blamed depends on this process having a
	// CPU: a starved one waits up to 2 s for a reply (backend/redis).
	citest.Only(t)
	inst := redistest.Server(t)
	const timeout = 50 * time.Millisecond
	const slack = time.Second // generous: a loaded CI machine
	obs := &countingObserver{}
	l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 1000, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithTimeout(timeout), WithObserver(obs),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	if w := get(t, h); w.Code != 200 {
		t.Fatalf("with Redis up: %d", w.Code)
	}
	inst.Freeze(t)
	defer inst.Thaw(t)
	for i := range 3 {
		start := time.Now()
		w := get(t, h)
		if d := time.Since(start); d > timeout+slack {
			t.Errorf("request %d took %v against a frozen Redis, want at most about the timeout %v", i, d, timeout)
		}
		if w.Code != 503 || w.Header().Get("Retry-After") != "1" {
			t.Errorf("request %d: %d, Retry-After %q, want 503 and 1 (shed: the timeout is not confirmed yet)", i, w.Code, w.Header().Get("Retry-After"))
		}
	}
	if got := l.Health(); got.Shed != 3 || got.Rules[0].FailOpenAdmissions != 0 {
		t.Errorf("after 3 unconfirmed timeouts: %d shed, %d failed open; want 3 and 0", got.Shed, got.Rules[0].FailOpenAdmissions)
	}
	frozen := time.Now()
	for l.Health().Status != "degraded" {
		if time.Since(frozen) > confirmBudget+slack {
			t.Fatalf("after 3 timeouts: %q %v later, want degraded once the probe (budget %v) fails", l.Health().Status, time.Since(frozen), confirmBudget)
		}
		time.Sleep(5 * time.Millisecond) // the probe waits on the real, frozen server
	}
	calls := obs.calls.Load()
	// A request that waited for the backend takes the timeout; one of a
	// few may take as long from a pause of this process on a loaded
	// machine (CI saw one of 97ms), never many.
	var slow []time.Duration
	for i := range 200 {
		start := time.Now()
		if w := get(t, h); w.Code != 200 {
			t.Fatalf("request %d with the breaker open: %d", i, w.Code)
		}
		if d := time.Since(start); d > timeout {
			slow = append(slow, d)
		}
	}
	if len(slow) > 5 {
		t.Errorf("%d of 200 requests with the breaker open took over the timeout %v (%v): they waited for the backend", len(slow), timeout, slow)
	}
	if got := obs.calls.Load() - calls; got != 0 {
		t.Errorf("the backend saw %d calls while the breaker was open, want 0", got)
	}
}

// Killed and restarted: the same limiter (no service restart) finds Redis
// back by itself, with no request, within about a second of it answering,
// and enforces through it again.
func TestRedisRestartRecovers(t *testing.T) {
	inst := redistest.Server(t)
	var events []DegradedEvent
	var mu sync.Mutex
	l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: SlidingLog}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithTimeout(loadedTimeout),
		WithBreaker(BreakerConfig{Failures: 2}), WithLogger(slog.New(slog.DiscardHandler)),
		onDegraded(func(e DegradedEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	defer l.Close()
	h := l.Handler(okHandler)
	if got, want := codes(t, h, 1), []int{200}; !sameInts(got, want) {
		t.Fatalf("with Redis up: %v", got)
	}
	inst.Kill()
	codes(t, h, 5)
	if got := l.Health().Status; got != "degraded" {
		t.Fatalf("Redis down: %q", got)
	}
	inst.Restart(t) // empty: nothing is persisted
	back := time.Now()
	if !eventually(func() bool { return l.Health().Status == "healthy" }) {
		t.Fatal("Redis is back but the idle limiter stays degraded")
	}
	// The prober asks at most 1s apart (jittered): healthy within about 1s,
	// with room for a loaded CI machine, not the old doubling cool-down's
	// 6-12s.
	if d := time.Since(back); d > 3*time.Second {
		t.Errorf("healthy %v after Redis answered again, want within about 1s (3s allowed)", d)
	} else {
		t.Logf("healthy %v after Redis answered again, with no request", d)
	}
	// A fresh client: a decision the store still had queued when Redis
	// died may have reached the new one for the old client.
	var got []int
	for range 5 {
		got = append(got, fromAddr(h, "198.51.100.77"))
	}
	if want := []int{200, 200, 200, 429, 429}; !sameInts(got, want) {
		t.Errorf("after the restart: %v, want %v (enforced by Redis again)", got, want)
	}
	// Health can say healthy a moment before the prober delivers the event.
	eventually(func() bool { mu.Lock(); defer mu.Unlock(); return len(events) >= 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || !events[0].Degraded || events[1].Degraded {
		t.Errorf("events %+v, want degraded then healthy", events)
	}
}

// Failing local while Redis is down still enforces a bounded limit: the
// instance's share, on its own memory.
func TestRedisDownFailLocalStillEnforces(t *testing.T) {
	inst := redistest.Server(t)
	l := MustNew([]Rule{{Name: "otp:phone", Key: RemoteAddr, Limit: 6, Period: time.Hour, Algorithm: SlidingLog}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailLocal), WithInstances(2), WithTimeout(loadedTimeout), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	if got, want := codes(t, h, 2), []int{200, 200}; !sameInts(got, want) {
		t.Fatalf("with Redis up: %v", got)
	}
	inst.Kill()
	// Locally the instance admits its share of the limit, 6/2 = 3, starting
	// from what Redis last said: 2 of 6 spent, of which its half (1) counts
	// against its share. Two instances so continue where Redis stopped.
	if got, want := codes(t, h, 6), []int{200, 200, 429, 429, 429, 429}; !sameInts(got, want) {
		t.Errorf("with Redis down: %v, want %v", got, want)
	}
	if got, want := l.Health().Rules[0].FailLocalAdmissions, int64(2); got != want {
		t.Errorf("fail-local admissions %d, want %d", got, want)
	}
}

package memory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		s := New(WithClock(now))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestConformanceOneShard runs the suite with a store of one shard and
// a tight key bound, so that multi-key calls share a lock and tables grow
// and shrink under the suite's traffic.
func TestConformanceOneShard(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		s := New(WithClock(now), WithMaxKeys(100), WithSweepInterval(0))
		if got := len(s.shards); got != 1 {
			t.Fatalf("%d shards for 100 keys, want 1", got)
		}
		return s
	})
}

var ctx = context.Background()

// fakeClock is a settable clock for the memory-specific tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestStore(t *testing.T, opts ...Option) (*Store, *fakeClock) {
	t.Helper()
	c := &fakeClock{t: backendtest.Epoch}
	s := New(append([]Option{WithClock(c.now), WithSweepInterval(0)}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s, c
}

func decide(t *testing.T, s *Store, reqs ...backend.Request) []backend.Result {
	t.Helper()
	res, err := s.Decide(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestIdleKeysAreSwept(t *testing.T) {
	s, clock := newTestStore(t)
	for _, alg := range backend.Algorithms() {
		for i := range 10 {
			decide(t, s, backend.Request{Key: fmt.Sprintf("%v:%d", alg, i), Algorithm: alg, Limit: 10, Period: time.Second, Cost: 1})
		}
	}
	if got, want := s.Len(), 50; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	clock.t = clock.t.Add(999 * time.Millisecond) // GCRA: T = 100ms, back to full
	if got, want := s.sweep(), 10; got != want {
		t.Errorf("sweep at 999ms deleted %d, want %d (the GCRA keys)", got, want)
	}
	clock.t = backendtest.Epoch.Add(time.Second) // the log and the fixed window
	if got, want := s.sweep(), 20; got != want {
		t.Errorf("sweep at 1s deleted %d, want %d", got, want)
	}
	// The sliding window's current count no longer weighs; the rolling
	// window's bucket (62.5ms wide) left at 1.0625s.
	clock.t = backendtest.Epoch.Add(2 * time.Second)
	if got, want := s.sweep(), 20; got != want {
		t.Errorf("sweep at 2s deleted %d, want %d", got, want)
	}
	if got := s.Len(); got != 0 {
		t.Errorf("Len after the sweeps = %d, want 0", got)
	}
}

func TestRefundToFullDeletesTheKey(t *testing.T) {
	s, _ := newTestStore(t)
	for _, alg := range backend.Algorithms() {
		r := backend.Request{Key: "k", Algorithm: alg, Limit: 10, Period: time.Second, Cost: 2}
		decide(t, s, r)
		if got := s.Len(); got != 1 {
			t.Fatalf("%v: Len after a charge = %d, want 1", alg, got)
		}
		r.Cost = -2
		decide(t, s, r)
		if got := s.Len(); got != 0 {
			t.Errorf("%v: Len after refunding everything = %d, want 0", alg, got)
		}
		decide(t, s, backend.Request{Key: "k", Algorithm: alg, Limit: 10, Period: time.Second}) // a peek stores nothing
		if got := s.Len(); got != 0 {
			t.Errorf("%v: Len after a peek = %d, want 0", alg, got)
		}
	}
}

// TestMaxKeysUnderAFlood is the million-attacker simulation, scaled down:
// 20 000 fresh keys against a bound of 1 000. The store stays bounded and
// counts every live key it had to forget.
func TestMaxKeysUnderAFlood(t *testing.T) {
	const bound, attackers = 1000, 20_000
	s, _ := newTestStore(t, WithMaxKeys(bound))
	res := make([]backend.Result, 1)
	for i := range attackers {
		r := []backend.Request{{Key: fmt.Sprintf("ip:%d", i), Algorithm: backend.GCRA, Limit: 5, Period: time.Minute, Cost: 1}}
		if err := s.DecideInto(ctx, r, res); err != nil {
			t.Fatal(err)
		}
		if !res[0].Allowed {
			t.Fatalf("attacker %d rejected: a fresh key has its full quota", i)
		}
	}
	if got, max := s.Len(), bound+len(s.shards); got > max {
		t.Errorf("Len = %d, want at most %d", got, max)
	}
	if got, min := s.Evictions(), uint64(attackers-bound-len(s.shards)); got < min {
		t.Errorf("Evictions = %d, want at least %d", got, min)
	}
}

// TestMaxKeysEvictsExpiredFirst: keys already back to full make room for
// new ones without counting as a weakening.
func TestMaxKeysEvictsExpiredFirst(t *testing.T) {
	s, clock := newTestStore(t, WithMaxKeys(64))
	fill := func(prefix string) {
		for i := range 64 {
			decide(t, s, backend.Request{Key: fmt.Sprintf("%s:%d", prefix, i), Algorithm: backend.FixedWindow, Limit: 5, Period: time.Second, Cost: 1})
		}
	}
	fill("old")
	clock.t = clock.t.Add(time.Second) // every old window has ended
	fill("new")
	if got := s.Evictions(); got != 0 {
		t.Errorf("Evictions = %d, want 0: only expired state was replaced", got)
	}
	if got := s.Len(); got != 64 {
		t.Errorf("Len = %d, want 64", got)
	}
}

// TestMaxKeysEvictsClosestToFull: with every key live, the one whose state
// is soonest back to full is the one forgotten (here the shard is small
// enough for the sample to see all of it).
func TestMaxKeysEvictsClosestToFull(t *testing.T) {
	s, _ := newTestStore(t, WithMaxKeys(8))
	r := backend.Request{Algorithm: backend.GCRA, Limit: 10, Period: time.Second, Cost: 5}
	for i := range 8 {
		r.Key = fmt.Sprintf("heavy:%d", i)
		if i == 3 {
			r.Key, r.Cost = "light", 1
		}
		decide(t, s, r)
		r.Cost = 5
	}
	r.Key, r.Cost = "newcomer", 1
	decide(t, s, r)
	if got := s.Evictions(); got != 1 {
		t.Fatalf("Evictions = %d, want 1", got)
	}
	r.Key, r.Cost = "light", 0
	if got := decide(t, s, r)[0].Remaining; got != 10 {
		t.Errorf("light key remaining = %d, want 10 (it was the one evicted)", got)
	}
	r.Key = "heavy:0"
	if got := decide(t, s, r)[0].Remaining; got != 5 {
		t.Errorf("heavy key remaining = %d, want 5 (kept)", got)
	}
}

// TestSweepShrinksTables: once keys go idle the tables are rebuilt small, so
// the heap really shrinks (a Go map would keep its peak size).
func TestSweepShrinksTables(t *testing.T) {
	s, clock := newTestStore(t)
	const n = 20_000
	for i := range n {
		alg := backend.Algorithm(i % 5)
		decide(t, s, backend.Request{Key: fmt.Sprintf("k:%d", i), Algorithm: alg, Limit: 10, Period: time.Second, Cost: 1})
	}
	decide(t, s, backend.Request{Key: "survivor", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour, Cost: 1})
	before := heapInUse()
	clock.t = clock.t.Add(2 * time.Second)
	if got, want := s.sweep(), n; got != want {
		t.Fatalf("sweep deleted %d, want %d", got, want)
	}
	after := heapInUse()
	if freed := int64(before) - int64(after); freed < n*30 {
		t.Errorf("sweep freed %d bytes for %d keys, want at least 30 per key", freed, n)
	}
	slots := 0
	for i := range s.shards {
		sh := &s.shards[i]
		slots += len(sh.gcra.slots) + len(sh.windows.slots) + len(sh.logs.slots)
	}
	if slots > minSlots {
		t.Errorf("%d slots left for one key, want at most %d", slots, minSlots)
	}
	if got := decide(t, s, backend.Request{Key: "survivor", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour})[0].Remaining; got != 0 {
		t.Errorf("the live key lost its state in the rebuild: remaining %d, want 0", got)
	}
}

func TestCloseStopsJanitor(t *testing.T) {
	defer goleak.VerifyNone(t)
	clock := &fakeClock{t: backendtest.Epoch}
	s := New(WithClock(clock.now), WithSweepInterval(time.Millisecond))
	decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1})
	s.Close()
	s.Close() // idempotent
	// The store still answers after Close.
	if got := decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second}); got[0].Remaining != 0 {
		t.Errorf("after Close: %+v", got[0])
	}
}

// The janitor deletes a key back to full on its next sweep, with no write
// to the key.
func TestJanitorSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(WithSweepInterval(time.Minute))
		defer s.Close()
		decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1})
		time.Sleep(time.Minute + time.Second) // past the first sweep
		synctest.Wait()
		if n := s.Len(); n != 0 {
			t.Errorf("after a sweep the store holds %d keys, want the idle key deleted", n)
		}
	})
}

func TestNoAllocations(t *testing.T) {
	s, _ := newTestStore(t)
	for _, n := range []int{1, 3, smallCall} {
		reqs := make([]backend.Request, n)
		for i := range reqs {
			reqs[i] = backend.Request{Key: fmt.Sprintf("k%d", i), Algorithm: backend.Algorithm(i % 5), Limit: 1 << 20, Period: time.Hour, Cost: 1}
		}
		res := make([]backend.Result, n)
		allocs := testing.AllocsPerRun(100, func() {
			if err := s.DecideInto(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("DecideInto with %d requests: %v allocations, want 0", n, allocs)
		}
	}
}

func TestInvalidRequestNamesTheKey(t *testing.T) {
	s, _ := newTestStore(t)
	_, err := s.Decide(ctx, []backend.Request{{Key: "otp:to", Algorithm: backend.GCRA, Limit: 0, Period: time.Second}})
	if !errors.Is(err, backend.ErrInvalidRequest) || !strings.Contains(err.Error(), `"otp:to"`) {
		t.Errorf("error %q: want one wrapping ErrInvalidRequest and naming the key", err)
	}
}

func TestWithMaxKeysRejectsZero(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("WithMaxKeys(0) did not panic")
		}
	}()
	WithMaxKeys(0)
}

func TestDefaultClockIsWallTimeInMicroseconds(t *testing.T) {
	s := New(WithSweepInterval(time.Minute))
	defer s.Close()
	before := time.Now().UnixMicro()
	got := s.now()
	after := time.Now().UnixMicro()
	if got < before-1000 || got > after+1000 {
		t.Errorf("now() = %d, want within 1ms of [%d, %d]", got, before, after)
	}
}

// TestSweepShrinksPartly: when most keys of a table go idle, the table is
// rebuilt at the size the survivors need, not kept at its peak.
func TestSweepShrinksPartly(t *testing.T) {
	s, clock := newTestStore(t, WithMaxKeys(64)) // one shard, one table to look at
	sh := &s.shards[0]
	sh.maxKeys = 10_000
	for i := range 10_000 {
		period := time.Second
		if i%10 == 0 {
			period = time.Hour // one key in ten stays busy
		}
		decide(t, s, backend.Request{Key: fmt.Sprint(i), Algorithm: backend.GCRA, Limit: 1, Period: period, Cost: 1})
	}
	peak := len(sh.gcra.slots)
	clock.t = clock.t.Add(time.Second)
	s.sweep()
	if got, want := sh.gcra.n, 1000; got != want {
		t.Fatalf("%d keys left, want %d", got, want)
	}
	if got := len(sh.gcra.slots); got > 4*1000 {
		t.Errorf("table has %d slots for 1000 keys (peak %d), want at most 4000", got, peak)
	}
}

// TestSlidingLogGivesBackABurst: a log that held many entries keeps only
// the memory its live entries need once the burst has left the window.
func TestSlidingLogGivesBackABurst(t *testing.T) {
	s, clock := newTestStore(t)
	r := backend.Request{Key: "k", Algorithm: backend.SlidingLog, Limit: 1000, Period: time.Second, Cost: 1}
	for range 1000 {
		decide(t, s, r)
		clock.t = clock.t.Add(time.Microsecond) // one entry per admission
	}
	clock.t = clock.t.Add(time.Second)
	decide(t, s, r)
	h := s.hash("k")
	sh := s.shardOf(h)
	st := sh.logs.slots[sh.logs.find(h)].v
	if got := st.n; got != 1 {
		t.Fatalf("%d entries, want 1", got)
	}
	if got := len(st.ring); got > 16 {
		t.Errorf("the log keeps room for %d entries after the burst, want at most 16", got)
	}
}

// TestConcurrentMultiKeyCalls: goroutines decide two keys at once, half of
// them naming the keys in the opposite order. Locks are taken in shard
// order, so nothing deadlocks, and every call is all or nothing: exactly
// as many calls are admitted as the smaller limit, and the larger key is
// charged for those alone.
func TestConcurrentMultiKeyCalls(t *testing.T) {
	for _, maxKeys := range []int{64, DefaultMaxKeys} { // one shard; keys on different shards
		s, _ := newTestStore(t, WithMaxKeys(maxKeys))
		a := backend.Request{Key: "a", Algorithm: backend.GCRA, Limit: 100, Period: time.Hour, Cost: 1}
		b := backend.Request{Key: "b", Algorithm: backend.SlidingLog, Limit: 50, Period: time.Hour, Cost: 1}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range 400 {
			reqs := []backend.Request{a, b}
			if i%2 == 1 {
				reqs = []backend.Request{b, a}
			}
			wg.Go(func() {
				res := make([]backend.Result, 2)
				if err := s.DecideInto(ctx, reqs, res); err != nil {
					t.Error(err)
					return
				}
				if res[0].Allowed && res[1].Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if got, want := admitted.Load(), int64(50); got != want {
			t.Errorf("maxKeys=%d: %d calls admitted, want %d", maxKeys, got, want)
		}
		a.Cost = 0
		if got, want := decide(t, s, a)[0].Remaining, int64(50); got != want {
			t.Errorf("maxKeys=%d: a remaining = %d, want %d", maxKeys, got, want)
		}
	}
}

// TestPlainRequestsAreValid: the store's inlined check lets through only
// requests that Validate accepts, over every combination of the fields'
// edge values, and does let the usual requests through.
func TestPlainRequestsAreValid(t *testing.T) {
	for _, key := range []string{"", "k"} {
		for _, limit := range []int64{math.MinInt64, -1, 0, 1, backend.MaxLimit, backend.MaxLimit + 1, math.MaxInt64} {
			for _, period := range []time.Duration{math.MinInt64, 0, time.Millisecond - 1, time.Millisecond, backend.MaxPeriod, backend.MaxPeriod + 1, math.MaxInt64} {
				for _, burst := range []int64{-1, 0, 1, backend.MaxLimit + 1} {
					for alg := range backend.Concurrency + 2 {
						for _, cost := range []int64{math.MinInt64, -backend.MaxLimit - 1, -backend.MaxLimit, 0, backend.MaxLimit, backend.MaxLimit + 1, math.MaxInt64} {
							r := backend.Request{Key: key, Algorithm: alg, Limit: limit, Period: period, Burst: burst, Cost: cost}
							if plain(&r) && r.Validate() != nil {
								t.Fatalf("plain(%+v), which Validate refuses: %v", r, r.Validate())
							}
						}
					}
				}
			}
		}
	}
	for _, alg := range backend.Algorithms() {
		if r := (backend.Request{Key: "k", Algorithm: alg, Limit: 10, Period: time.Minute, Cost: 1}); !plain(&r) {
			t.Errorf("a usual %v request is not plain", alg)
		}
	}
}

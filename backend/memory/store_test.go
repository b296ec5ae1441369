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

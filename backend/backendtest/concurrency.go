package backendtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testConcurrency runs the Concurrency algorithm through ALGORITHMS.md's
// definition, step by step, with values computed by hand (µs): 3 units in
// flight, leases of 1s.
func (s *suite) testConcurrency(t *testing.T) {
	e := s.env(t)
	k := e.key("k")
	lease := func(id, cost int64) backend.Request {
		return backend.Request{Key: k, Algorithm: backend.Concurrency, Limit: 3, Period: time.Second, Cost: cost, Lease: id}
	}
	for _, st := range []struct {
		at   int64 // µs after Epoch
		name string
		r    backend.Request
		want want
	}{
		{0, "acquire 1", lease(1, 1), want{ok: true, rem: 2, reset: 1_000_000}},
		{100_000, "acquire 2", lease(2, 1), want{ok: true, rem: 1, reset: 1_000_000}},
		// Full: the first lease to expire (1, at 1s) would make room.
		{200_000, "acquire 3", lease(3, 1), want{ok: true, rem: 0, reset: 1_000_000, next: 800_000}},
		{300_000, "acquire 4 over the limit", lease(4, 1), want{rem: 0, reset: 900_000, retry: 700_000, next: 700_000}},
		{300_000, "acquire 4 units", lease(5, 4), want{rem: 0, reset: 900_000, never: true, next: 700_000}},
		// Lease 1 again: renewed to 1.3s, not counted twice, even when full.
		{300_000, "renew 1", lease(1, 1), want{ok: true, rem: 0, reset: 1_000_000, next: 800_000}},
		{400_000, "release 2", lease(2, -1), want{ok: true, rem: 1, reset: 900_000}},
		{400_000, "acquire 4", lease(4, 1), want{ok: true, rem: 0, reset: 1_000_000, next: 800_000}},
		{400_000, "release a lease nobody holds", lease(99, -1), want{ok: true, rem: 0, reset: 1_000_000, next: 800_000}},
		{400_000, "release 2 again", lease(2, -1), want{ok: true, rem: 0, reset: 1_000_000, next: 800_000}},
		// Lease 3 (never renewed) expired at 1.2s: its unit is free again.
		{1_200_000, "peek after 3 expired", lease(0, 0), want{ok: true, rem: 1, reset: 200_000}},
		{1_200_000, "acquire 6", lease(6, 1), want{ok: true, rem: 0, reset: 1_000_000, next: 100_000}},
		{2_200_000, "peek after every lease expired", lease(0, 0), want{ok: true, rem: 3}},
	} {
		e.at(us(st.at))
		check(t, st.name, e.one(st.r), st.want.result(3))
	}
}

// testConcurrencyAllOrNothing: a call with a rate rule and a concurrency
// rule consumes from neither when either rejects.
func (s *suite) testConcurrencyAllOrNothing(t *testing.T) {
	e := s.env(t)
	held := backend.Request{Key: e.key("flight"), Algorithm: backend.Concurrency, Limit: 1, Period: time.Minute, Cost: 1, Lease: 1}
	rate := req(e.key("rate"), backend.SlidingLog, 5, time.Minute, 1)
	if r := e.one(held); !r.Allowed {
		t.Fatalf("first lease refused: %+v", r)
	}
	second := held
	second.Lease = 2
	res := e.decide(rate, second)
	if res[0].Allowed != true || res[1].Allowed {
		t.Fatalf("rate then a second lease: %+v, want the rate rule fitting and the lease refused", res)
	}
	if got := e.remaining(rate); got != 5 {
		t.Errorf("rate rule remaining %d after a call the lease refused, want 5", got)
	}
	// Now the rate rule refuses: the lease is not taken.
	spent := req(e.key("spent"), backend.SlidingLog, 1, time.Minute, 1)
	e.one(spent)
	other := backend.Request{Key: e.key("flight2"), Algorithm: backend.Concurrency, Limit: 1, Period: time.Minute, Cost: 1, Lease: 3}
	res = e.decide(spent, other)
	if res[0].Allowed || !res[1].Allowed {
		t.Fatalf("a spent rate rule with a free lease: %+v", res)
	}
	if got := e.remaining(other); got != 1 {
		t.Errorf("concurrency remaining %d after a call the rate rule refused, want 1", got)
	}
	// A request that names no lease cannot be counted or released.
	bad := other
	bad.Lease = 0
	if _, err := e.b.Decide(context.Background(), []backend.Request{bad}); !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("an acquisition without a lease: %v, want ErrInvalidRequest", err)
	}
}

// testConcurrencyRace: 200 goroutines with distinct leases race for one
// key of limit 7; exactly 7 hold it, and releasing them all frees it.
func (s *suite) testConcurrencyRace(t *testing.T) {
	e := s.env(t)
	const goroutines, limit = 200, 7
	base := backend.Request{Key: e.key("k"), Algorithm: backend.Concurrency, Limit: limit, Period: time.Hour, Cost: 1}
	var admitted atomic.Int64
	var mu sync.Mutex
	var holders []int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range goroutines {
		wg.Go(func() {
			r := base
			r.Lease = int64(i + 1)
			<-start
			res, err := e.b.Decide(context.Background(), []backend.Request{r})
			if err != nil {
				t.Error(err)
				return
			}
			if res[0].Allowed {
				admitted.Add(1)
				mu.Lock()
				holders = append(holders, r.Lease)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d of %d, want exactly %d", got, goroutines, limit)
	}
	for _, id := range holders {
		r := base
		r.Lease, r.Cost = id, -1
		e.one(r)
	}
	if got := e.remaining(base); got != limit {
		t.Errorf("remaining %d after every holder released, want %d", got, limit)
	}
}

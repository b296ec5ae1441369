package model_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// modelBackend serves a Model as a backend, so that the conformance
// suite's hand-computed answers check the model too.
type modelBackend struct {
	mu  sync.Mutex
	m   *model.Model
	now func() time.Time
}

func (b *modelBackend) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m.Decide(b.now().UnixMicro(), reqs)
}

func (b *modelBackend) Reset(_ context.Context, keys ...string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.m.Reset(keys...)
	return nil
}

// TestModelPassesConformance: the model gives the conformance suite's
// hand-computed answers, so a backend that agrees with the model agrees
// with them.
func TestModelPassesConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		return &modelBackend{m: model.New(), now: now}
	})
}

// TestRetryAfterIsTheSmallestWait checks the model against the prose of
// ALGORITHMS.md rather than its formulas: a rejected request is admitted
// after exactly its RetryAfter if nothing else happens, and not 1µs before;
// and when no unit is left, a request of cost 1 is admitted after exactly
// NextAfter, and not 1µs before.
func TestRetryAfterIsTheSmallestWait(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	periods := []time.Duration{time.Millisecond, 1001 * time.Microsecond, 1500 * time.Millisecond, time.Second, time.Hour}
	retries, nexts := 0, 0
	// smallest fails unless r is rejected at now + wait - 1 and admitted at
	// now + wait.
	smallest := func(m *model.Model, r backend.Request, now int64, wait time.Duration, what string) {
		t.Helper()
		w := wait.Microseconds()
		if w <= 0 {
			t.Fatalf("%v L=%d P=%v c=%d at %d: %s %v", r.Algorithm, r.Limit, r.Period, r.Cost, now, what, wait)
		}
		if !m.Evaluate(now+w, []backend.Request{r})[0].Allowed {
			t.Fatalf("%v L=%d P=%v c=%d at %d: %s %v, still rejected then", r.Algorithm, r.Limit, r.Period, r.Cost, now, what, wait)
		}
		if m.Evaluate(now+w-1, []backend.Request{r})[0].Allowed {
			t.Fatalf("%v L=%d P=%v c=%d at %d: %s %v, admitted 1µs earlier", r.Algorithm, r.Limit, r.Period, r.Cost, now, what, wait)
		}
	}
	for range 20000 {
		m := model.New()
		r := backend.Request{
			Key:       "k",
			Algorithm: backend.Algorithms()[rng.IntN(len(backend.Algorithms()))],
			Limit:     1 + rng.Int64N(6),
			Period:    periods[rng.IntN(len(periods))],
		}
		P := r.Period.Microseconds()
		now := backendtest.Epoch.UnixMicro() + rng.Int64N(3*P)
		for range rng.IntN(8) {
			r.Cost = rng.Int64N(r.Limit+1) - rng.Int64N(2)
			r.Force = rng.IntN(10) == 0
			if _, err := m.Decide(now, []backend.Request{r}); err != nil {
				t.Fatal(err)
			}
			now += rng.Int64N(P/2 + 1)
		}
		r.Cost, r.Force = 1+rng.Int64N(r.Limit), false
		res := m.Evaluate(now, []backend.Request{r})[0]
		if !res.Allowed {
			retries++
			smallest(m, r, now, res.RetryAfter, "RetryAfter")
		}
		peek := r
		peek.Cost = 0
		if res := m.Evaluate(now, []backend.Request{peek})[0]; res.Remaining == 0 {
			nexts++
			one := r
			one.Cost = 1
			smallest(m, one, now, res.NextAfter, "NextAfter")
		}
	}
	if retries < 2000 || nexts < 2000 {
		t.Fatalf("only %d rejections and %d full keys checked", retries, nexts)
	}
}

// With the deny cache, a concurrency rejection is never remembered
// (ALGORITHMS.md: a release on any instance can make room at any moment,
// and this cache sees only its own instance's), so the next acquisition
// is the store's to answer; a rate rule's rejection is remembered.
func TestDenyCacheRemembersNoConcurrencyRejection(t *testing.T) {
	m := model.New(model.WithDenyCache())
	now := backendtest.Epoch.UnixMicro()
	decide := func(r backend.Request) backend.Result {
		t.Helper()
		res, err := m.Decide(now, []backend.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	slot := func(lease int64) backend.Request {
		return backend.Request{Key: "c", Algorithm: backend.Concurrency, Limit: 1, Period: time.Hour, Cost: 1, Lease: lease}
	}
	rate := backend.Request{Key: "r", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	decide(slot(1))
	decide(rate)
	for i, r := range []backend.Request{slot(2), rate} {
		if res := decide(r); res.Allowed || res.Cached {
			t.Fatalf("request %d over its limit: %+v, want the store's rejection", i, res)
		}
	}
	if res := decide(slot(3)); res.Allowed || res.Cached {
		t.Errorf("a concurrency acquisition after a rejection: %+v, want the store's answer, not the cache's", res)
	}
	if res := decide(rate); res.Allowed || !res.Cached {
		t.Errorf("a rate request after a rejection: %+v, want the cache's answer", res)
	}
}

package model_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/backendtest/model"
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
// after exactly its RetryAfter if nothing else happens, and not 1µs before.
func TestRetryAfterIsTheSmallestWait(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	algs := []backend.Algorithm{backend.GCRA, backend.SlidingLog, backend.SlidingWindow, backend.FixedWindow}
	periods := []time.Duration{time.Millisecond, 1001 * time.Microsecond, 1500 * time.Millisecond, time.Second, time.Hour}
	checked := 0
	for range 20000 {
		m := model.New()
		r := backend.Request{
			Key:       "k",
			Algorithm: algs[rng.IntN(len(algs))],
			Limit:     1 + rng.Int64N(6),
			Period:    periods[rng.IntN(len(periods))],
		}
		P := r.Period.Microseconds()
		now := backendtest.Epoch.UnixMicro() + rng.Int64N(3*P)
		for range rng.IntN(8) {
			r.Cost = rng.Int64N(r.Limit + 1)
			if _, err := m.Decide(now, []backend.Request{r}); err != nil {
				t.Fatal(err)
			}
			now += rng.Int64N(P/2 + 1)
		}
		r.Cost = 1 + rng.Int64N(r.Limit)
		res := m.Evaluate(now, []backend.Request{r})[0]
		if res.Allowed {
			continue
		}
		checked++
		wait := res.RetryAfter.Microseconds()
		if wait <= 0 {
			t.Fatalf("%+v at %d: rejected with RetryAfter %v", r, now, res.RetryAfter)
		}
		if !m.Evaluate(now+wait, []backend.Request{r})[0].Allowed {
			t.Fatalf("%v L=%d P=%v c=%d: rejected at %d with RetryAfter %v, still rejected then", r.Algorithm, r.Limit, r.Period, r.Cost, now, res.RetryAfter)
		}
		if m.Evaluate(now+wait-1, []backend.Request{r})[0].Allowed {
			t.Fatalf("%v L=%d P=%v c=%d: rejected at %d with RetryAfter %v, admitted 1µs earlier", r.Algorithm, r.Limit, r.Period, r.Cost, now, res.RetryAfter)
		}
	}
	if checked < 2000 {
		t.Fatalf("only %d rejections checked", checked)
	}
}

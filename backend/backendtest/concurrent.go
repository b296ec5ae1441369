package backendtest

import (
	"context"

	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// Concurrent races goroutines on one backend and checks the outcome against
// the model. Each round gives every key a rule (a random algorithm, a small
// limit, an hour's period) and, at one instant, has the goroutines make
// calls of one to three requests on random keys: charges, forced charges,
// and now and then a request that can never fit, so that the call is
// rejected and whatever another slot of it consumed must be undone. Then
// every admitted call is replayed on the model, as forced charges (at one
// instant, charges commute): each key must hold exactly what the replay
// holds (by a peek, and by Inspect when the target has it), and no key may
// have admitted more unforced units than its limit.
func (d Differential) Concurrent(t *testing.T, goroutines, rounds, calls int) {
	t.Helper()
	keys := d.keys()
	rng := rand.New(rand.NewPCG(d.Seed+7, 0xc0c0))
	for round := range rounds {
		clock := NewClock(Epoch.Add(time.Duration(round) * time.Hour))
		target := d.New(t, clock.Now)
		now := clock.Now().UnixMicro()
		rules := map[string]backend.Request{}
		for _, k := range keys {
			rules[k] = backend.Request{
				Key:       k,
				Algorithm: modelAlgorithms[rng.IntN(len(modelAlgorithms))],
				Limit:     20 + rng.Int64N(100),
				Period:    time.Hour,
			}
		}
		type call struct {
			reqs []backend.Request
			res  []backend.Result
		}
		done := make([][]call, goroutines)
		seeds := make([]uint64, goroutines)
		for g := range seeds {
			seeds[g] = rng.Uint64()
		}
		errs := make(chan error, goroutines)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seeds[g], 1))
				<-start
				for range calls {
					reqs := make([]backend.Request, 1+rng.IntN(3))
					for i := range reqs {
						r := rules[keys[rng.IntN(len(keys))]]
						r.Cost = 1 + rng.Int64N(3)
						r.Force = rng.IntN(10) == 0
						if rng.IntN(6) == 0 {
							r.Cost, r.Force = r.Limit+1, false // never fits
						}
						reqs[i] = r
					}
					res, err := target.Backend.Decide(context.Background(), reqs)
					if err != nil {
						errs <- err
						return
					}
					done[g] = append(done[g], call{reqs, res})
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: Decide: %v", round, err)
		}

		m := model.New()
		admitted := map[string]int64{} // unforced units admitted per key
		calls, rejected := 0, 0
		for _, g := range done {
			for _, c := range g {
				calls++
				ok := true
				for _, r := range c.res {
					ok = ok && r.Allowed
				}
				if !ok {
					rejected++
					continue
				}
				forced := make([]backend.Request, len(c.reqs))
				for i, r := range c.reqs {
					if !r.Force {
						admitted[r.Key] += r.Cost
					}
					r.Force = true
					forced[i] = r
				}
				if _, err := m.Decide(now, forced); err != nil {
					t.Fatal(err)
				}
			}
		}
		if rejected == 0 || rejected == calls {
			t.Fatalf("round %d: %d of %d calls rejected: the round tests too little", round, rejected, calls)
		}
		for _, k := range keys {
			r := rules[k]
			if admitted[k] > r.Limit {
				t.Errorf("round %d: %s (%v, limit %d) admitted %d unforced units at one instant", round, k, r.Algorithm, r.Limit, admitted[k])
			}
			res, err := target.Backend.Decide(context.Background(), []backend.Request{r})
			if err != nil {
				t.Fatal(err)
			}
			if want := m.Evaluate(now, []backend.Request{r})[0]; res[0] != want {
				t.Errorf("round %d: %s (%v, limit %d) after %d calls, %d rejected: peek\n got %+v\nwant %+v (the replay of the admitted calls)",
					round, k, r.Algorithm, r.Limit, calls, rejected, res[0], want)
			}
			if target.Inspect != nil {
				st, ok := m.Stored(k)
				if err := target.Inspect(k, st, ok, false); err != nil {
					t.Errorf("round %d: %s (%v): %v", round, k, r.Algorithm, err)
				}
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d rounds of %d goroutines × %d calls: every key holds the replay of its admitted calls", rounds, goroutines, calls)
}

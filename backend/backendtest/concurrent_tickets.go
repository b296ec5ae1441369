package backendtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// ConcurrentTickets races goroutines making reservations with a Once,
// their stamped refunds (each sent one to three times, alone or twice in
// one call), forced charges with a Once (sent once or twice), and
// reservations in calls that are rejected followed by a refund of their
// Once; then every goroutine sends every other's settlements again, all at
// once. It all happens at one instant, where settlements of distinct
// reservations commute, so each key must end holding exactly the replay
// on the model of what the first deliveries did: each admitted
// reservation's cost less its refund, each charge once, and nothing of a
// rejected call or of a repeat.
func (d Differential) ConcurrentTickets(t *testing.T, goroutines, rounds, calls int) {
	t.Helper()
	keys := d.keys()
	algs := slices.DeleteFunc(slices.Clone(modelAlgorithms), func(a backend.Algorithm) bool { return a == backend.Concurrency })
	rng := rand.New(rand.NewPCG(d.Seed+11, 0x71c7))
	for round := range rounds {
		clock := NewClock(Epoch.Add(time.Duration(round) * time.Hour))
		target := d.New(t, clock.Now)
		now := clock.Now().UnixMicro()
		rules := map[string]backend.Request{}
		for _, k := range keys {
			rules[k] = backend.Request{Key: k, Algorithm: algs[rng.IntN(len(algs))], Limit: 20 + rng.Int64N(100), Period: time.Hour}
		}
		type net struct {
			key  string
			cost int64
		}
		owed := make([][]net, goroutines)              // per goroutine: what its first deliveries left
		again := make([][]backend.Request, goroutines) // its settlements, for the others to resend
		seeds := make([]uint64, goroutines)
		for g := range seeds {
			seeds[g] = rng.Uint64()
		}
		errs := make(chan error, 2*goroutines)
		decide := func(reqs ...backend.Request) []backend.Result {
			res, err := target.Backend.Decide(context.Background(), reqs)
			if err != nil {
				errs <- err
				return nil
			}
			return res
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seeds[g], 2))
				once := int64(g+1) << 40
				<-start
				for range calls {
					r := rules[keys[rng.IntN(len(keys))]]
					once++
					r.Once = once
					switch n := rng.IntN(10); {
					case n < 6: // a reservation, then its refund
						r.Cost = 1 + rng.Int64N(3)
						res := decide(r)
						if res == nil {
							return
						}
						if !res[0].Allowed || res[0].Stamp == 0 {
							continue
						}
						back := rng.Int64N(r.Cost + 1)
						owed[g] = append(owed[g], net{r.Key, r.Cost - back})
						if back == 0 {
							continue
						}
						refund := r
						refund.Cost, refund.Stamp = -back, res[0].Stamp
						again[g] = append(again[g], refund)
						if rng.IntN(3) == 0 {
							if decide(refund, refund) == nil {
								return
							}
						}
						for range 1 + rng.IntN(3) {
							if decide(refund) == nil {
								return
							}
						}
					case n < 8: // a forced charge, maybe twice
						r.Cost, r.Force = 1+rng.Int64N(3), true
						owed[g] = append(owed[g], net{r.Key, r.Cost})
						again[g] = append(again[g], r)
						for range 1 + rng.IntN(2) {
							if decide(r) == nil {
								return
							}
						}
					default: // a reservation in a rejected call, then a refund of its Once
						r.Cost = 1
						unfit := rules[keys[rng.IntN(len(keys))]]
						unfit.Cost = unfit.Limit + 1
						res := decide(r, unfit)
						if res == nil {
							return
						}
						if res[1].Allowed {
							errs <- fmt.Errorf("a cost past the limit was admitted: %+v", res[1])
							return
						}
						refund := r
						refund.Cost = -1
						again[g] = append(again[g], refund)
						if decide(refund) == nil {
							return
						}
					}
				}
			})
		}
		close(start)
		wg.Wait()
		// Every settlement again, from every other goroutine, at once.
		for g := range goroutines {
			wg.Go(func() {
				for h := range goroutines {
					if h == g {
						continue
					}
					for _, r := range again[h] {
						if decide(r) == nil {
							return
						}
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		m := model.New()
		for _, o := range owed {
			for _, n := range o {
				if n.cost == 0 {
					continue
				}
				r := rules[n.key]
				r.Cost, r.Force = n.cost, true
				if _, err := m.Decide(now, []backend.Request{r}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, k := range keys {
			r := rules[k]
			res, err := target.Backend.Decide(context.Background(), []backend.Request{r})
			if err != nil {
				t.Fatal(err)
			}
			if want := m.Evaluate(now, []backend.Request{r})[0]; res[0] != want {
				t.Errorf("round %d: %s (%v, limit %d): peek\n got %+v\nwant %+v (each reservation less its refund, each charge once)",
					round, k, r.Algorithm, r.Limit, res[0], want)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d rounds of %d goroutines × %d calls with tickets: every key holds each settlement once", rounds, goroutines, calls)
}

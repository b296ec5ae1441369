package memory

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// model is the obvious implementation of a Decide call on top of the same
// step functions: a map of states, copied, evaluated in order, written back
// only if nothing was rejected. The Store's shards, slot reuse and
// duplicate-key handling must give exactly its answers.
type model struct {
	roll map[string]ring32
	gcra map[string]gcraState
	win  map[string]window
	logs map[string]logState
}

func (m *model) decide(reqs []backend.Request, now int64) []backend.Result {
	roll, gcra, win, logs := maps(m.roll), maps(m.gcra), maps(m.win), map[string]logState{}
	for k, v := range m.logs {
		logs[k] = v.clone()
	}
	res := make([]backend.Result, len(reqs))
	rejected := false
	for i := range reqs {
		r := &reqs[i]
		var ok bool
		switch r.Algorithm {
		case backend.RollingWindow:
			roll[r.Key], ok = rollingStep(r, now, roll[r.Key], &res[i])
		case backend.GCRA:
			var st gcraState
			if st, ok = gcraStep(r, now, gcra[r.Key], &res[i]); ok && r.Cost != 0 {
				gcra[r.Key] = st // a peek writes nothing, not even its T
			}
		case backend.FixedWindow:
			win[r.Key], ok = fixedStep(r, now, win[r.Key], &res[i])
		case backend.SlidingWindow:
			win[r.Key], ok = slidingStep(r, now, win[r.Key], &res[i])
		case backend.SlidingLog:
			v := newLogView(logs[r.Key], now, micros(r.Period))
			ok = logStep(r, now, &v, &res[i])
			if ok {
				logs[r.Key], _ = v.commit(now, micros(r.Period))
			}
		}
		rejected = rejected || (!ok && !r.Shadow)
	}
	if !rejected {
		m.roll, m.gcra, m.win, m.logs = roll, gcra, win, logs
		return res
	}
	for i := range reqs {
		if res[i].Allowed {
			peek := reqs[i]
			peek.Cost, peek.Force = 0, false
			res[i] = m.decide([]backend.Request{peek}, now)[0]
		}
	}
	return res
}

func maps[V any](m map[string]V) map[string]V {
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestStoreMatchesModel sends random multi-rule calls (shared keys,
// repeated keys within a call, refunds, peeks, forced charges, shadow
// requests, keys going idle) to a Store and to the model and requires identical results.
func TestStoreMatchesModel(t *testing.T) {
	for _, maxKeys := range []int{64, DefaultMaxKeys} { // one shard; 256 shards
		t.Run(fmt.Sprint("maxKeys=", maxKeys), func(t *testing.T) {
			s, clock := newTestStore(t, WithMaxKeys(maxKeys))
			m := &model{roll: map[string]ring32{}, gcra: map[string]gcraState{}, win: map[string]window{}, logs: map[string]logState{}}
			rng := rand.New(rand.NewPCG(3, uint64(maxKeys)))
			now := backendtest.Epoch.UnixMicro()
			for call := range 3000 {
				now += rng.Int64N(150_000)
				clock.t = time.UnixMicro(now)
				reqs := make([]backend.Request, 1+rng.IntN(5))
				for i := range reqs {
					alg := backend.Algorithm(rng.IntN(5))
					reqs[i] = backend.Request{
						Key:       fmt.Sprintf("%v:%d", alg, rng.IntN(6)),
						Algorithm: alg,
						Limit:     1 + rng.Int64N(6),
						Period:    time.Second,
						Cost:      rng.Int64N(5) - 1,
						Force:     rng.IntN(10) == 0,
						Shadow:    rng.IntN(8) == 0,
					}
				}
				got := decide(t, s, reqs...)
				want := m.decide(reqs, now)
				if !slices.Equal(got, want) {
					t.Fatalf("call %d at %dµs %+v:\n got %+v\nwant %+v", call, now, reqs, got, want)
				}
				if call%500 == 0 {
					s.sweep()
				}
			}
		})
	}
}

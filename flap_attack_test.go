package ceiling

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// flapping is a remote backend that answers every call 250 ms late (past
// the 100 ms timeout) for 3 s of every 5, and at once the other 2.
type flapping struct {
	start time.Time
}

func (f *flapping) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if time.Since(f.start)%(5*time.Second) < 3*time.Second {
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - 1}
	}
	return out, nil
}
func (f *flapping) Reset(context.Context, ...string) error { return nil }

// A Redis that flaps between too slow for the timeout and fast: each slow
// spell degrades the limiter once and each fast one brings it back, with
// no flapping of the breaker in between; FailOpen sheds only the few
// requests before the probe's verdict, and never sheds while Redis is fast.
func TestFlappingSlowRedisDegradesOncePerSpell_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var tr []string
		be := &flapping{start: time.Now()}
		l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 100000, Period: time.Minute, FailMode: FailOpen}},
			WithBackend(be), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)),
			onDegraded(func(e DegradedEvent) {
				mu.Lock()
				tr = append(tr, time.Since(be.start).Round(10*time.Millisecond).String())
				mu.Unlock()
			}))
		defer l.Close()
		h := l.Handler(okHandler)
		codes := map[int]int{}
		perSec := map[int]map[int]int{}
		for time.Since(be.start) < 20*time.Second {
			s := int(time.Since(be.start) / time.Second)
			c := get(t, h).Code
			codes[c]++
			if perSec[s] == nil {
				perSec[s] = map[int]int{}
			}
			perSec[s][c]++
			time.Sleep(50 * time.Millisecond)
		}
		hl := l.Health()
		mu.Lock()
		defer mu.Unlock()
		if len(tr) != 8 || hl.Shed > 4*4 {
			t.Errorf("4 slow spells in 20 s: transitions at %v, %d shed (%v); want 8 transitions, at most 4 shed a spell", tr, hl.Shed, codes)
		}
		for s := range 20 {
			if s%5 >= 3 && perSec[s][503] > 0 {
				t.Errorf("second %d, Redis fast: %v", s, perSec[s])
			}
		}
	})
}

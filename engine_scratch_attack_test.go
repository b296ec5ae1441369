package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// refusing is a remote backend whose every call fails at once with a
// refused connection: the backend's fault, so the fail modes apply.
type refusing struct{}

func (refusing) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, fmt.Errorf("%w: connection refused", backend.ErrUnreachable)
}

func (refusing) Reset(context.Context, ...string) error { return nil }

// The engine's pooled scratch serves decisions of different rule sets and
// fail modes at once (run with -race): every decision gets one result per
// input, in order, each marked by its own rule's fail mode, FailClosed
// refuses the whole request, and FailLocal's all-or-nothing decisions
// never admit a key past its limit on the local store, however the
// requests that shared the scratch were shaped.
func TestEngineScratchAcrossRuleSetsConcurrently_Attack(t *testing.T) {
	rules := []Rule{
		{Name: "open", Limit: 100, Period: time.Hour, FailMode: FailOpen},
		{Name: "local5", Limit: 5, Period: time.Hour, FailMode: FailLocal},
		{Name: "local3", Limit: 3, Period: time.Hour, FailMode: FailLocal, Algorithm: FixedWindow},
		{Name: "closed", Limit: 100, Period: time.Hour, FailMode: FailClosed},
		{Name: "shadow", Limit: 1, Period: time.Hour, FailMode: FailLocal, Shadow: true},
	}
	limits := map[string]int64{"local5": 5, "local3": 3}
	l := MustNew(rules, WithBackend(refusing{}), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	var mu sync.Mutex
	admitted := map[string]int64{} // rule/key -> units admitted locally
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				var in []Input
				for _, r := range rules {
					if rng.IntN(2) == 0 {
						in = append(in, Input{Rule: r.Name, Key: fmt.Sprint("k", rng.IntN(4)), Cost: 1 + rng.Int64N(2)})
					}
				}
				if len(in) == 0 {
					continue
				}
				closed := false
				for _, x := range in {
					closed = closed || x.Rule == "closed"
				}
				d, err := l.Decide(context.Background(), in...)
				if closed {
					if err == nil && d.Allowed {
						t.Errorf("%v: admitted with a FailClosed rule on a refusing backend", in)
					}
					continue
				}
				if err != nil {
					t.Errorf("%v: %v", in, err)
					continue
				}
				if len(d.Results) != len(in) {
					t.Errorf("%v: %d results", in, len(d.Results))
					continue
				}
				for i, rr := range d.Results {
					want := FailLocal
					if in[i].Rule == "open" {
						want = FailOpen
					}
					if rr.Rule.Name != in[i].Rule || rr.Fallback != want {
						t.Errorf("%v: result %d is %q by %v, want %q by %v", in, i, rr.Rule.Name, rr.Fallback, in[i].Rule, want)
					}
				}
				if d.Allowed {
					mu.Lock()
					for _, x := range in {
						if _, ok := limits[x.Rule]; ok {
							admitted[x.Rule+"/"+x.Key] += x.Cost
						}
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(admitted) == 0 {
		t.Fatal("nothing admitted locally: the test decided nothing")
	}
	for k, n := range admitted {
		rule := k[:len(k)-3]
		if n > limits[rule] {
			t.Errorf("%s: %d units admitted locally, limit %d", k, n, limits[rule])
		}
	}
}

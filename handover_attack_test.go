package ceiling

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// starvedMemory is a remote backend on a memory store whose decisions
// time out while starved is set (a process too busy to read its replies;
// the call is not applied) and whose probes always answer: Redis is
// healthy throughout.
type starvedMemory struct {
	m       *memory.Store
	starved atomic.Bool
}

func (s *starvedMemory) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if s.starved.Load() && !isProbe(reqs) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.m.Decide(context.Background(), reqs)
}

func (s *starvedMemory) Reset(ctx context.Context, keys ...string) error {
	return s.m.Reset(ctx, keys...)
}

// One timeout of this process's own (a CPU spike; the probe it starts is
// answered at once) on a healthy Redis: issue 30 says only the backend's
// fault reaches the fail mode. The answered probe starts FailLocal's
// hand-over all the same, and for MaxCoolDown + the timeout every FailLocal
// request is decided on the local store at the instance's share first: a
// client with 29 of its 30 left on Redis is refused (429, RateLimit limit
// 10) after its share, by no fault of Redis. Under a sustained CPU flood
// the timeouts, and so the hand-overs, keep coming: a client that sticks
// to one instance is held to limit/instances while Redis is healthy, and
// nothing in Health says so.
func TestCPUSpikeOnAHealthyRedisHoldsFailLocalToTheShare_Attack(t *testing.T) {
	t.Skip("defect: an answered confirming probe starts the hand-over; a CPU-caused timeout on a healthy Redis holds FailLocal rules to the instance's share (10 of 30 here) for MaxCoolDown + timeout. Skipping the hand-over on a prompt answer broke the outage-edge bound (TestPromptProbeAtAnOutagesEndSkipsTheHandOver_Attack): a prompt answer cannot tell a CPU spike from the end of a short outage")
	synctest.Test(t, func(t *testing.T) {
		be := &starvedMemory{m: memory.New(memory.WithSweepInterval(0))}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "api", Key: RemoteAddr, Limit: 30, Period: time.Minute, FailMode: FailLocal}},
			WithBackend(be), WithInstances(3), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(okHandler)
		be.starved.Store(true)
		get(t, h) // one timeout; FailLocal decides it locally
		be.starved.Store(false)
		synctest.Wait() // the probe it started has answered
		admitted, limit := 0, ""
		for range 15 {
			w := get(t, h)
			if w.Code == 200 {
				admitted++
			} else if limit == "" {
				limit = w.Header().Get("RateLimit")
			}
		}
		if admitted != 15 {
			t.Errorf("a healthy Redis with 29 of 30 left: %d of 15 admitted (first refusal's RateLimit %q); want 15", admitted, limit)
		}
	})
}

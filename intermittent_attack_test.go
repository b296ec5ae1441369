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

// spiky is a remote backend of which every third call, decisions and
// probes alike, answers after 150 ms (a Redis with latency spikes past
// the 100 ms timeout: a fork, a slow command of another client), and the
// others at once. Its timeouts are the backend's, written and not answered.
type spiky struct {
	mu    sync.Mutex
	calls int
}

func (s *spiky) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	s.mu.Lock()
	s.calls++
	slow := s.calls%3 == 0
	s.mu.Unlock()
	if slow {
		select {
		case <-time.After(150 * time.Millisecond):
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

func (s *spiky) Reset(context.Context, ...string) error { return nil }

// A Redis whose every third call is late past the timeout is at fault for
// those timeouts, but the probe a timeout starts lands, two times in three,
// on a fast call and clears them as this process's: a FailOpen rule's
// timeouts are shed with 503 and counted as this process overloaded
// (Health.Shed, error_type="overloaded") for as long as the spikes last,
// and never reach the fail mode. The operator is pointed at the app, not
// at Redis.
func TestRedisLatencySpikesAreShedAsOverload_Attack(t *testing.T) {
	t.Skip("defect: a Redis late past the timeout on some calls is judged by one probe that usually lands on a fast call; its timeouts are shed and counted overloaded forever")
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 1000, Period: time.Minute, FailMode: FailOpen}},
			WithBackend(&spiky{}), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(okHandler)
		codes := map[int]int{}
		for range 60 {
			codes[get(t, h).Code]++
			time.Sleep(100 * time.Millisecond) // virtual: steady traffic, 10 a second
			synctest.Wait()
		}
		if hl := l.Health(); hl.Shed > 3 {
			t.Errorf("6 s of a Redis late on every third call: %v, %d shed as this process's overload, %d failed open, %q; want the late calls judged the backend's (fail mode), not shed beyond the first",
				codes, hl.Shed, hl.Rules[0].FailOpenAdmissions, hl.Status)
		}
	})
}

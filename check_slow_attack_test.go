package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// slowRemote applies every call on a memory store at once and answers it
// after delay: a Redis that decides everything, but slower than the
// limiter's timeout; a call whose deadline comes first fails with it.
// With first set only the first call is late (a process busy starting, a
// first dial). It does not embed the store: the limiter would call the
// store's DecideInto, and never this Decide.
type slowRemote struct {
	m     *memory.Store
	delay time.Duration
	first bool
	calls int
}

func (s *slowRemote) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res, err := s.m.Decide(context.Background(), reqs)
	if s.calls++; s.first && s.calls > 1 {
		return res, err
	}
	select {
	case <-time.After(s.delay):
		return res, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *slowRemote) Reset(ctx context.Context, keys ...string) error { return s.m.Reset(ctx, keys...) }

// Check proves the backend can decide: one that answers every call later
// than the timeout cannot decide a single request in time. It used to
// pass (its retry accepted any answer within the probe's second), so the
// limiter started healthy and every request then timed out; the probe
// that confirms timeouts says such a backend is at fault
// (docs/failure.md), and Check now judges it the same way: a timeout,
// degraded from the start. A backend just under the timeout passes.
func TestCheckFailsOnABackendSlowerThanTheTimeout_Attack(t *testing.T) {
	for _, c := range []struct {
		delay time.Duration
		first bool
		pass  bool
	}{
		{90 * time.Millisecond, false, true},
		{110 * time.Millisecond, false, false},
		{250 * time.Millisecond, false, false},
		{300 * time.Millisecond, true, true}, // only the first call late: asked again, passes
	} {
		t.Run(fmt.Sprintf("%v/first=%v", c.delay, c.first), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				be := &slowRemote{m: memory.New(memory.WithSweepInterval(0)), delay: c.delay, first: c.first}
				defer be.m.Close()
				l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
					WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
				defer l.Close()
				err := l.Check(context.Background())
				h := l.Health()
				if c.pass {
					if err != nil || h.Status != "healthy" || be.calls < 2 {
						t.Fatalf("Check on a backend %v late: %v, %q after %d calls; want nil and healthy", c.delay, err, h.Status, be.calls)
					}
					return
				}
				if !errors.Is(err, ErrTimeout) || h.Status != "degraded" || h.Reason != kindTimeout {
					t.Fatalf("Check on a backend answering everything %v late (timeout 100ms): %v, health %q (%q); want a timeout, degraded",
						c.delay, err, h.Status, h.Reason)
				}
			})
		})
	}
}

package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// downMemory is a remote backend on a memory store that refuses every
// call (a refused connection) while down is set.
type downMemory struct {
	m    *memory.Store
	down atomic.Bool
}

func (s *downMemory) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if s.down.Load() {
		return nil, backend.ErrUnreachable
	}
	return s.m.Decide(context.Background(), reqs)
}

func (s *downMemory) Reset(ctx context.Context, keys ...string) error { return s.m.Reset(ctx, keys...) }

// A Charge on two rules while the breaker is open: one rule's Period is
// long enough to resend it, the other's too short beside the timeout. The
// error said "not applied, and not sent again" and did not wrap
// ErrResent, which Charge's doc makes safe to repeat; but the long rule's
// charge was queued all the same and applied on recovery, so a caller that
// repeated the charge as told paid the tokens twice (6 of 10, not 3).
// Either the whole call is resent (ErrResent) or none of it is.
func TestChargePartlyResentIsNotReportedSafeToRepeat_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &downMemory{m: memory.New(memory.WithSweepInterval(0))}
		defer be.m.Close()
		l := MustNew([]Rule{
			{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow},
			{Name: "burst", Limit: 10, Period: 100 * time.Millisecond, Algorithm: FixedWindow},
		}, WithBackend(be), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		be.down.Store(true)
		for range defaultBreakerFailures {
			_, _ = l.Decide(context.Background(), Input{Rule: "tokens", Key: "warm"})
		}
		if l.Health().Status != "degraded" {
			t.Fatalf("%q, want degraded", l.Health().Status)
		}
		charge := func() error {
			return l.Charge(context.Background(), Input{Rule: "tokens", Key: "acme", Cost: 3}, Input{Rule: "burst", Key: "acme", Cost: 1})
		}
		err := charge()
		if err == nil {
			t.Fatal("a charge while degraded: nil")
		}
		be.down.Store(false)
		time.Sleep(time.Minute) // virtual: the prober finds the backend back, the resends run
		synctest.Wait()
		if !errors.Is(err, ErrResent) {
			// Charge's doc: not applied, and not sent again; repeating it is safe.
			if err := charge(); err != nil {
				t.Fatalf("the repeat: %v", err)
			}
		}
		p, perr := l.Peek(context.Background(), "tokens", "acme")
		if perr != nil || p.Remaining != 7 {
			t.Errorf("a charge of 3 (first error %v): %d of 10 left, %v; want 7 (charged once)", err, p.Remaining, perr)
		}
	})
}

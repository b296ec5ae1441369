package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// slowReleases is a remote backend over a memory store whose calls that
// carry a refund or a release take delay, then fail when fail is set.
type slowReleases struct {
	m     *memory.Store
	delay time.Duration
	fail  bool
	calls atomic.Int64 // calls that carried a refund or a release
}

func (s *slowReleases) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	for _, q := range reqs {
		if q.Cost >= 0 {
			continue
		}
		s.calls.Add(1)
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if s.fail {
			return nil, errRefused
		}
		break
	}
	return s.m.Decide(ctx, reqs)
}

func (s *slowReleases) Reset(ctx context.Context, keys ...string) error {
	return s.m.Reset(ctx, keys...)
}

// resendsLimiter is a limiter of one concurrency rule on be whose breaker
// never opens, so that every round of resends calls it.
func resendsLimiter(t *testing.T, be *slowReleases) *Limiter {
	t.Cleanup(func() { be.m.Close() })
	l := MustNew([]Rule{{Name: "s", Limit: 1, Period: time.Minute, Algorithm: Concurrency}},
		WithBackend(be), WithBreaker(BreakerConfig{Failures: 1 << 30}), WithTimeout(100*time.Millisecond),
		WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	return l
}

// queueReleases queues n failed releases of one slot each, as n calls would.
func queueReleases(l *Limiter, prefix string, n int) (dropped int) {
	for i := range n {
		q := backend.Request{Key: fmt.Sprint(prefix, i), Algorithm: Concurrency, Limit: 1, Period: time.Minute, Cost: -1, Lease: int64(i + 1)}
		dropped += l.resendLater([]backend.Request{q}, errRefused, "concurrency release")
	}
	return dropped
}

// The cap on pending resends counts the writes a round is sending: a round
// used to zero the count while it ran, so writes failing meanwhile were
// queued past the cap and merged back without a check (15,877 pending on a
// cap of 4,096).
func TestResendCapCountsTheRoundInFlight_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := resendsLimiter(t, &slowReleases{m: memory.New(), delay: 80 * time.Millisecond, fail: true})
		if n := queueReleases(l, "a", failover.MaxResends); n != 0 {
			t.Fatalf("dropped %d of the first %d", n, failover.MaxResends)
		}
		time.Sleep(10 * time.Millisecond) // the round is sending them
		if n := queueReleases(l, "b", failover.MaxResends); n != failover.MaxResends {
			t.Errorf("queued during a round: dropped %d of %d, want all (the cap is full)", n, failover.MaxResends)
		}
		for range 30 {
			time.Sleep(100 * time.Millisecond)
			if p := l.pendingWrites(); p > failover.MaxResends {
				t.Fatalf("%d pending, past the cap %d", p, failover.MaxResends)
			}
		}
	})
}

// A round sends its writes together, one call per batch of requests: it
// sent one call per failed write, 7,528 calls in 2 s while they failed.
func TestResendRoundSendsItsWritesInBatches_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowReleases{m: memory.New(), fail: true}
		l := resendsLimiter(t, be)
		queueReleases(l, "a", failover.MaxResends)
		synctest.Wait() // the rounds the writes met, then the gap before the next
		// The first round may start before the last write is queued, and
		// the rest wait for the next: one call more at most.
		if got, most := be.calls.Load(), int64(failover.MaxResends/failover.ResendBatch+1); got > most {
			t.Errorf("sending %d single writes took %d calls, want at most %d", failover.MaxResends, got, most)
		}
	})
}

// Close stops a resend round between its calls: it waited for every call
// of the round, 24 s behind 300 writes at 80 ms each.
func TestCloseStopsAResendRound_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowReleases{m: memory.New(), delay: 80 * time.Millisecond}
		l := resendsLimiter(t, be)
		queueReleases(l, "a", failover.MaxResends)
		time.Sleep(10 * time.Millisecond) // the round is sending them
		start := time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Errorf("Close took %v behind a round of %d calls, want at most the call it waited for", took, be.calls.Load())
		}
		if l.Health().DroppedWrites == 0 {
			t.Error("nothing dropped at Close, with writes still pending")
		}
	})
}

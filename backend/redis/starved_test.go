package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// burnCPU keeps n goroutines busy until the returned func is called, each
// burning 2ms of CPU between short sleeps as request handlers would, so
// that runnable goroutines wait long for a CPU.
func burnCPU(n int) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for !done.Load() {
				for until := time.Now().Add(2 * time.Millisecond); time.Now().Before(until); {
				}
				time.Sleep(time.Microsecond)
			}
		})
	}
	return func() { done.Store(true); wg.Wait() }
}

// TestStarvedProcessReadsRepliesThatCame decides fresh keys on a healthy
// Redis while this process's CPUs are taken by 4 goroutines each: the
// worker that reads a reply waits long to run once the reply is there
// (woken by the network poller, it queues behind the busy goroutines),
// while the caller, woken by its deadline's timer, jumps the queue. A
// reply that came is read however late: every decision that was written is
// answered, none fails with "no reply within the budget" (before: some of
// every few hundred did). One this process never got to write by its
// deadline fails with backend.ErrNotSent, its own delay, not Redis's.
func TestStarvedProcessReadsRepliesThatCame(t *testing.T) {
	// A CPU flood: on a machine that others load too, redis-server itself
	// may not run within the 100 ms, and then no reply came at all.
	citest.Only(t)
	s := New(defaultClient(t, redistest.Shared(t).Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	stop := burnCPU(4 * runtime.GOMAXPROCS(0))
	defer stop()
	var decided, failed, unsent atomic.Int64
	var first atomic.Pointer[error]
	until := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(until); i++ {
				// As the limiter calls it: its timeout as the deadline.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				_, err := s.Decide(ctx, []backend.Request{day(fmt.Sprintf("fresh-%d-%d", g, i), 1)})
				cancel()
				switch {
				case errors.Is(err, backend.ErrNotSent):
					unsent.Add(1) // this process's delay, said as such
				case err != nil:
					failed.Add(1)
					first.CompareAndSwap(nil, &err)
				default:
					decided.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stop()
	t.Logf("%d decisions answered, %d failed, %d never sent, on a starved process", decided.Load(), failed.Load(), unsent.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d decisions failed on a healthy Redis, the first: %v", n, n+decided.Load(), *first.Load())
	}
	if decided.Load() == 0 {
		t.Error("nothing was decided")
	}
}

// TestACallPastItsDeadlineIsNotSent calls Decide with a context whose
// deadline has already passed, as it would be for a caller whose goroutine
// waited for a CPU between setting its deadline and the call: the decision
// is never written, and the error says so (backend.ErrNotSent), so that
// the limiter does not blame Redis for this process's delay. A deadline
// still to come is counted from the write.
func TestACallPastItsDeadlineIsNotSent(t *testing.T) {
	s := New(defaultClient(t, redistest.Shared(t).Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); !errors.Is(err, backend.ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a passed deadline: %v, want backend.ErrNotSent and context.DeadlineExceeded", err)
	}
	if got := stored(t, s, "k"); got != 0 {
		t.Errorf("%d units stored by a call never sent, want 0", got)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if res, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err != nil || !res[0].Allowed {
		t.Fatalf("a 100ms deadline: %+v, %v; want admitted", res, err)
	}
	if got := stored(t, s, "k"); got != 1 {
		t.Errorf("%d units stored, want 1", got)
	}
}

// TestStarvedProcessStillTimesOutAFrozenRedis freezes the reply stream
// while the process is starved: patience with a starved process is
// bounded, so Decide still fails, 2s after the call, with an error that
// says no reply came.
func TestStarvedProcessStillTimesOutAFrozenRedis(t *testing.T) {
	citest.Only(t) // a CPU flood, and a frozen server's timing
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	s := New(defaultClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	stop := burnCPU(16 * runtime.GOMAXPROCS(0))
	defer stop()
	proxy.Stall()
	defer proxy.Resume()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
	took := time.Since(start)
	stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a frozen Redis on a starved process: %v, want context.DeadlineExceeded", err)
	}
	if took > 4*time.Second {
		t.Errorf("returned after %v, want at most 2s (the patience with a starved process) and scheduling", took)
	}
	t.Logf("returned after %v", took)
}

// TestDecisionOfACallerThatGaveUpIsNotSentLate kills Redis and sends
// decisions that fail (the caller gives up at its budget), then starts
// Redis again: none of them reaches it afterwards. go-redis keeps
// re-dialling a refused connection while the round trip that took them
// lasts; a decision the caller
// was told had failed (and decided by its fail mode) must not also be
// counted by a Redis that comes back.
func TestDecisionOfACallerThatGaveUpIsNotSentLate(t *testing.T) {
	inst := redistest.Server(t)
	s := New(defaultClient(t, inst.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	inst.Kill()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err == nil {
				t.Error("decided on a killed Redis")
			}
		})
	}
	wg.Wait()
	inst.Restart(t)
	time.Sleep(time.Second) // go-redis's retries, had they not been cancelled
	if got := stored(t, s, "k"); got != 0 {
		t.Errorf("%d units stored by decisions whose callers gave up while Redis was down, want 0", got)
	}
}

// A caller that gives up cancels the round trip only it waited for; the
// cancellation answers the round trip, and the caller must not take it for
// the reply: it says why it gave up (here the refused dials, as
// TestErrorsNameTheirKind expects), never "context canceled".
func TestACancelledRoundTripIsNotTheAnswer(t *testing.T) {
	inst := redistest.Server(t)
	inst.Kill()
	s := New(defaultClient(t, inst.Addr), WithDenyCache(0))
	afterGiveUp = func() { time.Sleep(100 * time.Millisecond) } // the cancellation's answer is in
	defer func() { afterGiveUp = nil }()
	for _, reqs := range [][]backend.Request{{day("one", 1)}, {day("a", 1), day("b", 1)}} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Decide(ctx, reqs)
		cancel()
		if errors.Is(err, context.Canceled) || !errors.Is(err, backend.ErrUnreachable) {
			t.Errorf("%d requests: err = %v, want the refused dial, not the cancellation", len(reqs), err)
		}
	}
}

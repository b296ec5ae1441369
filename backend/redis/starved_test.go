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
// while the caller, woken by its deadline's timer, jumps the queue. The
// caller must see that the process, not Redis, is slow and wait for the
// reply: every decision is answered, none fails with "no reply within the
// budget" (before: some of every few hundred did).
func TestStarvedProcessReadsRepliesThatCame(t *testing.T) {
	s := New(defaultClient(t, redistest.Shared(t).Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	stop := burnCPU(4 * runtime.GOMAXPROCS(0))
	defer stop()
	var decided, failed atomic.Int64
	var first atomic.Pointer[error]
	until := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(until); i++ {
				// As the limiter calls it: the budget, and a deadline for
				// backends that do not honour one.
				ctx, cancel := context.WithTimeout(backend.WithBudget(context.Background(), 100*time.Millisecond), 100*time.Millisecond)
				_, err := s.Decide(ctx, []backend.Request{day(fmt.Sprintf("fresh-%d-%d", g, i), 1)})
				cancel()
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, &err)
					continue
				}
				decided.Add(1)
			}
		})
	}
	wg.Wait()
	stop()
	t.Logf("%d decisions answered, %d failed, on a starved process", decided.Load(), failed.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d decisions failed on a healthy Redis, the first: %v", n, n+decided.Load(), *first.Load())
	}
	if decided.Load() == 0 {
		t.Error("nothing was decided")
	}
}

// TestBudgetCountsFromEntryNotFromTheDeadline calls Decide with a context
// whose deadline has already passed, as it would have for a caller whose
// goroutine waited for a CPU between setting its deadline and the call,
// but with a budget (backend.WithBudget): the budget is the decision's, so
// it is decided. Without a budget, the deadline is all there is.
func TestBudgetCountsFromEntryNotFromTheDeadline(t *testing.T) {
	s := New(defaultClient(t, redistest.Shared(t).Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	res, err := s.Decide(backend.WithBudget(ctx, 100*time.Millisecond), []backend.Request{day("k", 1)})
	if err != nil || !res[0].Allowed {
		t.Fatalf("a 100ms budget past its caller's deadline: %+v, %v; want admitted", res, err)
	}
	if got := stored(t, s, "k"); got != 1 {
		t.Errorf("%d units stored, want 1", got)
	}
	if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a passed deadline without a budget: %v, want context.DeadlineExceeded", err)
	}
	// A budget without a deadline bounds the call by itself.
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	stalled := New(defaultClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, stalled, day("warm", 1))
	proxy.Stall()
	defer proxy.Resume()
	start := time.Now()
	if _, err := stalled.Decide(backend.WithBudget(context.Background(), 100*time.Millisecond), []backend.Request{day("k", 1)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a budget and no deadline on a stalled Redis: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a 100ms budget on a stalled Redis returned after %v, want about 100ms (at most 2s on a starved process, 5s with scheduling)", d)
	}
}

// TestStarvedProcessStillTimesOutAFrozenRedis freezes the reply stream
// while the process is starved: patience with a starved process is
// bounded, so Decide still fails, 2s after the call, with an error that
// says no reply came.
func TestStarvedProcessStillTimesOutAFrozenRedis(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	s := New(defaultClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	stop := burnCPU(16 * runtime.GOMAXPROCS(0))
	defer stop()
	proxy.Stall()
	defer proxy.Resume()
	start := time.Now()
	ctx, cancel := context.WithTimeout(backend.WithBudget(context.Background(), 100*time.Millisecond), 100*time.Millisecond)
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
// Redis again: none of them reaches it afterwards. The round trip that
// took them waits long for a starved process's sake, and go-redis keeps
// re-dialling a refused connection while it lasts; a decision the caller
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
			ctx, cancel := context.WithTimeout(backend.WithBudget(context.Background(), 50*time.Millisecond), 50*time.Millisecond)
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

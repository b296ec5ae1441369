package ceiling

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// frozenMemory is a remote backend on a memory store that is frozen (every
// call, probes too, waits) until thaw is called, then answers at once: a
// Redis that stalls and comes back. A call that timed out while frozen is
// not applied.
type frozenMemory struct {
	m    *memory.Store
	once sync.Once
	back chan struct{}
}

func newFrozenMemory() *frozenMemory {
	return &frozenMemory{m: memory.New(memory.WithSweepInterval(0)), back: make(chan struct{})}
}

func (f *frozenMemory) thaw() { f.once.Do(func() { close(f.back) }) }

func (f *frozenMemory) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	select {
	case <-f.back:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return f.m.Decide(context.Background(), reqs)
}

func (f *frozenMemory) Reset(ctx context.Context, keys ...string) error {
	return f.m.Reset(ctx, keys...)
}

// TestPromptProbeAtAnOutagesEndSkipsTheHandOver_Attack: two instances
// share a Redis that freezes for 1.35 s. Instance B's timeouts are
// confirmed (its probe fails after its 1 s budget) and its breaker opens:
// it admits its share, 5 of 10, locally, and finds Redis back only at its
// next probe. Instance A's first timeout comes at the end of the freeze;
// the probe it starts goes just before Redis thaws and is answered within
// the timeout. That prompt answer says nothing about the outage B saw, but
// A now starts no hand-over: once its one local admission is charged, A
// decides on Redis alone, which does not count B's 5, and admits 9 more.
// 15 in one window, where docs/failure.md promises at most
// max(limit, instances × share × limit) = 10 at an outage's edges; with
// the hand-over A is held to its share (4 more) and the window to 10.
func TestPromptProbeAtAnOutagesEndSkipsTheHandOver_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newFrozenMemory()
		defer be.m.Close()
		rules := []Rule{{Name: "otp", Key: RemoteAddr, Limit: 10, Period: time.Minute, FailMode: FailLocal}}
		opts := []Option{WithBackend(be), WithInstances(2), WithTimeout(100 * time.Millisecond), WithLogger(slog.New(slog.DiscardHandler))}
		a, b := MustNew(rules, opts...), MustNew(rules, opts...)
		defer a.Close()
		defer b.Close()
		ha, hb := a.Handler(okHandler), b.Handler(okHandler)
		admitted := 0
		for range 8 { // B during the freeze: 5 timeouts admitted locally, then its share is spent
			if get(t, hb).Code == 200 {
				admitted++
			}
		}
		time.Sleep(time.Second) // B's probe failed: its breaker is open
		if st := b.Health().Status; st == "healthy" {
			t.Fatalf("B after its confirmed timeouts: %q, want its breaker open", st)
		}
		if get(t, ha).Code == 200 { // A's one timeout, at 1.3 s + 100 ms; its probe goes
			admitted++
		}
		time.Sleep(50 * time.Millisecond)
		be.thaw() // the probe is answered 50 ms after it went: in time
		synctest.Wait()
		for range 15 {
			if get(t, ha).Code == 200 {
				admitted++
			}
		}
		if admitted > 10 {
			t.Errorf("%d admitted in one window by two instances (A in hand-over: %v, B %q), want at most 10", admitted, a.inHandOver(), b.Health().Status)
		}
	})
}

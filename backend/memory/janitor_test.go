package memory

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"go.uber.org/goleak"
)

func TestIdleKeysAreSwept(t *testing.T) {
	s, clock := newTestStore(t)
	for _, alg := range backend.Algorithms() {
		for i := range 10 {
			decide(t, s, backend.Request{Key: fmt.Sprintf("%v:%d", alg, i), Algorithm: alg, Limit: 10, Period: time.Second, Cost: 1})
		}
	}
	if got, want := s.Len(), 50; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	clock.t = clock.t.Add(999 * time.Millisecond) // GCRA: T = 100ms, back to full
	if got, want := s.sweep(), 10; got != want {
		t.Errorf("sweep at 999ms deleted %d, want %d (the GCRA keys)", got, want)
	}
	clock.t = backendtest.Epoch.Add(time.Second) // the log and the fixed window
	if got, want := s.sweep(), 20; got != want {
		t.Errorf("sweep at 1s deleted %d, want %d", got, want)
	}
	// The sliding window's current count no longer weighs; the rolling
	// window's bucket (62.5ms wide) left at 1.0625s.
	clock.t = backendtest.Epoch.Add(2 * time.Second)
	if got, want := s.sweep(), 20; got != want {
		t.Errorf("sweep at 2s deleted %d, want %d", got, want)
	}
	if got := s.Len(); got != 0 {
		t.Errorf("Len after the sweeps = %d, want 0", got)
	}
}

func TestCloseStopsJanitor(t *testing.T) {
	defer goleak.VerifyNone(t)
	clock := &fakeClock{t: backendtest.Epoch}
	s := New(WithClock(clock.now), WithSweepInterval(time.Millisecond))
	decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1})
	s.Close()
	s.Close() // idempotent
	// The store still answers after Close.
	if got := decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second}); got[0].Remaining != 0 {
		t.Errorf("after Close: %+v", got[0])
	}
}

// The janitor deletes a key back to full on its next sweep, with no write
// to the key.
func TestJanitorSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(WithSweepInterval(time.Minute))
		defer s.Close()
		decide(t, s, backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1})
		time.Sleep(time.Minute + time.Second) // past the first sweep
		synctest.Wait()
		if n := s.Len(); n != 0 {
			t.Errorf("after a sweep the store holds %d keys, want the idle key deleted", n)
		}
	})
}

// TestSweepShrinksTables: once keys go idle the tables are rebuilt small, so
// the heap really shrinks (a Go map would keep its peak size).
func TestSweepShrinksTables(t *testing.T) {
	s, clock := newTestStore(t)
	const n = 20_000
	for i := range n {
		alg := backend.Algorithm(i % 5)
		decide(t, s, backend.Request{Key: fmt.Sprintf("k:%d", i), Algorithm: alg, Limit: 10, Period: time.Second, Cost: 1})
	}
	decide(t, s, backend.Request{Key: "survivor", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour, Cost: 1})
	before := heapInUse()
	clock.t = clock.t.Add(2 * time.Second)
	if got, want := s.sweep(), n; got != want {
		t.Fatalf("sweep deleted %d, want %d", got, want)
	}
	after := heapInUse()
	if freed := int64(before) - int64(after); freed < n*30 {
		t.Errorf("sweep freed %d bytes for %d keys, want at least 30 per key", freed, n)
	}
	slots := 0
	for i := range s.shards {
		sh := &s.shards[i]
		slots += len(sh.gcra.slots) + len(sh.windows.slots) + len(sh.logs.slots)
	}
	if slots > minSlots {
		t.Errorf("%d slots left for one key, want at most %d", slots, minSlots)
	}
	if got := decide(t, s, backend.Request{Key: "survivor", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour})[0].Remaining; got != 0 {
		t.Errorf("the live key lost its state in the rebuild: remaining %d, want 0", got)
	}
}

// TestSweepShrinksPartly: when most keys of a table go idle, the table is
// rebuilt at the size the survivors need, not kept at its peak.
func TestSweepShrinksPartly(t *testing.T) {
	s, clock := newTestStore(t, WithMaxKeys(64)) // one shard, one table to look at
	sh := &s.shards[0]
	sh.maxKeys = 10_000
	for i := range 10_000 {
		period := time.Second
		if i%10 == 0 {
			period = time.Hour // one key in ten stays busy
		}
		decide(t, s, backend.Request{Key: fmt.Sprint(i), Algorithm: backend.GCRA, Limit: 1, Period: period, Cost: 1})
	}
	peak := len(sh.gcra.slots)
	clock.t = clock.t.Add(time.Second)
	s.sweep()
	if got, want := sh.gcra.n, 1000; got != want {
		t.Fatalf("%d keys left, want %d", got, want)
	}
	if got := len(sh.gcra.slots); got > 4*1000 {
		t.Errorf("table has %d slots for 1000 keys (peak %d), want at most 4000", got, peak)
	}
}

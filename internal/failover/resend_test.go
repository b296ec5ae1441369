package failover

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// A settlement named by a Once is resent for at most backend.OnceHold,
// less twice the timeout, whatever its Period: its record is kept no
// longer (so that a key's records stay its settlements of the last
// minute), and a resend after that would be applied again. A write with
// no Once (a lease's release) is still resent for its Period.
func TestResendOfASettlementEndsWithinOnceHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		var sent, dropped atomic.Int64
		g := NewGroup()
		r := &Resends{
			Group:   g,
			Send:    func(reqs []backend.Request) error { sent.Add(int64(len(reqs))); return errors.New("down") },
			Ready:   func() bool { return true },
			Keep:    func(k string) string { return k },
			Dropped: func(n int, _, _ string, _ int64) { dropped.Add(int64(n)) },
			Timeout: timeout,
		}
		refund := backend.Request{Key: "k", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: -1, Stamp: 1, Once: 7}
		release := backend.Request{Key: "c", Algorithm: backend.Concurrency, Limit: 10, Period: time.Hour, Cost: -1, Lease: 3}
		if lost := r.Later([]backend.Request{refund, release}, errors.New("timeout"), "settlement"); lost != 0 {
			t.Fatalf("Later dropped %d at once; want both queued", lost)
		}
		time.Sleep(backend.OnceHold - 2*timeout - 2*time.Second)
		synctest.Wait()
		if got := r.Pending(); got != 2 || dropped.Load() != 0 {
			t.Fatalf("%v before the settlement's resend window ends: %d pending, %d dropped; want 2 and 0", backend.OnceHold-2*timeout-2*time.Second, got, dropped.Load())
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := r.Pending(); got != 1 || dropped.Load() != 1 {
			t.Errorf("%v after the failure: %d pending, %d dropped; want the settlement dropped (its record lapses at %v), the release still pending", backend.OnceHold-2*timeout+time.Second, got, dropped.Load(), backend.OnceHold)
		}
		if sent.Load() == 0 {
			t.Error("nothing was resent")
		}
		g.Stop()
	})
}

package ceiling

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// FailLocal's charge after unconfirmed timeouts (a CPU-starved process on
// a healthy Redis) sends the backend what the local store counts for each
// journaled key: every unit of its window, those an earlier charge already
// sent included. Timeouts that come and go on one key within a window
// charge the same units again each time: after 5 rounds of one local
// admission and one answered request (10 admitted), the backend must hold
// 10 units, not a growing multiple, or a client is refused on a healthy
// Redis long before its limit.
func TestRepeatedUnconfirmedTimeoutsChargeEachLocalUnitOnce_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &starvedMemory{m: memory.New(memory.WithSweepInterval(0))}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "api", Key: RemoteAddr, Limit: 100, Period: time.Minute, FailMode: FailLocal}},
			WithBackend(be), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(okHandler)
		admitted := 0
		for range 5 {
			be.starved.Store(true)
			if get(t, h).Code == 200 { // a timeout: decided locally
				admitted++
			}
			be.starved.Store(false)
			synctest.Wait()
			time.Sleep(2 * time.Second) // virtual: past the hand-over
			if get(t, h).Code == 200 {  // answered: the charge goes
				admitted++
			}
			synctest.Wait()
		}
		p, err := l.Peek(context.Background(), "api", "192.0.2.1")
		if used := 100 - p.Remaining; err != nil || used != int64(admitted) {
			t.Errorf("%d admitted, the backend holds %d units (%v); want %d", admitted, used, err, admitted)
		}
	})
}

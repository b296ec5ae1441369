package ceiling

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// TestPromptProbeForgetsTheSlotsFailLocalTook_Attack: a Concurrency rule
// of 2 that fails local, on one instance. One acquisition times out on a
// starved process (the call is not applied) and FailLocal takes its slot
// on the local store, held. The probe the timeout started is answered in
// time. Slots are not journaled, and the probe of the closed breaker
// retakes nothing, so only the hand-over that the answer starts keeps
// the slot counted: it decides on the local store too, which still holds
// the slot, and refuses the third. A change that skipped that hand-over
// (d882271, reverted) let Redis alone decide, knowing none of the local
// slot: three slots held at once under a limit of 2.
func TestPromptProbeForgetsTheSlotsFailLocalTook_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &starvedMemory{m: memory.New(memory.WithSweepInterval(0))}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "exports", Limit: 2, Period: time.Minute, Algorithm: Concurrency, FailMode: FailLocal}},
			WithBackend(be), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		ctx := context.Background()
		held := 0
		take := func() {
			if d, err := l.Decide(ctx, Input{Rule: "exports", Key: "tenant-1"}); err == nil && d.Allowed {
				held++
			}
		}
		be.starved.Store(true)
		take() // a timeout: FailLocal takes the slot locally
		be.starved.Store(false)
		synctest.Wait() // the probe it started has answered, in time
		take()
		take()
		if held > 2 {
			t.Errorf("%d slots held at once under a limit of 2 (hand-over %v)", held, l.inHandOver())
		}
	})
}

package ceiling

import (
	"errors"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// A Charge refund sent while Redis is cut off and the limiter degraded,
// with its ticket and without one: whatever its error says, and however
// often the caller then repeats what the error says is safe to repeat,
// the units that come back once Redis answers are the reservation's, at
// most once. A reserves 4 with a ticket, B reserves 3 without, C takes 3
// of 10; both refunds go while degraded, are repeated as their errors
// allow, Redis returns: 7 left (C's 3 count), none of C's handed out.
func TestChargeRefundWhileDegradedAppliedOnce_Attack(t *testing.T) {
	l, proxy, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}})
	ctx := t.Context()
	a, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 4, Reserve: true})
	if err != nil || !a.Allowed || a.Results[0].Ticket == 0 {
		t.Fatalf("A reserves 4 with a ticket: %+v, %v", a, err)
	}
	b, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 3})
	if err != nil || !b.Allowed {
		t.Fatalf("B reserves 3: %+v, %v", b, err)
	}
	if c, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 3}); err != nil || !c.Allowed {
		t.Fatalf("C takes 3: %+v, %v", c, err)
	}
	proxy.Partition()
	for range 20 {
		if l.Health().Status != "healthy" {
			break
		}
		l.Decide(ctx, Input{Rule: "tokens", Key: "other"})
	}
	if s := l.Health().Status; s == "healthy" {
		t.Fatalf("still healthy after 20 failed calls")
	}
	refunds := []Input{
		{Rule: "tokens", Key: "acme", Cost: -4, Stamp: a.Results[0].Stamp, Ticket: a.Results[0].Ticket},
		{Rule: "tokens", Key: "acme", Cost: -3, Stamp: b.Results[0].Stamp},
	}
	for _, in := range refunds {
		for try := range 3 {
			err := l.Charge(ctx, in)
			t.Logf("refund %d (ticket %v), try %d: %v", in.Cost, in.Ticket != 0, try, err)
			safe := err != nil && !errors.Is(err, ErrResent) && (errors.Is(err, ErrDegraded) || errors.Is(err, backend.ErrNotSent))
			if !safe {
				break // applied, resent by the limiter, or maybe applied: not to be repeated
			}
		}
	}
	proxy.Heal()
	if !eventually(func() bool { return l.Health().Status == "healthy" && l.pendingWrites() == 0 }) {
		t.Fatalf("not healthy with nothing pending after 10 s: %+v, %d pending", l.Health(), l.pendingWrites())
	}
	p, err := direct.Keys(ctx, "*").Result()
	t.Logf("keys %q, %v; dropped %d", p, err, l.Health().DroppedWrites)
	got, err := l.Peek(ctx, "tokens", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Remaining > 7 || l.Health().DroppedWrites == 0 && got.Remaining != 7 {
		t.Errorf("after the refunds: %d remaining, %d dropped; want at most 7 (C's 3 still count), and 7 when none was dropped",
			got.Remaining, l.Health().DroppedWrites)
	}
}

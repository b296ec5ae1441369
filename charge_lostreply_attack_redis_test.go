package ceiling

import (
	"errors"
	"testing"
	"time"
)

// A Charge whose reply is lost after Redis applied it, and whose first
// resend's reply is lost too, is applied once: the caller is told
// ErrResent (not to repeat it), the limiter resends it until an answer
// comes, and the Once record answers the second and third deliveries as
// peeks. Two rules in one call, a charge and a ticketed refund, each
// counted once.
func TestChargeLostRepliesAppliedOnce_Attack(t *testing.T) {
	l, proxy, _ := proxiedLimiter(t, []Rule{
		{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow},
		{Name: "calls", Limit: 10, Period: time.Hour, Algorithm: FixedWindow},
	})
	ctx := t.Context()
	d, err := l.Decide(ctx, Input{Rule: "calls", Key: "acme", Cost: 4, Reserve: true})
	if err != nil || !d.Allowed {
		t.Fatalf("calls: %+v, %v", d, err)
	}
	proxy.DropReply("fcall")
	proxy.DropReply("fcall")
	err = l.Charge(ctx, Input{Rule: "tokens", Key: "acme", Cost: 3}, Input{Rule: "calls", Key: "acme", Cost: -4, Stamp: d.Results[0].Stamp, Ticket: d.Results[0].Ticket})
	if !errors.Is(err, ErrResent) {
		t.Fatalf("a charge whose reply was lost: %v; want an error wrapping ErrResent", err)
	}
	if !eventually(func() bool { return l.pendingWrites() == 0 }) {
		t.Fatal("the charge is still pending a resend after 10 s")
	}
	if proxy.Dropped() != 2 {
		t.Fatalf("%d replies lost, want 2 (the call's and its first resend's)", proxy.Dropped())
	}
	tok, err1 := l.Peek(ctx, "tokens", "acme")
	calls, err2 := l.Peek(ctx, "calls", "acme")
	if err1 != nil || err2 != nil || tok.Remaining != 7 || calls.Remaining != 10 {
		t.Errorf("after three deliveries: tokens %d left, calls %d left (%v, %v); want 7 and 10 (each applied once)", tok.Remaining, calls.Remaining, err1, err2)
	}
	if h := l.Health(); h.DroppedWrites != 0 {
		t.Errorf("DroppedWrites %d, want 0", h.DroppedWrites)
	}
}

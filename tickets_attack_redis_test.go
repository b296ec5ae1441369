package ceiling

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Attacks on the tickets through the limiter, on a real Redis: a refund
// sent twice in one Charge, one with another reservation's ticket, one
// with a forged ticket, and a flood of reservations settled at 0 or never
// settled. Each must give back at most what its own reservation holds,
// and the tickets stay bounded by the reservations holding units.
func TestTicketRefundsBuyNoQuota_Attack(t *testing.T) {
	l, _, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: RollingWindow}})
	ctx := t.Context()
	a, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5, Reserve: true})
	if err != nil || !a.Allowed || a.Results[0].Ticket == 0 {
		t.Fatalf("A reserves 5 with a ticket: %+v, %v", a, err)
	}
	b, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5, Reserve: true})
	if err != nil || !b.Allowed || b.Results[0].Ticket == 0 {
		t.Fatalf("B takes 5 with a ticket: %+v, %v", b, err)
	}
	refundA := Input{Rule: "tokens", Key: "acme", Cost: -5, Stamp: a.Results[0].Stamp, Ticket: a.Results[0].Ticket}
	// Twice in one call: applied once.
	if err := l.Charge(ctx, refundA, refundA); err != nil {
		t.Fatalf("A's refund twice in one call: %v", err)
	}
	remaining := func() int64 {
		p, err := l.Peek(ctx, "tokens", "acme")
		if err != nil {
			t.Fatal(err)
		}
		return p.Remaining
	}
	if got := remaining(); got != 5 {
		t.Errorf("after A's refund sent twice in one call: %d remaining, want 5 (B's 5 count)", got)
	}
	// Again, with a forged ticket, and with A's stamp under B's ticket.
	forged := refundA
	forged.Ticket = rand.Int64N(1<<62) + 1
	if err := l.Charge(ctx, forged); err != nil {
		t.Errorf("a refund with a forged ticket: %v, want nil (answered as a peek)", err)
	}
	if got := remaining(); got != 5 {
		t.Errorf("after a refund with a forged ticket: %d remaining, want 5", got)
	}
	if err := l.Charge(ctx, refundA); err != nil {
		t.Errorf("A's refund again: %v", err)
	}
	if got := remaining(); got != 5 {
		t.Errorf("after A's refund sent again: %d remaining, want 5", got)
	}
	// A ticket on another key is not this key's.
	c, err := l.Decide(ctx, Input{Rule: "tokens", Key: "other", Cost: 1, Reserve: true})
	if err != nil || !c.Allowed {
		t.Fatalf("C reserves 1 on another key: %+v, %v", c, err)
	}
	cross := refundA
	cross.Ticket = c.Results[0].Ticket
	if err := l.Charge(ctx, cross); err != nil {
		t.Errorf("a refund with another key's ticket: %v", err)
	}
	if got := remaining(); got != 5 {
		t.Errorf("after a refund with another key's ticket: %d remaining, want 5", got)
	}
	keys, _ := direct.Keys(ctx, "*#o*").Result()
	if len(keys) != 2 { // B's and C's
		t.Errorf("%d tickets stored, want 2 (B's and C's): %q", len(keys), keys)
	}
}

// A flood of reservations of one key, settled at 0 or not settled at all,
// through the middleware on a daily rule: the tickets stored never exceed
// the reservations holding units (at most the limit), and requests past
// the limit write none.
func TestTicketFloodBounded_Attack(t *testing.T) {
	const limit = 20
	for _, settle := range []bool{true, false} {
		l, _, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: limit, Period: 24 * time.Hour,
			Algorithm: FixedWindow, Estimate: func(*http.Request) (int64, error) { return 1, nil }}})
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if settle {
				if err := Settle(r, "tokens", 0); err != nil {
					t.Errorf("Settle: %v", err)
				}
			}
		}))
		ok, rejected := 0, 0
		for range 200 {
			w := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("X-Shop", "attacker")
			h.ServeHTTP(w, r)
			switch w.Code {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				rejected++
			default:
				t.Fatalf("status %d", w.Code)
			}
		}
		keys, _ := direct.Keys(t.Context(), "*#o*").Result()
		n, _ := direct.DBSize(t.Context()).Result()
		t.Logf("settle %v: %d admitted, %d rejected, %d tickets, %d keys", settle, ok, rejected, len(keys), n)
		switch {
		case settle && (ok != 200 || len(keys) != 0):
			t.Errorf("settled at 0: %d of 200 admitted, %d tickets left; want all admitted, none left", ok, len(keys))
		case !settle && (ok != limit || len(keys) != limit):
			t.Errorf("never settled: %d admitted, %d tickets; want %d and %d", ok, len(keys), limit, limit)
		}
		if h := l.Health(); h.Rules[0].FailOpenAdmissions+h.Rules[0].FailLocalAdmissions != 0 || h.DroppedWrites != 0 {
			t.Errorf("Health: %+v", h)
		}
	}
}

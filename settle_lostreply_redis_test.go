package ceiling

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A refund whose call failed after its write is sent again and applied
// once: A reserves 5 of 10, B takes the other 5, A settles 0 and the
// settlement's call fails, its reply lost after Redis applied it, or its
// connection refused. Dropped (as before settlements carried a Once), it
// was counted as lost, and a refund that never arrived left A's
// reservation at its estimate: 0 left. Applied twice, the second refund
// gave B's units back: 10 left, another request's quota bought. Once, 5
// are left, and the refund consumed its reservation's ticket: Redis holds
// nothing of the settlement.
func TestFailedRefundIsResentAndAppliedOnceRedis(t *testing.T) {
	for _, fails := range []struct {
		name      string
		arm, heal func(*redistest.Proxy)
		lost      int // replies the proxy drops
	}{
		{"reply_lost", func(p *redistest.Proxy) { p.DropReply("fcall") }, func(*redistest.Proxy) {}, 1},
		{"refused", func(p *redistest.Proxy) { p.Partition(); p.Cut() }, func(p *redistest.Proxy) { p.Heal() }, 0},
	} {
		for _, alg := range []backend.Algorithm{RollingWindow, GCRA} {
			t.Run(fails.name+"/"+alg.String(), func(t *testing.T) {
				testFailedRefundIsResentAndAppliedOnce(t, alg, fails.arm, fails.heal, fails.lost)
			})
		}
	}
}

func testFailedRefundIsResentAndAppliedOnce(t *testing.T, alg backend.Algorithm, arm, heal func(*redistest.Proxy), lost int) {
	l, proxy, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10, Period: time.Minute, Algorithm: alg,
		Estimate: func(*http.Request) (int64, error) { return 5, nil }}})
	ctx := t.Context()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5}); err != nil || !d.Allowed || d.Results[0].Remaining != 0 {
			t.Errorf("B's 5 beside A's reservation: %+v, %v; want the last 5", d, err)
		}
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
		arm(proxy) // for the settlement
	}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Shop", "acme")
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || proxy.Dropped() != lost {
		t.Fatalf("status %d, %d replies lost; want 200 and %d", w.Code, proxy.Dropped(), lost)
	}
	heal(proxy)
	if !eventually(func() bool { return l.pendingWrites() == 0 }) {
		t.Fatal("the settlement is still pending a resend after 10 s")
	}
	res, err := l.Peek(ctx, "tokens", "acme")
	if err != nil || res.Remaining != 5 {
		t.Errorf("after the resent refund: %+v, %v; want 5 left (A's refunded once, B's counted)", res, err)
	}
	if h := l.Health(); h.DroppedWrites != 0 {
		t.Errorf("DroppedWrites %d, want 0", h.DroppedWrites)
	}
	keys, err := direct.Keys(ctx, "*").Result()
	var records, state []string
	for _, k := range keys {
		if strings.Contains(k, "#o") {
			records = append(records, k)
		} else {
			state = append(state, k)
		}
	}
	if err != nil || len(records) != 0 || len(state) != 1 {
		t.Fatalf("keys %v (%v), want the rule's key alone: the refund consumed its reservation's ticket, and left no record", keys, err)
	}
}

// A Charge whose call failed is handed to the limiter's resend, as a
// settlement is: here a forced charge of 3 whose connection is refused.
// Before, its error left the retry to the caller and nothing was sent
// again: 10 left once Redis answered, the 3 units never counted. Now its
// error wraps ErrResent (the caller must not repeat it) and, Redis back,
// the charge is applied once: 7 left.
func TestChargeFailedIsResentOnceRedis(t *testing.T) {
	l, proxy, _ := proxiedLimiter(t, []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}})
	ctx := t.Context()
	if _, err := l.Peek(ctx, "tokens", "acme"); err != nil { // the script is loaded
		t.Fatal(err)
	}
	proxy.Partition()
	proxy.Cut()
	err := l.Charge(ctx, Input{Rule: "tokens", Key: "acme", Cost: 3})
	if !errors.Is(err, ErrResent) {
		t.Fatalf("a charge whose connection was refused: %v; want an error wrapping ErrResent", err)
	}
	proxy.Heal()
	if !eventually(func() bool { return l.pendingWrites() == 0 }) {
		t.Fatal("the charge is still pending a resend after 10 s")
	}
	if p, err := l.Peek(ctx, "tokens", "acme"); err != nil || p.Remaining != 7 {
		t.Errorf("after the resent charge of 3: %+v, %v; want 7 left (charged once)", p, err)
	}
}

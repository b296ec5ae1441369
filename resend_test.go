package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// switchable is a remote backend over a memory store whose calls can be
// made to fail: failing(reqs) returns the error a call gets, or nil. It
// records every refund it applied.
type switchable struct {
	m       *memory.Store
	mu      sync.Mutex
	failing func(reqs []backend.Request) error
	applied []backend.Request // refunds and releases that reached the store
}

func (s *switchable) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	s.mu.Lock()
	fail := s.failing
	s.mu.Unlock()
	if fail != nil && !isProbe(reqs) {
		if err := fail(reqs); err != nil {
			return nil, err
		}
	}
	if fail != nil && isProbe(reqs) {
		if err := fail(nil); err != nil {
			return nil, err
		}
	}
	res, err := s.m.Decide(ctx, reqs)
	if err == nil {
		s.mu.Lock()
		for _, q := range reqs {
			if q.Cost < 0 {
				s.applied = append(s.applied, q)
			}
		}
		s.mu.Unlock()
	}
	return res, err
}

func (s *switchable) Reset(ctx context.Context, keys ...string) error { return s.m.Reset(ctx, keys...) }

func (s *switchable) fail(f func([]backend.Request) error) {
	s.mu.Lock()
	s.failing = f
	s.mu.Unlock()
}

func (s *switchable) refunds() []backend.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]backend.Request(nil), s.applied...)
}

var errRefused = fmt.Errorf("%w: connection refused", backend.ErrUnreachable)

// refundsOnly fails calls that carry a refund or a release with err, once
// per call until told otherwise.
func refundsOnly(err error) func([]backend.Request) error {
	return func(reqs []backend.Request) error {
		for _, q := range reqs {
			if q.Cost < 0 {
				return err
			}
		}
		return nil
	}
}

// tokensLimiter is a limiter with one rule of 10 per minute whose Estimate
// comes from X-Estimate, on a switchable backend.
func tokensLimiter(t *testing.T, logs *logRecorder) (*Limiter, *switchable) {
	be := &switchable{m: memory.New()}
	t.Cleanup(func() { be.m.Close() })
	l := MustNew([]Rule{
		{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10, Period: time.Minute,
			Estimate: func(*http.Request) (int64, error) { return 5, nil }},
		{Name: "streams", Key: headerKey("X-Shop"), Limit: 1, Period: 30 * time.Second, Algorithm: Concurrency},
	}, WithBackend(be), WithBreaker(BreakerConfig{Failures: 1}), WithTimeout(100*time.Millisecond), WithLogger(slog.New(logs)))
	return l, be
}

// settleNothing serves one request that reserves 5 and uses none of them;
// before it returns, during calls "before settling" runs.
func settleNothing(t *testing.T, l *Limiter, before func()) int {
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
		before()
	}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Shop", "acme")
	h.ServeHTTP(w, r)
	return w.Code
}

func remaining(t *testing.T, l *Limiter) int64 {
	res, err := l.Peek(t.Context(), "tokens", "acme")
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	return res.Remaining
}

// A settlement that met an open breaker never left: it is sent once the
// backend answers again, refund included, so the reservation does not
// stand at its estimate, and the slot comes back with it.
func TestSettlementResentAfterTheBackendRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		l, be := tokensLimiter(t, logs)
		defer l.Close()
		code := settleNothing(t, l, func() {
			be.fail(func([]backend.Request) error { return errRefused })
			if _, err := l.Decide(t.Context(), Input{Rule: "tokens", Key: "other"}); err != nil || l.Health().Status != "degraded" {
				t.Fatalf("the breaker did not open: %v, %+v", err, l.Health())
			}
		})
		if code != 200 {
			t.Fatalf("status %d", code)
		}
		if n := len(be.refunds()); n != 0 {
			t.Fatalf("%d refunds applied while the backend was down", n)
		}
		be.fail(nil)
		time.Sleep(5 * time.Second) // the probe finds it back, the resend goes
		stamped, released := 0, 0
		for _, q := range be.refunds() {
			switch {
			case q.Algorithm == Concurrency:
				released++
			case q.Stamp != 0 && q.Cost == -5:
				stamped++
			}
		}
		if stamped != 1 || released != 1 || len(be.refunds()) != 2 {
			t.Fatalf("applied after the recovery: %+v, want the stamped refund of 5 and the release", be.refunds())
		}
		if got := remaining(t, l); got != 10 {
			t.Errorf("remaining %d after the resent refund, want 10", got)
		}
		if d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "acme"}); err != nil || !d.Allowed {
			t.Errorf("the slot after the resent release: %v, %v; want free", d.Allowed, err)
		} else {
			d.Release()
		}
		if h := l.Health(); h.DroppedWrites != 0 {
			t.Errorf("DroppedWrites %d, want 0", h.DroppedWrites)
		}
	})
}

// A settlement whose reply was lost after the backend applied it is sent
// again, its release and its refund both: the refund, named by the same
// Once, is applied once. B took the other 5 units in the same bucket
// meanwhile, so a refund applied twice would give B's units back
// (remaining 10), and one dropped would leave the reservation at its
// estimate (remaining 0).
func TestLostSettlementReplyIsResentAndAppliedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		l, be := tokensLimiter(t, logs)
		defer l.Close()
		timeout := fmt.Errorf("%w: i/o timeout", context.DeadlineExceeded)
		var once sync.Once
		var first []backend.Request
		code := settleNothing(t, l, func() {
			if d, err := l.Decide(t.Context(), Input{Rule: "tokens", Key: "acme", Cost: 5}); err != nil || !d.Allowed {
				t.Fatalf("B's 5: %v, %v", d.Allowed, err)
			}
			be.fail(func(reqs []backend.Request) error {
				var err error
				once.Do(func() {
					// Applied, and its reply lost.
					if _, e := be.m.Decide(context.Background(), reqs); e != nil {
						t.Errorf("the lost call: %v", e)
					}
					first, err = reqs, timeout
				})
				return err
			})
		})
		if code != 200 {
			t.Fatalf("status %d", code)
		}
		time.Sleep(3 * time.Second)
		var refund backend.Request
		for _, q := range first {
			if q.Algorithm != Concurrency {
				refund = q
			}
		}
		if refund.Cost != -5 || refund.Once == 0 {
			t.Fatalf("the settlement sent: %+v, want a refund of 5 named by a Once", first)
		}
		got := be.refunds()
		if len(got) != 2 || got[1].Once != refund.Once || got[1].Stamp != refund.Stamp {
			t.Fatalf("resent: %+v, want the release and the same refund (Once %d)", got, refund.Once)
		}
		if got := remaining(t, l); got != 5 {
			t.Errorf("remaining %d, want 5: the refund once, B's units still counted", got)
		}
		if h := l.Health(); h.DroppedWrites != 0 || h.Status != "healthy" {
			t.Errorf("health %+v, want healthy with no dropped write", h)
		}
	})
}

// A write pending for longer than its rule's Period is dropped, counted
// and logged; a write pending at Close too, and the resend loop stops with
// it (synctest fails the test if a goroutine is left).
func TestResendsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		l, be := tokensLimiter(t, logs)
		be.fail(refundsOnly(errRefused))
		d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "acme"})
		if err != nil || !d.Allowed {
			t.Fatal(d.Allowed, err)
		}
		d.Release() // fails: resent until its lease (30 s) is over
		time.Sleep(29 * time.Second)
		if h := l.Health(); h.DroppedWrites != 0 {
			t.Fatalf("dropped %d before the lease ended", h.DroppedWrites)
		}
		time.Sleep(3 * time.Second)
		if h := l.Health(); h.DroppedWrites != 1 {
			t.Fatalf("dropped %d after the lease ended, want 1", h.DroppedWrites)
		}
		if logs.count(slog.LevelError, "pending for longer than its units count") != 1 {
			t.Errorf("no log line for the expired release")
		}
		be.fail(nil)
		time.Sleep(3 * time.Second) // healthy again
		d, err = l.Decide(t.Context(), Input{Rule: "streams", Key: "globex"})
		if err != nil || !d.Allowed || d.Results[0].Fallback != inherit {
			t.Fatalf("a slot on the recovered backend: %+v, %v", d, err)
		}
		be.fail(func([]backend.Request) error { return errRefused })
		d.Release() // fails, pending at Close
		time.Sleep(time.Second)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if h := l.Health(); h.DroppedWrites != 2 {
			t.Errorf("dropped %d after Close with one pending, want 2", h.DroppedWrites)
		}
	})
}

// What is resent after a failed call: a release whatever happened (by
// lease, idempotent), the release of an acquisition whose reply may be
// lost, a settlement (refund or forced charge) named by a Once whatever
// happened (the backend applies it once), and one without only when the
// call surely never left, so that it takes effect at most once.
func TestResendable(t *testing.T) {
	acquire := backend.Request{Key: "a", Algorithm: Concurrency, Cost: 1, Lease: 7}
	renew := acquire
	renew.Force = true
	release := acquire
	release.Cost = -1
	refund := backend.Request{Key: "r", Cost: -5, Stamp: 9}
	charge := backend.Request{Key: "c", Cost: 3, Force: true}
	peek := backend.Request{Key: "p"}
	onceRefund, onceCharge := refund, charge
	onceRefund.Once, onceCharge.Once = 11, 12
	all := []backend.Request{acquire, renew, release, refund, charge, peek, onceRefund, onceCharge}
	sent := fmt.Errorf("%w after 100ms", ErrTimeout)
	for _, tc := range []struct {
		name string
		err  error
		want []backend.Request
	}{
		{"sent, unanswered", sent, []backend.Request{release, release, onceRefund, onceCharge}},
		{"connection reset", errRefused, []backend.Request{release, release, onceRefund, onceCharge}},
		{"breaker open", errBreakerOpen, []backend.Request{release, refund, charge, onceRefund, onceCharge}},
		{"never sent", fmt.Errorf("%w after 100ms: %w", ErrTimeout, backend.ErrNotSent), []backend.Request{release, refund, charge, onceRefund, onceCharge}},
		// Written, so perhaps applied: only what is idempotent goes again.
		{"reply unread", fmt.Errorf("%w after 100ms: %w", ErrTimeout, backend.ErrUnread), []backend.Request{release, release, onceRefund, onceCharge}},
	} {
		got := failover.Resendable(all, tc.err, unsent)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: resends %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A slot decided during the hand-over after a recovery is taken on the
// backend and on FailLocal's store; its release gives both back, where the
// local one stayed held for its whole lease.
func TestHandedOverSlotReleasedLocallyToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, be := tokensLimiter(t, &logRecorder{})
		defer l.Close()
		be.fail(func([]backend.Request) error { return errRefused })
		d, _ := l.Decide(t.Context(), Input{Rule: "tokens", Key: "other"})
		d.Release()
		be.fail(nil)
		time.Sleep(600 * time.Millisecond) // the first probe (by 500 ms) finds the backend back
		if !l.inHandOver() || l.Health().Status != "healthy" {
			t.Fatalf("not in the hand-over after the recovery: %+v", l.Health())
		}
		d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "acme"})
		if err != nil || !d.Allowed || d.Results[0].Fallback != inherit {
			t.Fatalf("a slot in the hand-over: %+v, %v", d, err)
		}
		d.Release()
		rl, _ := l.rule("streams")
		peek := l.request(rl, "acme")
		out := make([]backend.Result, 1)
		if err := l.localStore().Decide(t.Context(), []backend.Request{peek}, out); err != nil || out[0].Remaining != 1 {
			t.Errorf("the local store after the release: %+v, %v; want its slot free (1 remaining)", out[0], err)
		}
	})
}

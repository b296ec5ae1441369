package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// slowLossy is a remote backend over a memory store: calls that carry a
// request on a "big:" key hang until their caller gives up, and the next
// forced charge it is armed for is applied and its reply lost.
type slowLossy struct {
	m    *memory.Store
	mu   sync.Mutex
	lose bool
	// hang: the next forced charge is applied and its reply never comes
	// (the caller times out), as behind a stalled connection.
	hang bool
}

func (s *slowLossy) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	for _, q := range reqs {
		if strings.HasPrefix(q.Key, "big:") {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			return nil, fmt.Errorf("%w: no answer", backend.ErrUnreachable)
		}
	}
	res, err := s.m.Decide(ctx, reqs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.lose && len(reqs) == 1 && reqs[0].Force && reqs[0].Once != 0 {
		s.lose = false
		return nil, fmt.Errorf("%w: reply lost", backend.ErrUnreachable)
	}
	if err == nil && s.hang && len(reqs) == 1 && reqs[0].Force && reqs[0].Once != 0 {
		s.hang = false
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return nil, ctx.Err()
	}
	return res, err
}

func (s *slowLossy) Reset(ctx context.Context, keys ...string) error { return s.m.Reset(ctx, keys...) }

// A resend round judged every pending write's deadline against the instant
// it began, though it sends them in batches of failover.ResendBatch, one backend
// call after another, each up to the timeout: a write queued behind slow
// batches was sent after its deadline, and so after its record may have
// lapsed. Here 512 settlements on a backend that does not answer (1 s
// timeout) fill two batches ahead of a forced charge of 5 under a 1.7 s
// rule, applied at 0.5 s with its reply lost (record until 3.9 s). The
// round that starts at 2.1 s, before its 2.2 s deadline, sends it at
// 4.1 s, and it is charged a second time.
func TestResendRoundChecksEachDeadlineWhenItSends_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowLossy{m: memory.New()}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "fast", Key: headerKey("X-Shop"), Limit: 10, Period: 1700 * time.Millisecond,
			Estimate: func(*http.Request) (int64, error) { return 1, nil }}},
			WithBackend(be), WithTimeout(time.Second), WithBreaker(BreakerConfig{Failures: 100}),
			WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		var big []backend.Request
		for i := range 2 * failover.ResendBatch {
			big = append(big, backend.Request{Key: fmt.Sprintf("big:%d", i), Algorithm: RollingWindow, Limit: 10,
				Period: time.Hour, Cost: -1, Once: int64(i + 1)})
		}
		for i := range big {
			l.resendLater(big[i:i+1], fmt.Errorf("%w: refused", backend.ErrUnreachable), "settlement")
		}
		time.Sleep(500 * time.Millisecond) // the first round hangs on its first batch
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := Settle(r, "fast", 6); err != nil {
				t.Errorf("Settle: %v", err)
			}
			be.mu.Lock()
			be.lose = true
			be.mu.Unlock()
		}))
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", "acme")
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
		time.Sleep(3700 * time.Millisecond) // t = 4.2 s: the second round is past the charge
		res, err := l.Peek(t.Context(), "fast", "acme")
		if err != nil || res.Remaining != 10 {
			t.Errorf("the fast rule at 4.2 s: %+v, %v; want 10 left (its one charge, at 0.5 s, has expired)", res, err)
		}
	})
}

// A settlement's call can fail a whole timeout after it was applied (its
// reply stalled), and its Once record lasts twice its Period from the
// application. A resend deadline of a Period after the failure then
// outlives the record whenever the Period is shorter than twice the
// timeout. Here a 300 ms rule's forced charge of 5 is applied at 0 and
// its call times out at 1 s (record until 0.6 s): resent at once, it was
// charged again at 1 s.
func TestResendEndsBeforeTheRecordOfAStalledCall_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowLossy{m: memory.New()}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "fast", Key: headerKey("X-Shop"), Limit: 10, Period: 300 * time.Millisecond,
			Estimate: func(*http.Request) (int64, error) { return 1, nil }}},
			WithBackend(be), WithTimeout(time.Second), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := Settle(r, "fast", 6); err != nil {
				t.Errorf("Settle: %v", err)
			}
			be.mu.Lock()
			be.hang = true
			be.mu.Unlock()
		}))
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", "acme")
		h.ServeHTTP(w, r) // returns at 1 s, the settlement timed out
		time.Sleep(100 * time.Millisecond)
		res, err := l.Peek(t.Context(), "fast", "acme")
		if err != nil || res.Remaining != 10 {
			t.Errorf("the fast rule at 1.1 s: %+v, %v; want 10 left (its one charge, at 0, has expired)", res, err)
		}
	})
}

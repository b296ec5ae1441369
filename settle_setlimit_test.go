package ceiling

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// A GCRA rule lowered from 100 to 10 per second while a request that
// reserved under 100 is in flight: its settlement, sent after the change,
// must not rewrite the key's debt at the old rate. It did: the refund
// carried the reservation's limit (T = 10ms), and GCRA stores a write's
// debt at the writer's rate, so the 10 units held under the new limit
// (1s of debt at 100ms a unit) drained in 100ms and the key admitted 19
// in 100ms under a burst of 10 and one unit per 100ms.
func TestSetLimitStaleSettlementKeepsTheNewRate_Regression(t *testing.T) {
	clock := newFakeClock()
	store := memory.New(memory.WithClock(clock.Now))
	defer store.Close()
	l := MustNew([]Rule{{Name: "api", Key: headerKey("X-Key"), Algorithm: GCRA, Limit: 100, Period: time.Second,
		Estimate: func(r *http.Request) (int64, error) { return 1, nil },
	}}, WithBackend(store), withClock(clock.Now), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	entered, hold := make(chan struct{}), make(chan struct{})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "api", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
		close(entered)
		<-hold
	}))
	done := make(chan int)
	go func() {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		done <- w.Code
	}()
	<-entered
	if err := l.SetLimit("api", 10, 0); err != nil {
		t.Fatal(err)
	}
	in := Input{Rule: "api", Key: "k"}
	admitted := 0
	for range 20 {
		if allowed(t, l, in) {
			admitted++
		}
	}
	close(hold)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the reserving request: %d", code)
	}
	clock.mu.Lock()
	clock.t = clock.t.Add(100 * time.Millisecond)
	clock.mu.Unlock()
	for range 20 {
		if allowed(t, l, in) {
			admitted++
		}
	}
	// Under burst 10 and one unit per 100ms, 100ms hold at most 11
	// admissions (10 with the reserved unit still counted at first).
	if admitted > 11 {
		t.Errorf("%d admitted in 100ms after lowering to 10 per second (burst 10)", admitted)
	}
}

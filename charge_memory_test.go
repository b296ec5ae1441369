package ceiling

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// fakeMemory is a memory store on a fake clock starting at backendtest.Epoch.
func fakeMemory(t *testing.T) (*memory.Store, *backendtest.Clock) {
	t.Helper()
	clock := backendtest.NewClock(backendtest.Epoch)
	s := memory.New(memory.WithClock(clock.Now), memory.WithSweepInterval(0))
	t.Cleanup(func() { s.Close() })
	return s, clock
}

// The chat endpoint's daily budget: 200,000 model tokens per shop, charged
// after each reply with the tokens the model reports. GCRA emits one token
// every T = 86_400 s / 200_000 = 432 ms.
func TestTokenBudgetChargedAfterTheReply(t *testing.T) {
	store, clock := fakeMemory(t)
	l := MustNew([]Rule{{
		Name: "chat:tokens", Key: headerKey("X-Shop"),
		Limit: 200_000, Period: 24 * time.Hour, Algorithm: GCRA,
		Estimate: func(*http.Request) (int64, error) { return 0, nil }, // known only after the reply
	}}, WithBackend(store))
	var reported int64
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "chat:tokens", reported); err != nil {
			t.Error(err)
		}
	}))
	const T = 432 * time.Millisecond
	for i, step := range []struct {
		at         time.Duration
		tokens     int64 // what the model reports for this reply
		status     int
		retryAfter string
	}{
		{0, 150_000, 200, ""},
		{0, 120_000, 200, ""},                      // 50,000 were left: 70,000 into debt
		{0, 0, 429, "30241"},                       // one more token needs 70,001 T = 30,240.432 s
		{70_001*T - time.Microsecond, 0, 429, "1"}, // not yet
		{70_001 * T, 10, 200, ""},                  // the debt has been waited out
		{70_001 * T, 0, 429, "5"},                  // that reply's 10 tokens are owed again: 10 T = 4.32 s
	} {
		clock.Set(backendtest.Epoch.Add(step.at))
		reported = step.tokens
		w := serve(t, h, shopRequest())
		if w.Code != step.status || w.Header().Get("Retry-After") != step.retryAfter {
			t.Errorf("step %d at %v: %d Retry-After %q, want %d %q", i, step.at, w.Code, w.Header().Get("Retry-After"), step.status, step.retryAfter)
		}
	}
}

// A request whose estimate does not fit is refused before any work and
// takes nothing from any rule; Peek and Reset see and restore the state the
// middleware keeps.
func TestEstimateThatDoesNotFitIsRefusedBeforeTheWork(t *testing.T) {
	store, _ := fakeMemory(t)
	maxTokens := func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64) }
	l := MustNew([]Rule{
		{Name: "chat:minute", Key: headerKey("X-Shop"), Limit: 30, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "chat:tokens", Key: headerKey("X-Shop"), Limit: 1_000, Period: time.Hour, Estimate: maxTokens},
	}, WithBackend(store))
	calls := 0
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ }))
	ask := func(tokens int) int {
		r := shopRequest()
		r.Header.Set("X-Max-Tokens", strconv.Itoa(tokens))
		return serve(t, h, r).Code
	}
	remaining := func(rule string) int64 {
		t.Helper()
		res, err := l.Peek(context.Background(), rule, "shop-1")
		if err != nil {
			t.Fatal(err)
		}
		return res.Remaining
	}

	if got := []int{ask(800), ask(500)}; got[0] != 200 || got[1] != 429 {
		t.Fatalf("statuses = %v, want [200 429]", got)
	}
	if calls != 1 {
		t.Errorf("handler ran %d times, want 1: the refused estimate started no work", calls)
	}
	for range 3 { // peeking does not consume
		if got, want := remaining("chat:tokens"), int64(200); got != want {
			t.Errorf("tokens remaining = %d, want %d: the refused estimate took nothing", got, want)
		}
		if got, want := remaining("chat:minute"), int64(29); got != want {
			t.Errorf("minute remaining = %d, want %d: the refused request took nothing from its other rule", got, want)
		}
	}
	if err := l.Reset(context.Background(), "chat:tokens", "shop-1"); err != nil {
		t.Fatal(err)
	}
	if got, want := remaining("chat:tokens"), int64(1_000); got != want {
		t.Errorf("tokens remaining after Reset = %d, want %d", got, want)
	}
	if got := ask(500); got != 200 {
		t.Errorf("after Reset: status %d, want 200", got)
	}
}

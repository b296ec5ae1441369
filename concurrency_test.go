package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// gate is a handler that holds each request until told to let one go: a
// token on leave lets go the held request that entered first, so a test
// that lets one go knows which.
type gate struct {
	entered chan struct{}
	leave   chan struct{}
	mu      sync.Mutex
	held    []chan struct{} // the held requests, in the order they entered
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 64), leave: make(chan struct{}, 64)} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mine := make(chan struct{})
	g.mu.Lock()
	g.held = append(g.held, mine)
	g.mu.Unlock()
	g.entered <- struct{}{}
	for {
		select {
		case <-mine:
			return
		case <-g.leave:
			g.mu.Lock()
			if !slices.Contains(g.held, mine) {
				g.mu.Unlock()
				g.leave <- struct{}{} // let go already: the token is another's
				return
			}
			close(g.held[0])
			g.held = g.held[1:]
			g.mu.Unlock()
		case <-r.Context().Done():
			g.mu.Lock()
			if i := slices.Index(g.held, mine); i >= 0 {
				g.held = slices.Delete(g.held, i, i+1)
			}
			g.mu.Unlock()
			return
		}
	}
}

// start serves r on h in the background and returns its recorder, filled
// once done is closed.
func start(h http.Handler, r *http.Request) (*httptest.ResponseRecorder, chan struct{}) {
	w, done := httptest.NewRecorder(), make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }() // a handler's panic, re-raised by the middleware
		h.ServeHTTP(w, r)
	}()
	return w, done
}

func inflightRequest(shop string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Shop", shop)
	return r
}

// A slot is taken when the request is admitted and given back when its
// handler returns; a request over the limit is a 429 with a retry hint of
// a second, and the policy says "concurrent requests".
func TestConcurrencyHoldsASlotWhileTheHandlerRuns(t *testing.T) {
	l := MustNew([]Rule{{Name: "chat:inflight", Key: headerKey("X-Shop"), Limit: 2, Period: time.Minute, Algorithm: Concurrency}})
	defer l.Close()
	g := newGate()
	h := l.Handler(g)
	_, done1 := start(h, inflightRequest("acme"))
	<-g.entered
	_, done2 := start(h, inflightRequest("acme"))
	<-g.entered
	w := serve(t, h, inflightRequest("acme"))
	if w.Code != 429 {
		t.Fatalf("third request in flight: %d, want 429", w.Code)
	}
	if got, want := w.Header().Get("Retry-After"), "1"; got != want {
		t.Errorf("Retry-After %q, want %q", got, want)
	}
	if got, want := w.Header().Get("RateLimit-Policy"), `"chat:inflight";q=2;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if !strings.Contains(w.Body.String(), "quota exceeded for chat:inflight (2 at once)") {
		t.Errorf("problem body %s does not say the limit", w.Body)
	}
	if w := serve(t, l.Handler(okHandler), inflightRequest("globex")); w.Code != 200 {
		t.Errorf("another shop: %d, want 200", w.Code)
	}
	g.leave <- struct{}{} // one of the two leaves; the other stays in
	select {
	case <-done1:
	case <-done2:
	}
	_, done3 := start(h, inflightRequest("acme"))
	<-g.entered
	if w := serve(t, h, inflightRequest("acme")); w.Code != 429 {
		t.Errorf("after one left and another came in: %d, want 429", w.Code)
	}
	g.leave <- struct{}{}
	g.leave <- struct{}{}
	<-done1
	<-done2
	<-done3
}

// The slot comes back when the handler panics, and when the client goes
// away (the handler honours its context).
func TestConcurrencySlotComesBackOnPanicAndDisconnect(t *testing.T) {
	l := MustNew([]Rule{{Name: "export", Key: headerKey("X-Shop"), Limit: 1, Period: time.Minute, Algorithm: Concurrency}})
	defer l.Close()
	panicking := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	_, done := start(panicking, inflightRequest("acme"))
	<-done
	if w := serve(t, l.Handler(okHandler), inflightRequest("acme")); w.Code != 200 {
		t.Fatalf("after a handler panicked: %d, want 200 (the slot back)", w.Code)
	}

	g := newGate()
	ctx, cancel := context.WithCancel(context.Background())
	_, done = start(l.Handler(g), inflightRequest("acme").WithContext(ctx))
	<-g.entered
	if w := serve(t, l.Handler(okHandler), inflightRequest("acme")); w.Code != 429 {
		t.Fatalf("while a request is in flight: %d, want 429", w.Code)
	}
	cancel() // the client went away
	<-done
	if w := serve(t, l.Handler(okHandler), inflightRequest("acme")); w.Code != 200 {
		t.Errorf("after the client went away: %d, want 200 (the slot back)", w.Code)
	}
}

// A concurrency rule is decided in the same call as the rate rules: a
// request the rate rule refuses takes no slot, and one the slot refuses
// costs the rate rule nothing.
func TestConcurrencyIsAllOrNothingWithRateRules(t *testing.T) {
	obs := &countingObserver{}
	l := MustNew([]Rule{
		{Name: "perday", Key: headerKey("X-Shop"), Limit: 3, Period: 24 * time.Hour, Algorithm: SlidingLog},
		{Name: "inflight", Key: headerKey("X-Shop"), Limit: 1, Period: time.Minute, Algorithm: Concurrency},
	}, WithObserver(obs))
	defer l.Close()
	g := newGate()
	h := l.Handler(g)
	_, done := start(h, inflightRequest("acme"))
	<-g.entered
	for range 3 {
		if w := serve(t, h, inflightRequest("acme")); w.Code != 429 {
			t.Fatalf("over the concurrency limit: %d", w.Code)
		}
	}
	g.leave <- struct{}{}
	<-done
	if res, _ := l.Peek(context.Background(), "perday", "acme"); res.Remaining != 2 {
		t.Errorf("daily budget %d after one admitted and three refused for concurrency, want 2", res.Remaining)
	}
	if got, want := obs.calls.Load(), int64(4); got != want {
		t.Errorf("%d backend decisions for 4 requests, want one each", got)
	}
	// Spend the day: the next request takes no slot.
	serve(t, l.Handler(okHandler), inflightRequest("acme"))
	serve(t, l.Handler(okHandler), inflightRequest("acme"))
	if w := serve(t, l.Handler(okHandler), inflightRequest("acme")); w.Code != 429 || !strings.Contains(w.Body.String(), "perday") {
		t.Fatalf("a fourth in the day: %d %s", w.Code, w.Body)
	}
	if res, _ := l.Peek(context.Background(), "inflight", "acme"); res.Remaining != 1 {
		t.Errorf("slots free %d after a request the daily rule refused, want 1", res.Remaining)
	}
}

// Through Decide, the caller gives the slots back with Release; a Decision
// dropped without Release is released once the garbage collector finds it,
// with a warning.
func TestConcurrencyThroughDecide(t *testing.T) {
	logs := &logRecorder{}
	l := MustNew([]Rule{{Name: "jobs", Limit: 2, Period: time.Minute, Algorithm: Concurrency}}, WithLogger(slog.New(logs)))
	defer l.Close()
	ctx := context.Background()
	in := Input{Rule: "jobs", Key: "tenant-1"}
	d1, _ := l.Decide(ctx, in)
	d2, _ := l.Decide(ctx, in)
	d3, err := l.Decide(ctx, in)
	if !d1.Allowed || !d2.Allowed || d3.Allowed || err != nil {
		t.Fatalf("three decisions with 2 slots: %v %v %v (%v)", d1.Allowed, d2.Allowed, d3.Allowed, err)
	}
	if d3.RetryAfter != time.Second {
		t.Errorf("RetryAfter %v, want the one-second hint", d3.RetryAfter)
	}
	d3.Release() // holds nothing: a no-op
	d1.Release()
	d1.Release() // idempotent: does not give back a slot it no longer holds
	if d, _ := l.Decide(ctx, in); !d.Allowed {
		t.Fatal("after a Release: refused")
	} else {
		defer d.Release()
	}
	if d, _ := l.Decide(ctx, in); d.Allowed {
		t.Fatal("a Release twice gave back two slots")
	}

	// d2 dropped without Release: the slot comes back after a GC.
	d2 = Decision{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		d, _ := l.Decide(ctx, in)
		if d.Allowed {
			d.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a dropped Decision's slot never came back")
		}
		time.Sleep(10 * time.Millisecond) // the GC runs the cleanup on a goroutine of its own
	}
	if logs.count(slog.LevelWarn, "dropped without Release") != 1 {
		t.Error("no warning about the dropped Decision")
	}
}

// A rule's Period is its lease: too short a lease, or an Estimate, is a
// configuration error.
func TestConcurrencyRuleValidation(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Name: "c", Key: RemoteAddr, Limit: 1, Period: 500 * time.Millisecond, Algorithm: Concurrency}, "under 1s"},
		{Rule{Name: "c", Key: RemoteAddr, Limit: 1, Period: time.Minute, Algorithm: Concurrency,
			Estimate: func(*http.Request) (int64, error) { return 1, nil }}, "no Estimate"},
	} {
		if _, err := New([]Rule{tc.rule}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.rule, err, tc.want)
		}
	}
}

// While the backend is down, a concurrency rule failing local holds its
// slots on the in-process store, and gives them back there.
func TestConcurrencyFailLocal(t *testing.T) {
	l := MustNew([]Rule{{Name: "inflight", Key: headerKey("X-Shop"), Limit: 1, Period: time.Minute, Algorithm: Concurrency}},
		WithBackend(&flaky{err: errors.New("down")}), WithLogger(slog.New(&logRecorder{})))
	defer l.Close()
	g := newGate()
	h := l.Handler(g)
	_, done := start(h, inflightRequest("acme"))
	<-g.entered
	if w := serve(t, h, inflightRequest("acme")); w.Code != 429 {
		t.Fatalf("a second request while the backend is down: %d, want 429 from the local store", w.Code)
	}
	g.leave <- struct{}{}
	<-done
	if w := serve(t, l.Handler(okHandler), inflightRequest("acme")); w.Code != 200 {
		t.Errorf("after the first left: %d, want 200", w.Code)
	}
}

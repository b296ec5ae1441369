package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// denyCached answers like a remote backend with a deny cache: a key named
// in spent is refused from the cache (Cached), any other call goes to the
// "server", which fails with err when it is set.
type denyCached struct {
	mu    sync.Mutex
	err   error
	spent string
	calls int // calls that reached the server
}

func (d *denyCached) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		if strings.HasPrefix(r.Key, d.spent) {
			for j := range out {
				out[j] = backend.Result{Allowed: true, Limit: reqs[j].Limit, Unread: true, Cached: true}
			}
			out[i] = backend.Result{Limit: r.Limit, RetryAfter: time.Minute, ResetAfter: time.Minute, Cached: true}
			return out, nil
		}
	}
	d.calls++
	if d.err != nil {
		return nil, d.err
	}
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (d *denyCached) Reset(context.Context, ...string) error { return nil }

func (d *denyCached) fail(err error) {
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
}

// An answer from the deny cache is not the backend's: interleaved with the
// failures of a dead backend it neither resets the failure count nor keeps
// the breaker from opening, and while the breaker is open none of them
// closes it.
func TestCachedAnswersDoNotMoveTheBreaker(t *testing.T) {
	var spentKey string
	be := &denyCached{}
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(be), WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}))
	defer l.Close()
	spentKey = l.request(&l.rules[0], "203.0.113.1").Key
	be.spent = spentKey
	h := l.Handler(okHandler)
	spent := func() int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "203.0.113.1:1"
		return serve(t, h, r).Code
	}
	be.fail(errDown)
	for i := range 3 {
		if got := spent(); got != http.StatusTooManyRequests {
			t.Fatalf("a deny-cached key: %d, want 429", got)
		}
		get(t, h) // a failure
		if i < 2 && l.Health().Status != "healthy" {
			t.Fatalf("degraded after %d failures", i+1)
		}
	}
	if got := l.Health().Status; got != "degraded" {
		t.Fatalf("after 3 failures interleaved with cached answers: %q, want degraded", got)
	}
	for range 20 {
		get(t, h)
	}
	if got := l.Health().Status; got != "degraded" {
		t.Errorf("the open breaker closed while the backend was down: %q", got)
	}

	// And on a healthy backend, cached answers are no success either: they
	// do not reset a run of failures.
	be2 := &denyCached{}
	l2 := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(be2), WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 2, CoolDown: time.Hour}))
	defer l2.Close()
	be2.spent = l2.request(&l2.rules[0], "203.0.113.1").Key
	be2.fail(errDown)
	h2 := l2.Handler(okHandler)
	get(t, h2)
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.1:1"
	serve(t, h2, r)
	get(t, h2)
	if got := l2.Health().Status; got != "degraded" {
		t.Errorf("failure, cached answer, failure with Failures 2: %q, want degraded", got)
	}
}

// ctxBackend honours its context: it answers after delay unless the
// context ends first.
type ctxBackend struct {
	admitAll
	delay time.Duration
	mu    sync.Mutex
	calls int
}

func (c *ctxBackend) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	select {
	case <-time.After(c.delay):
		return c.admitAll.DecideInto(ctx, reqs, out)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *ctxBackend) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, c.DecideInto(ctx, reqs, out)
}

// A client that goes away (its request's context cancelled, as Go's server
// does for a half-closed connection) does not cancel the decision: the
// backend decides, the decision counts, and no fail mode or breaker
// failure follows.
func TestClientCancellationIsNotABackendFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &ctxBackend{admitAll: admitAll{remote: true}, delay: 20 * time.Millisecond}
		obs := newRecorder()
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute, FailMode: FailClosed}},
			WithBackend(be), WithObserver(obs), WithTimeout(10*time.Second), WithLogger(slog.New(slog.DiscardHandler)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
		defer l.Close()
		h := l.Handler(okHandler)
		for range 3 {
			ctx, cancel := context.WithCancel(context.Background())
			r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
			go func() { time.Sleep(time.Millisecond); cancel() }()
			if got := serve(t, h, r).Code; got != 200 {
				t.Errorf("a request whose client left during the decision: %d, want 200 (decided by the backend)", got)
			}
			cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if d, err := l.Decide(ctx, Input{Rule: "ip", Key: "k"}); err != nil || !d.Allowed || d.Results[0].Fallback != inherit {
			t.Errorf("Decide with a cancelled context: %+v, %v; want decided by the backend", d, err)
		}
		if got := l.Health(); got.Status != "healthy" || got.DegradedTotal != 0 {
			t.Errorf("health %+v: a client going away moved the breaker", got)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		for _, err := range obs.backend {
			if err != nil {
				t.Errorf("observed backend error %v", err)
			}
		}
		if len(obs.failmodes) != 0 {
			t.Errorf("fail modes applied: %v", obs.failmodes)
		}
	})
}

// A reply that arrives after the limiter's deadline is the backend's
// decision, and is used: the request is not decided twice (once by Redis,
// once by the fail mode).
func TestLateReplyIsUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := &slowIgnoring{delay: 60 * time.Millisecond}
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
			WithBackend(slow), WithFailMode(FailClosed), WithTimeout(50*time.Millisecond),
			WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
		defer l.Close()
		if got := get(t, l.Handler(okHandler)).Code; got != 200 {
			t.Errorf("a reply 10ms after the 50ms deadline: %d, want 200 (the backend's answer)", got)
		}
		if got := l.Health().Status; got != "healthy" {
			t.Errorf("a reply within the grace moved the breaker: %q", got)
		}
	})
}

// slowIgnoring answers after delay, ignoring its context.
type slowIgnoring struct {
	admitAll
	delay time.Duration
}

func (s *slowIgnoring) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	time.Sleep(s.delay)
	return s.admitAll.DecideInto(ctx, reqs, out)
}

func (s *slowIgnoring) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, s.DecideInto(ctx, reqs, out)
}

// onCaller is ctxBackend recording whether each call ran on the caller's
// goroutine (Limiter.Decide on its stack) or on another.
type onCaller struct {
	ctxBackend
	inline, elsewhere atomic.Int64
}

func (d *onCaller) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	found := false
	for {
		f, more := frames.Next()
		found = found || strings.HasSuffix(f.Function, "(*Limiter).Decide")
		if !more {
			break
		}
	}
	if found {
		d.inline.Add(1)
	} else {
		d.elsewhere.Add(1)
	}
	return d.ctxBackend.DecideInto(ctx, reqs, out)
}

func (d *onCaller) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, d.DecideInto(ctx, reqs, out)
}

// A backend is called inline, on the caller's goroutine: no goroutine per
// decision. Its own deadline error is a timeout, which the fail mode
// answers.
func TestBackendIsCalledInline(t *testing.T) {
	be := &onCaller{ctxBackend: ctxBackend{admitAll: admitAll{remote: true}}}
	l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
		WithTimeout(20*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	for range 5 {
		if d, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "k"}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if got, want := be.inline.Load(), int64(5); got != want || be.elsewhere.Load() != 0 {
		t.Errorf("calls inline %d, on another goroutine %d; want %d inline", got, be.elsewhere.Load(), want)
	}
	be.delay = time.Second // now it runs out of its deadline
	d, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
	if err != nil || d.Results[0].Fallback != FailLocal {
		t.Errorf("a backend past its deadline: %+v, %v; want a local fallback", d, err)
	}
}

// While the breaker is open, Peek, Reset, Charge and settlements fail at
// once with ErrDegraded instead of waiting for a dead backend; otherwise
// they are bounded by the timeout like decisions.
func TestOperatorCallsGoThroughTheBreaker(t *testing.T) {
	synctest.Test(t, testOperatorCallsGoThroughTheBreaker)
}

func testOperatorCallsGoThroughTheBreaker(t *testing.T) {
	be := &flaky{}
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(be), WithFailMode(FailOpen), WithTimeout(20*time.Millisecond),
		WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Peek(ctx, "ip", "a"); err != nil {
		t.Fatal(err)
	}
	if err := l.Charge(ctx, Input{Rule: "ip", Key: "a", Cost: 3}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	be.mu.Lock()
	be.block = release // hangs until its deadline
	be.mu.Unlock()
	start := time.Now()
	_, err := l.Peek(ctx, "ip", "a")
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("Peek on a hung backend: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Peek on a hung backend took %v", d)
	}
	time.Sleep(confirmBudget) // virtual: the probe that confirms the timeout fails
	synctest.Wait()
	if got := l.Health().Status; got != "degraded" {
		t.Fatalf("a timed-out Peek, confirmed by a probe, is a backend failure like any other: %q", got)
	}
	calls := be.callCount()
	for name, call := range map[string]func() error{
		"peek":   func() error { _, err := l.Peek(ctx, "ip", "a"); return err },
		"reset":  func() error { return l.Reset(ctx, "ip", "a") },
		"charge": func() error { return l.Charge(ctx, Input{Rule: "ip", Key: "a", Cost: 1}) },
	} {
		if err := call(); !errors.Is(err, ErrDegraded) {
			t.Errorf("%s while degraded: %v, want ErrDegraded", name, err)
		}
	}
	if got := be.callCount(); got != calls {
		t.Errorf("operator calls reached the backend %d times through the open breaker", got-calls)
	}
}

// Charge takes units past the limit (forced) or gives them back, in one
// call, on the key the middleware uses.
func TestChargeForcesAndRefunds(t *testing.T) {
	l := MustNew([]Rule{{Name: "tokens", Key: RemoteAddr, Limit: 100, Period: time.Hour, Algorithm: FixedWindow}})
	defer l.Close()
	ctx := context.Background()
	if err := l.Charge(ctx, Input{Rule: "tokens", Key: "shop", Cost: 150}); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Decide(ctx, Input{Rule: "tokens", Key: "shop"}); d.Allowed {
		t.Error("a key charged past its limit still admits")
	}
	if err := l.Charge(ctx, Input{Rule: "tokens", Key: "shop", Cost: -60}); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Decide(ctx, Input{Rule: "tokens", Key: "shop", Cost: 10}); !d.Allowed || d.Results[0].Remaining != 0 {
		t.Errorf("after refunding 60 of 150: %+v, want 10 more admitted and none left", d)
	}
	for _, bad := range []Input{{Rule: "tokens", Key: "shop"}, {Rule: "nope", Key: "shop", Cost: 1}, {Rule: "tokens", Cost: 1}} {
		if err := l.Charge(ctx, bad); err == nil {
			t.Errorf("Charge(%+v) succeeded", bad)
		}
	}
}

package ceiling

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ceiling-go/ceiling/backend"
)

// gated is a Backend whose Decide first waits for a channel (or its context)
// and then answers from scripted; it is how a test makes the decision and
// the prefetch overlap without looking at a clock.
type gated struct {
	scripted
	gate chan struct{}
}

func (g *gated) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.scripted.Decide(ctx, reqs)
}

var ipRule = []Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}}

var rejectIP = map[string]backend.Result{"ip": {Allowed: false, Limit: 10, RetryAfter: 3 * time.Second}}

// The backend cannot answer until the prefetch has run: if the work waited
// for the decision, the request would time out and be refused 503.
func TestPrefetchOverlapsTheDecision(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	be := &gated{gate: make(chan struct{})}
	order := Prefetch("order", func(ctx context.Context, r *http.Request) (string, error) {
		close(be.gate)
		return "order 42", nil
	})
	l := MustNew(ipRule, WithBackend(be), WithPrefetch(order), WithTimeout(5*time.Second))
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := order.Get(r)
		if err != nil {
			t.Errorf("Get: %v", err)
		}
		w.Write([]byte(v))
	}))
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if got, want := w.Code, 200; got != want {
		t.Fatalf("status = %d, want %d: the prefetch did not run while the backend decided", got, want)
	}
	if got, want := w.Body.String(), "order 42"; got != want {
		t.Errorf("body = %q, want %q", got, want)
	}
}

// The work finishes before the decision (the backend waits for it), so its
// result exists when the request is refused, and still no byte of it may
// reach the 429, whatever the reject handler tries.
func TestRejectedResponseHoldsNoPrefetchedByte(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const secret = "SECRET-ORDER-7731"
	for _, tc := range []struct {
		name   string
		be     func(gate chan struct{}) backend.Backend
		status int
	}{
		{"429", func(g chan struct{}) backend.Backend { return &gated{gate: g, scripted: scripted{answers: rejectIP}} }, 429},
		{"503 failing closed", func(g chan struct{}) backend.Backend {
			return &gated{gate: g, scripted: scripted{err: errors.New("down")}}
		}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate := make(chan struct{})
			order := Prefetch("order", func(ctx context.Context, r *http.Request) (string, error) {
				defer close(gate)
				return secret, nil
			})
			var getErr error
			spy := func(w http.ResponseWriter, r *http.Request, d *Decision) {
				v, err := order.Get(r)
				getErr = err
				w.Header().Set("X-Spy", v)
				WriteRejection(w, r, d)
			}
			l := MustNew(ipRule, WithBackend(tc.be(gate)), WithPrefetch(order), WithRejectHandler(spy), WithTimeout(5*time.Second), WithFailMode(FailClosed))
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t.Error("a refused request reached the handler")
			}))
			w := serve(t, h, httptest.NewRequest("GET", "/", nil))
			if got := w.Code; got != tc.status {
				t.Fatalf("status = %d, want %d", got, tc.status)
			}
			var dump bytes.Buffer
			w.Header().Write(&dump)
			dump.Write(w.Body.Bytes())
			if strings.Contains(dump.String(), secret) {
				t.Errorf("the refusal carries the prefetched data:\n%s", dump.String())
			}
			if tc.status == 429 && !errors.Is(getErr, ErrNotPrefetched) {
				t.Errorf("Get in the reject handler: err = %v, want ErrNotPrefetched", getErr)
			}
		})
	}
}

func TestPrefetchCancelledOnRejection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	started := make(chan struct{})
	var workErr error
	slow := Prefetch("slow", func(ctx context.Context, r *http.Request) (int, error) {
		close(started)
		workErr = waitForCancel(ctx)
		return 0, workErr
	})
	be := &gated{gate: started, scripted: scripted{answers: rejectIP}}
	l := MustNew(ipRule, WithBackend(be), WithPrefetch(slow), WithTimeout(5*time.Second))
	w := serve(t, l.Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if got, want := w.Code, 429; got != want {
		t.Fatalf("status = %d, want %d", got, want)
	}
	// The middleware waited for the work before returning, so workErr is set.
	if !errors.Is(workErr, context.Canceled) {
		t.Errorf("the work's context ended with %v, want context.Canceled", workErr)
	}
}

// An admitted handler that never reads the result still leaves no goroutine
// behind: the work's context is cancelled when the handler returns.
func TestPrefetchStoppedWhenHandlerReturns(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var workErr error
	slow := Prefetch("slow", func(ctx context.Context, r *http.Request) (int, error) {
		workErr = waitForCancel(ctx)
		return 0, workErr
	})
	l := MustNew(ipRule, WithBackend(&scripted{}), WithPrefetch(slow))
	w := serve(t, l.Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if got, want := w.Code, 200; got != want {
		t.Fatalf("status = %d, want %d", got, want)
	}
	if !errors.Is(workErr, context.Canceled) {
		t.Errorf("the work's context ended with %v, want context.Canceled", workErr)
	}
}

// Failing open admits without a decision; the handler still gets the work.
func TestPrefetchDeliveredWhenFailingOpen(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	n := Prefetch("n", func(context.Context, *http.Request) (int, error) { return 7, nil })
	l := MustNew(ipRule, WithBackend(&scripted{err: errors.New("down")}), WithFailMode(FailOpen), WithPrefetch(n), WithLogger(discard()))
	var got int
	serve(t, l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = n.Get(r)
	})), httptest.NewRequest("GET", "/", nil))
	if want := 7; got != want {
		t.Errorf("Get = %d, want %d", got, want)
	}
}

func TestPrefetchPanicIsAnErrorNotACrash(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var logs syncBuffer
	boom := Prefetch("boom", func(context.Context, *http.Request) ([]byte, error) { panic("cache exploded") })
	fine := Prefetch("fine", func(context.Context, *http.Request) (string, error) { return "fine", nil })
	l := MustNew(ipRule, WithBackend(&scripted{}), WithPrefetch(boom, fine),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	var boomErr error
	var fineVal string
	w := serve(t, l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, boomErr = boom.Get(r)
		fineVal, _ = fine.Get(r)
	})), httptest.NewRequest("GET", "/", nil))
	if w.Code != 200 {
		t.Fatalf("status = %d, want 200", w.Code)
	}
	if !errors.Is(boomErr, ErrPrefetchPanic) || !strings.Contains(boomErr.Error(), `"boom"`) || !strings.Contains(boomErr.Error(), "cache exploded") {
		t.Errorf("Get after a panic: err = %v, want ErrPrefetchPanic naming the work and the value", boomErr)
	}
	if fineVal != "fine" {
		t.Errorf("the other work's result = %q, want %q", fineVal, "fine")
	}
	if s := logs.String(); !strings.Contains(s, "prefetch panicked") || !strings.Contains(s, "prefetch=boom") {
		t.Errorf("the panic was not logged: %q", s)
	}
}

func TestBadInputStartsNoPrefetch(t *testing.T) {
	started := false
	p := Prefetch("p", func(context.Context, *http.Request) (int, error) { started = true; return 0, nil })
	rules := []Rule{{Name: "otp", Key: func(*http.Request) (string, error) { return "", errors.New("bad phone") }, Limit: 3, Period: time.Minute}}
	w := serve(t, MustNew(rules, WithBackend(&scripted{}), WithPrefetch(p)).Handler(okHandler), httptest.NewRequest("GET", "/", nil))
	if w.Code != 400 {
		t.Fatalf("status = %d, want 400", w.Code)
	}
	if started {
		t.Error("work started for a request refused as bad input")
	}
}

func TestGetOutsideTheLimiter(t *testing.T) {
	p := Prefetch("p", func(context.Context, *http.Request) (int, error) { return 1, nil })
	other := Prefetch("other", func(context.Context, *http.Request) (int, error) { return 2, nil })
	if _, err := p.Get(httptest.NewRequest("GET", "/", nil)); !errors.Is(err, ErrNotPrefetched) || !strings.Contains(err.Error(), `"p"`) {
		t.Errorf("Get on a request no limiter saw: err = %v, want ErrNotPrefetched naming p", err)
	}
	var err error
	h := MustNew(ipRule, WithBackend(&scripted{}), WithPrefetch(other)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err = p.Get(r)
	}))
	serve(t, h, httptest.NewRequest("GET", "/", nil))
	if !errors.Is(err, ErrNotPrefetched) {
		t.Errorf("Get of work registered elsewhere: err = %v, want ErrNotPrefetched", err)
	}
}

func TestWithPrefetchRejectsBadHandles(t *testing.T) {
	p := Prefetch("p", func(context.Context, *http.Request) (int, error) { return 1, nil })
	var nilHandle *Prefetched[int]
	for _, tc := range []struct {
		name string
		opt  Option
		want string
	}{
		{"nil", WithPrefetch(nil), "nil prefetch"},
		{"nil handle", WithPrefetch(nilHandle), "nil prefetch"},
		{"nil func", WithPrefetch(Prefetch[int]("f", nil)), `"f" has no function`},
		{"twice", WithPrefetch(p, p), `"p" registered twice`},
	} {
		if _, err := New(ipRule, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

// waitForCancel returns ctx's error once it is done, or an error of its own
// if nobody cancels it within a few seconds, so that a broken cancellation
// fails the test instead of hanging it.
func waitForCancel(ctx context.Context) error {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errors.New("the work's context was never cancelled")
	}
}

// syncBuffer is a bytes.Buffer safe for the prefetch goroutines' logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

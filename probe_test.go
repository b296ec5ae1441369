package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"go.uber.org/goleak"
)

// The prober runs only while degraded, one goroutine per limiter, and Close
// stops it.
func TestProberStopsOnClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		be := &flaky{err: errDown}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond, MaxCoolDown: 2 * time.Millisecond}))
		for range 3 {
			if _, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "k"}); err != nil {
				t.Fatal(err)
			}
		}
		if !eventually(func() bool { return len(be.probeTimes()) >= 3 }) {
			t.Fatal("no probes while degraded")
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		n := len(be.probeTimes())
		time.Sleep(20 * time.Millisecond)
		if got := len(be.probeTimes()); got != n {
			t.Errorf("%d probes after Close", got-n)
		}
	})
}

// A healthy limiter runs no prober, and one that recovered stops its own.
func TestProberRunsOnlyWhileDegraded(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		be := &flaky{}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond}))
		defer l.Close()
		time.Sleep(10 * time.Millisecond)
		if n := len(be.probeTimes()); n != 0 {
			t.Fatalf("%d probes while healthy", n)
		}
		be.fail(errDown)
		l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
		be.fail(nil)
		if !eventually(func() bool { return l.Health().Status == "healthy" }) {
			t.Fatal("no recovery")
		}
		n := len(be.probeTimes())
		time.Sleep(20 * time.Millisecond)
		if got := len(be.probeTimes()); got != n {
			t.Errorf("%d probes after recovery", got-n)
		}
		goleak.VerifyNone(t, goleak.IgnoreCurrent()) // no prober left behind, before Close too
	})
}

// A probe answered from a cache in process is no evidence: the breaker
// stays open.
func TestProbeAnsweredFromACacheDoesNotClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &cachedProbe{flaky: flaky{err: errDown}}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond, MaxCoolDown: time.Millisecond}))
		defer l.Close()
		l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
		be.fail(nil)
		if !eventually(func() bool { return len(be.probeTimes()) >= 5 }) {
			t.Fatal("no probes")
		}
		if got := l.Health().Status; got != "degraded" {
			t.Errorf("probes answered from a cache closed the breaker: %q", got)
		}
	})
}

// cachedProbe answers probes from "a cache", everything else like flaky.
type cachedProbe struct{ flaky }

func (c *cachedProbe) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out, err := c.flaky.Decide(ctx, reqs)
	if err == nil && isProbe(reqs) {
		out[0].Cached = true
	}
	return out, err
}

// A probe must prove the backend can decide: a read-only or full backend
// that answers reads but refuses writes keeps the limiter degraded, with
// the kind as the reason.
func TestProbeThatCannotWriteKeepsTheLimiterDegraded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, kind := range []error{backend.ErrReadOnly, backend.ErrOutOfMemory} {
			be := &flaky{err: errDown}
			l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
				WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
				WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond, MaxCoolDown: time.Millisecond}))
			l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
			be.fail(fmt.Errorf("%w: the write was refused", kind))
			if !eventually(func() bool { return l.Health().Reason == KindOf(kind) }) {
				t.Errorf("%v: reason %q", kind, l.Health().Reason)
			}
			if got := l.Health().Status; got != "degraded" {
				t.Errorf("%v: %q", kind, got)
			}
			l.Close()
		}
	})
}

// Check names the cause's kind, and a backend that cannot decide at start
// leaves the limiter degraded at once, probing, so that health says so
// from the first second.
func TestCheckFailureDegradesAndNamesTheKind(t *testing.T) {
	for _, kind := range []error{backend.ErrAuth, backend.ErrReadOnly, backend.ErrOutOfMemory, backend.ErrUnreachable} {
		logs := &logRecorder{}
		be := &flaky{err: fmt.Errorf("%w: the server said no", kind)}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithLogger(slog.New(logs)), WithBreaker(BreakerConfig{CoolDown: time.Hour}))
		err := l.Check(context.Background())
		if !errors.Is(err, kind) || !strings.Contains(err.Error(), "the server said no") || !strings.Contains(err.Error(), "("+string(KindOf(kind))+")") {
			t.Errorf("Check: %v, want it to wrap %v, name the cause and its kind", err, kind)
		}
		if h := l.Health(); h.Status != "degraded" || h.Reason != KindOf(kind) {
			t.Errorf("%v: health after a failed check %+v, want degraded, reason %q", kind, h, KindOf(kind))
		}
		if logs.count(slog.LevelError, "backend degraded") != 1 {
			t.Errorf("%v: the degradation at start was not logged", kind)
		}
		l.Close()
	}
}

// A timeout hides the root cause when the backend ignores its deadline and
// keeps trying (go-redis retrying a refused dial): Check names what the
// call finally returned, as a timeout.
func TestCheckNamesTheCauseBehindATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowFailing{delay: 80 * time.Millisecond, err: fmt.Errorf("%w: dial tcp: connection refused", backend.ErrUnreachable)}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithTimeout(20*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{CoolDown: time.Hour}))
		defer l.Close()
		err := l.Check(context.Background())
		if !errors.Is(err, backend.ErrUnreachable) || !strings.Contains(err.Error(), "connection refused") || !errors.Is(err, ErrTimeout) {
			t.Errorf("Check: %v, want the refused connection behind the timeout", err)
		}
		if got := l.Health().Reason; got != "unreachable" {
			t.Errorf("reason %q, want unreachable", got)
		}
	})
}

// A backend ends its call at the timeout, leaving no late cause to wait
// for: a wrong password whose reply comes after the
// timeout (a process busy at start-up) is found by asking again with a
// longer budget, so Check still refuses the start naming it.
func TestCheckNamesALateCauseOfABackendBoundByItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &lateFailing{delay: 60 * time.Millisecond, err: fmt.Errorf("%w: WRONGPASS invalid username-password pair", backend.ErrAuth)}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithTimeout(20*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{CoolDown: time.Hour}))
		defer l.Close()
		err := l.Check(context.Background())
		if !errors.Is(err, backend.ErrAuth) || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("Check: %v, want the wrong password behind the timeout", err)
		}
		if got := l.Health().Reason; got != "timeout" && got != "auth" {
			t.Errorf("reason %q, want the failure's kind", got)
		}
	})
}

// lateFailing fails with err after delay, or with its context's error when
// its deadline comes first, as a Redis store on a client that keeps its
// context's deadline does.
type lateFailing struct {
	delay time.Duration
	err   error
}

func (s *lateFailing) Decide(ctx context.Context, _ []backend.Request) ([]backend.Result, error) {
	select {
	case <-time.After(s.delay):
		return nil, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *lateFailing) Reset(context.Context, ...string) error { return nil }

// slowFailing fails with err after delay, ignoring its context.
type slowFailing struct {
	delay time.Duration
	err   error
}

func (s *slowFailing) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	time.Sleep(s.delay)
	return nil, s.err
}

func (s *slowFailing) Reset(context.Context, ...string) error { return nil }

// notSending is a remote backend whose calls fail as never sent while
// drop is set, as a Redis store's do when this process is too busy to
// write them in time.
type notSending struct {
	admitAll
	drop  atomic.Bool
	cause error // nil: backend.ErrNotSent
}

func (s *notSending) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if s.drop.Load() {
		if s.cause != nil {
			return s.cause
		}
		return fmt.Errorf("the deadline passed before the write: %w", backend.ErrNotSent)
	}
	return s.admitAll.DecideInto(ctx, reqs, out)
}

func (s *notSending) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, s.DecideInto(ctx, reqs, out)
}

// Calls this process never got to send (backend.ErrNotSent: it was too
// busy) are not the backend's failures, however many: the breaker never
// moves, and no fail mode applies. The requests are shed, 503 with
// Retry-After, even on a rule that fails open, and counted in Health.Shed
// (issue 30.1). Once calls are sent again, they are decided as before.
func TestCallsNeverSentAreShedNotBlamed(t *testing.T) {
	be := &notSending{admitAll: admitAll{remote: true}}
	var transitions atomic.Int64
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1e9, Period: time.Minute}}, WithBackend(be), WithFailMode(FailOpen),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}),
		WithLogger(slog.New(slog.DiscardHandler)), onDegraded(func(DegradedEvent) { transitions.Add(1) }))
	defer l.Close()
	h := l.Handler(okHandler)
	be.drop.Store(true)
	for range 10 {
		w := get(t, h)
		if w.Code != 503 || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("a call never sent: %d, Retry-After %q; want 503 with Retry-After 1", w.Code, w.Header().Get("Retry-After"))
		}
	}
	if d, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "k"}); !errors.Is(err, backend.ErrNotSent) || d.Allowed {
		t.Errorf("Decide of a call never sent: %+v, %v; want a refusal wrapping backend.ErrNotSent", d, err)
	}
	hl := l.Health()
	if transitions.Load() != 0 || hl.Status != "healthy" {
		t.Errorf("%d transitions, status %q, for calls never sent", transitions.Load(), hl.Status)
	}
	if hl.Shed != 11 || hl.Rules[0].FailOpenAdmissions != 0 {
		t.Errorf("shed %d, failed open %d; want 11 shed, none failed open", hl.Shed, hl.Rules[0].FailOpenAdmissions)
	}
	be.drop.Store(false)
	if got := get(t, h).Code; got != 200 {
		t.Errorf("once calls are sent again: %d, want 200", got)
	}
}

// A call written but whose reply this process was too busy to read in time
// (backend.ErrUnread: a Redis store whose reading goroutine waited for a
// CPU past the deadline) is not the backend's failure either: shed like a
// call never sent, the breaker never moves, no fail mode applies, and its
// kind is "overloaded" (issue 30.1).
func TestRepliesUnreadAreShedNotBlamed(t *testing.T) {
	be := &notSending{admitAll: admitAll{remote: true},
		cause: fmt.Errorf("written at t, no reply read by t+100ms: %w", backend.ErrUnread)}
	var transitions atomic.Int64
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1e9, Period: time.Minute}}, WithBackend(be), WithFailMode(FailOpen),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}),
		WithLogger(slog.New(slog.DiscardHandler)), onDegraded(func(DegradedEvent) { transitions.Add(1) }))
	defer l.Close()
	h := l.Handler(okHandler)
	be.drop.Store(true)
	for range 10 {
		if w := get(t, h); w.Code != 503 || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("a reply unread: %d, Retry-After %q; want 503 with Retry-After 1", w.Code, w.Header().Get("Retry-After"))
		}
	}
	_, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
	if !errors.Is(err, backend.ErrUnread) || KindOf(err) != kindOverloaded {
		t.Errorf("Decide of a reply unread: %v (kind %q); want it wrapping backend.ErrUnread, kind %q", err, KindOf(err), kindOverloaded)
	}
	hl := l.Health()
	if transitions.Load() != 0 || hl.Status != "healthy" || hl.Shed != 11 || hl.Rules[0].FailOpenAdmissions != 0 {
		t.Errorf("%d transitions, status %q, shed %d, failed open %d; want 0, healthy, 11, 0",
			transitions.Load(), hl.Status, hl.Shed, hl.Rules[0].FailOpenAdmissions)
	}
}

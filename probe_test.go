package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"go.uber.org/goleak"
)

// The prober runs only while degraded, one goroutine per limiter, and Close
// stops it.
func TestProberStopsOnClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
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
}

// A healthy limiter runs no prober, and one that recovered stops its own.
func TestProberRunsOnlyWhileDegraded(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
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
}

// A probe answered from a cache in process is no evidence: the breaker
// stays open.
func TestProbeAnsweredFromACacheDoesNotClose(t *testing.T) {
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
	for _, kind := range []error{backend.ErrReadOnly, backend.ErrOutOfMemory} {
		be := &flaky{err: errDown}
		l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
			WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond, MaxCoolDown: time.Millisecond}))
		l.Decide(context.Background(), Input{Rule: "ip", Key: "k"})
		be.fail(fmt.Errorf("%w: the write was refused", kind))
		if !eventually(func() bool { return l.Health().Reason == FailureKind(kind) }) {
			t.Errorf("%v: reason %q", kind, l.Health().Reason)
		}
		if got := l.Health().Status; got != "degraded" {
			t.Errorf("%v: %q", kind, got)
		}
		l.Close()
	}
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
		if !errors.Is(err, kind) || !strings.Contains(err.Error(), "the server said no") || !strings.Contains(err.Error(), "("+FailureKind(kind)+")") {
			t.Errorf("Check: %v, want it to wrap %v, name the cause and its kind", err, kind)
		}
		if h := l.Health(); h.Status != "degraded" || h.Reason != FailureKind(kind) {
			t.Errorf("%v: health after a failed check %+v, want degraded, reason %q", kind, h, FailureKind(kind))
		}
		if logs.count(slog.LevelError, "backend degraded") != 1 {
			t.Errorf("%v: the degradation at start was not logged", kind)
		}
		l.Close()
	}
}

// A timeout hides the root cause when the backend ignores its deadline and
// keeps trying (go-redis retrying a refused dial): Check waits a little
// for the abandoned call and names what it found.
func TestCheckNamesTheCauseBehindATimeout(t *testing.T) {
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
}

// A backend bound by its deadline ends its call at the timeout, leaving no
// late cause to wait for: a wrong password whose reply comes after the
// timeout (a process busy at start-up) is found by asking again with a
// longer budget, so Check still refuses the start naming it.
func TestCheckNamesALateCauseOfADeadlineBoundBackend(t *testing.T) {
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
}

// lateFailing fails with err after delay, or with its context's error when
// its deadline comes first, as a Redis store on a client that keeps its
// context's deadline does.
type lateFailing struct {
	delay time.Duration
	err   error
}

func (*lateFailing) DeadlineBound() bool { return true }

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

// starvedBackend is a DeadlineBound remote backend whose decisions time out
// while drop is set, as a Redis store's do when this process is too busy to
// read the replies; the canary of a probe is answered unless down is set
// too.
type starvedBackend struct {
	admitAll
	drop, down atomic.Bool
	canaries   atomic.Int64
}

func (*starvedBackend) DeadlineBound() bool { return true }

func (s *starvedBackend) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if isProbe(reqs) {
		s.canaries.Add(1)
		if !s.down.Load() {
			return s.admitAll.DecideInto(ctx, reqs, out)
		}
	}
	if s.drop.Load() {
		return fmt.Errorf("no reply within the budget of the write: %w", context.DeadlineExceeded)
	}
	return s.admitAll.DecideInto(ctx, reqs, out)
}

func (s *starvedBackend) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, s.DecideInto(ctx, reqs, out)
}

// burn keeps n goroutines busy until stop is called, each burning 2 ms of
// CPU between short sleeps as request handlers would, so that the Go
// scheduler's runnable goroutines wait for a CPU.
func burn(n int) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				for until := time.Now().Add(2 * time.Millisecond); time.Now().Before(until); {
				}
				time.Sleep(time.Microsecond)
			}
		}()
	}
	return func() { done.Store(true); wg.Wait() }
}

// Timeouts while this process is starved for CPU (the scheduler's latency
// histogram says so) do not open the breaker as long as the backend answers
// a patient confirmation: the process was slow, not the backend (issue
// 12.9). A backend that answers nothing, on a starved machine too, still
// opens it.
func TestStarvedTimeoutsAreConfirmedBeforeTheBreakerOpens(t *testing.T) {
	be := &starvedBackend{admitAll: admitAll{remote: true}}
	var transitions atomic.Int64
	l := MustNew([]Rule{{Name: "ip", Limit: 1e9, Period: time.Minute}}, WithBackend(be), WithFailMode(FailOpen),
		WithTimeout(20*time.Millisecond), WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}),
		WithLogger(slog.New(slog.DiscardHandler)), OnDegraded(func(DegradedEvent) { transitions.Add(1) }))
	defer l.Close()
	ctx := context.Background()
	stop := burn(16 * runtime.GOMAXPROCS(0))
	defer stop()
	time.Sleep(200 * time.Millisecond) // the scheduler records the wait
	be.drop.Store(true)
	for range 10 {
		l.Decide(ctx, Input{Rule: "ip", Key: "k"})
	}
	if !eventually(func() bool { return be.canaries.Load() > 0 && !l.fo.breaker.confirming.Load() }) {
		t.Fatal("no confirmation of the starved timeouts")
	}
	if got := transitions.Load(); got != 0 {
		t.Errorf("%d breaker transitions for timeouts of a starved process whose backend answers", got)
	}
	be.down.Store(true) // now it answers nothing at all
	if !eventually(func() bool {
		l.Decide(ctx, Input{Rule: "ip", Key: "k"})
		return l.Health().Status == "degraded"
	}) {
		t.Fatal("a backend that answers nothing never opened the breaker on a starved process")
	}
	stop()
}

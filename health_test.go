package ceiling

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// The memory backend on a platform that runs several instances, with no
// WithInstances, is the issue 26 trap: three instances admitted three times
// the limit in silence. Each variable the platforms set is seen; the
// warning is logged once per process, kept by every such limiter's health
// report, and names no instance count; WithInstances (any n) and a remote
// backend silence it.
func TestMemoryBackendOnAMultiInstancePlatformWarns(t *testing.T) {
	for _, p := range platforms {
		t.Setenv(p.env, "")
	}
	quiet := slog.New(slog.DiscardHandler)
	rules := []Rule{{Name: "r", Key: RemoteAddr, Limit: 1, Period: time.Minute}}
	warned := func(l *Limiter) bool {
		return strings.Contains(strings.Join(l.Health().Warnings, "\n"), "limits are per process")
	}
	if l := MustNew(rules, WithLogger(quiet)); warned(l) {
		t.Fatal("warned with no platform variable set")
	} else {
		l.Close()
	}
	for _, p := range platforms {
		t.Run(p.env, func(t *testing.T) {
			t.Setenv(p.env, "x")
			platformWarned.Store(false)
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&logs, nil))
			a := MustNew(rules, WithLogger(logger))
			defer a.Close()
			b := MustNew(rules, WithLogger(logger))
			defer b.Close()
			if n := strings.Count(logs.String(), "limits are per process"); n != 1 || !strings.Contains(logs.String(), p.env+" is set") {
				t.Errorf("logged %d warnings naming %s, want 1:\n%s", n, p.env, logs.String())
			}
			if strings.Contains(logs.String(), "instances declared") {
				t.Errorf("the warning guesses a count:\n%s", logs.String())
			}
			if !warned(a) || !warned(b) {
				t.Errorf("Health().Warnings of each limiter: %q, %q", a.Health().Warnings, b.Health().Warnings)
			}
			for _, opt := range []Option{WithInstances(1), WithInstances(3)} {
				if l := MustNew(rules, WithLogger(quiet), opt); warned(l) {
					t.Errorf("warned despite WithInstances: %q", l.Health().Warnings)
				} else {
					l.Close()
				}
			}
			remote := &remoteMemory{memory.New()}
			defer remote.Close()
			if l := MustNew(rules, WithLogger(quiet), WithBackend(remote), WithKeySecret(bytes.Repeat([]byte("k"), 32))); warned(l) {
				t.Errorf("warned with a shared backend: %q", l.Health().Warnings)
			} else {
				l.Close()
			}
		})
	}
}

// remoteMemory is a memory store that calls itself remote, as a shared
// backend does.
type remoteMemory struct{ *memory.Store }

func (remoteMemory) InProcess() bool { return false }

// New's doc says what leaks without Close: a limiter on the default memory
// store keeps its janitor goroutine until closed (issue 26: 1000 limiters
// never closed left 1000 goroutines running).
func TestLimiterNotClosedKeepsAGoroutine(t *testing.T) {
	const n = 50
	before := settledJanitors()
	ls := make([]*Limiter, n)
	for i := range ls {
		ls[i] = MustNew([]Rule{{Name: "r", Key: RemoteAddr, Limit: 1, Period: time.Minute}})
	}
	open := janitors() - before
	for deadline := time.Now().Add(5 * time.Second); open < n && time.Now().Before(deadline); open = janitors() - before {
		runtime.Gosched() // a janitor just started may not be on a stack yet
	}
	if open < n {
		t.Fatalf("%d limiters left open run %d more memory janitors, want %d (New's doc says so)", n, open, n)
	}
	for _, l := range ls {
		l.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for janitors() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d memory janitors after closing every limiter, %d before", janitors(), before)
		}
		runtime.Gosched()
	}
}

// settledJanitors is janitors once the count has held still for a while:
// the janitors of limiters that earlier tests closed end on their own time,
// and one that ended during the count would look like a janitor missing.
func settledJanitors() int {
	n := janitors()
	for stable, deadline := 0, time.Now().Add(2*time.Second); stable < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // real goroutines of other tests, not the limiter's time
		if m := janitors(); m == n {
			stable++
		} else {
			n, stable = m, 0
		}
	}
	return n
}

// janitors counts the goroutines running a memory store's janitor.
func janitors() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "backend/memory.(*Store).janitor(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// slowStart applies its first call on a memory store but answers it only
// after delay, as a backend does for a process still busy starting; later
// calls answer at once.
type slowStart struct {
	*memory.Store
	delay time.Duration
	calls int
}

func (s *slowStart) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res, err := s.Store.Decide(context.Background(), reqs)
	if s.calls++; s.calls == 1 {
		time.Sleep(s.delay) // the reply is late; the call was applied
		return nil, context.DeadlineExceeded
	}
	return res, err
}

// DecideInto shadows the memory store's, which the limiter would call
// instead of Decide.
func (s *slowStart) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	res, err := s.Decide(ctx, reqs)
	copy(out, res)
	return err
}

func (s *slowStart) InProcess() bool { return false }

// A start-up check whose first call misses the timeout, though the backend
// applied it, passes once the backend answers within the longer budget:
// a process busy at start is not an outage, and the applied canary does
// not make the check think the backend rejects under the limit.
func TestCheckAsksAgainWhenTheFirstCallIsLate(t *testing.T) {
	be := &slowStart{Store: memory.New(), delay: 300 * time.Millisecond}
	defer be.Close()
	l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
		WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	if err := l.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v, want nil: the backend answered the second call", err)
	}
	if be.calls < 2 {
		t.Fatalf("the backend was called %d times, want the late call and the one asked again", be.calls)
	}
	if h := l.Health(); h.Status != "healthy" || h.DegradedTotal != 0 {
		t.Errorf("health after the check %+v, want healthy with no degradation", h)
	}
}

// busyThenAuth is a backend whose first reply this process was too busy
// to read, and which then refuses authentication, as a Redis with a
// password the program lacks does on a loaded machine.
type busyThenAuth struct{ calls int }

func (s *busyThenAuth) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	if s.calls++; s.calls == 1 {
		return nil, fmt.Errorf("%w: no reply read in time", backend.ErrUnread)
	}
	return nil, fmt.Errorf("%w: WRONGPASS", backend.ErrAuth)
}

func (s *busyThenAuth) Reset(context.Context, ...string) error { return nil }

// A start-up check whose first call this process was too busy to read,
// and whose second the backend refuses (a wrong password), is the
// misconfiguration: its kind is auth, the limiter is degraded, and a
// program refuses to start. Before, the first call's overload was
// wrapped too and named the kind, so the misconfigured program started,
// degraded (docs/redisstart on a loaded machine).
func TestCheckNamesAMisconfigurationAfterALateFirstCall(t *testing.T) {
	be := &busyThenAuth{}
	l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Minute}}, WithBackend(be),
		WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	err := l.Check(context.Background())
	if !errors.Is(err, backend.ErrAuth) || KindOf(err) != kindAuth {
		t.Errorf("Check: %v, kind %q; want an error wrapping backend.ErrAuth, kind auth", err, KindOf(err))
	}
	if h := l.Health(); h.Status != "degraded" || h.Reason != kindAuth {
		t.Errorf("health after the check: %q, reason %q; want degraded, auth", h.Status, h.Reason)
	}
}

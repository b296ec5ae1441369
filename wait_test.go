package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// Waiters on one key are admitted as the limit frees room, never more
// than the limit in any rolling period, and a wait consumes nothing.
func TestWaitAdmitsAtTheLimitsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "crawl", Algorithm: SlidingLog, Limit: 5, Period: time.Second}})
		defer l.Close()
		start := time.Now()
		var mu sync.Mutex
		var admitted []time.Duration
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				d, err := l.Wait(ctx, Input{Rule: "crawl", Key: "site"})
				if err != nil || !d.Allowed {
					t.Errorf("Wait: %v, allowed %v", err, d.Allowed)
					return
				}
				mu.Lock()
				admitted = append(admitted, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(admitted) != 20 {
			t.Fatalf("%d admitted, want 20", len(admitted))
		}
		for _, a := range admitted {
			n := 0
			for _, b := range admitted {
				if b > a-time.Second && b <= a {
					n++
				}
			}
			if n > 5 {
				t.Fatalf("%d admitted in the second up to %v, want at most 5", n, a)
			}
		}
		last := slicesMax(admitted)
		// 20 at 5 per second: the last four rounds open at 1s, 2s, 3s;
		// jitter adds at most a quarter of each wait.
		if last < 3*time.Second || last > 5*time.Second {
			t.Errorf("the last waiter admitted after %v, want 3s..5s", last)
		}
		if p, _ := l.Peek(context.Background(), "crawl", "site"); p.Remaining != 5-countWithin(admitted, last) {
			t.Errorf("remaining %d after the waits: a wait consumed", p.Remaining)
		}
	})
}

func slicesMax(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// countWithin counts the admissions in the second up to at.
func countWithin(ds []time.Duration, at time.Duration) int64 {
	n := int64(0)
	for _, d := range ds {
		if d > at-time.Second {
			n++
		}
	}
	return n
}

// Wait gives up at once, without sleeping, when the retry would pass the
// context's deadline, and when the cost can never fit.
func TestWaitReturnsAtOnceItCannotMakeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "otp", Algorithm: SlidingLog, Limit: 1, Period: time.Minute}})
		defer l.Close()
		in := Input{Rule: "otp", Key: "+15550001111"}
		if d, err := l.Wait(context.Background(), in); err != nil || !d.Allowed {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		d, err := l.Wait(ctx, in)
		if !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.RetryAfter != time.Minute {
			t.Errorf("Wait past the deadline: %v, %+v", err, d)
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("Wait slept %v before giving up", took)
		}
		d, err = l.Wait(context.Background(), Input{Rule: "otp", Key: "other", Cost: 2})
		if err == nil || d.Allowed || time.Since(start) != 0 {
			t.Errorf("Wait for a cost past the limit: %v, %+v", err, d)
		}
	})
}

// A context cancelled while waiting ends the wait with its error.
func TestWaitEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "otp", Algorithm: SlidingLog, Limit: 1, Period: time.Minute}})
		defer l.Close()
		in := Input{Rule: "otp", Key: "k"}
		l.Wait(context.Background(), in)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Second, cancel)
		start := time.Now()
		if _, err := l.Wait(ctx, in); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait: %v, want context.Canceled", err)
		}
		if took := time.Since(start); took != 10*time.Second {
			t.Errorf("Wait returned after %v, want 10s", took)
		}
	})
}

// A failing backend is the fail mode's answer, given once: FailClosed's
// error, FailOpen's admission; never a loop of backend calls.
func TestWaitTakesTheFailModesAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, mode := range []FailMode{FailClosed, FailOpen} {
			b := &countingDown{}
			l := MustNew([]Rule{{Name: "api", Limit: 1, Period: time.Second}}, WithBackend(b), WithFailMode(mode), WithKeySecret([]byte("0123456789abcdef0123456789abcdef")))
			d, err := l.Wait(context.Background(), Input{Rule: "api", Key: "k"})
			switch mode {
			case FailClosed:
				var ue *UnavailableError
				if !errors.As(err, &ue) || d.Allowed {
					t.Errorf("FailClosed: %v, allowed %v; want an UnavailableError", err, d.Allowed)
				}
			case FailOpen:
				if err != nil || !d.Allowed {
					t.Errorf("FailOpen: %v, allowed %v; want admitted", err, d.Allowed)
				}
			}
			if n := b.calls(); n > 1 {
				t.Errorf("%v: %d backend calls, want at most 1", mode, n)
			}
			l.Close()
		}
	})
}

// countingDown is a shared backend that is down, counting the calls.
type countingDown struct {
	mu sync.Mutex
	n  int
}

func (b *countingDown) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	return nil, errors.New("connection refused")
}

func (b *countingDown) Reset(context.Context, ...string) error { return nil }

func (b *countingDown) calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// callTimes is a backend that notes when each call came.
type callTimes struct {
	backend.Backend
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
}

func (b *callTimes) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	b.mu.Lock()
	b.at = append(b.at, time.Since(b.start))
	b.mu.Unlock()
	return b.Backend.Decide(ctx, reqs)
}

// Waiters refused together do not all come back at one instant: each
// retries after the RetryAfter it was given, never before it, plus a
// jitter of at most a quarter of it.
func TestWaitJittersItsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		defer store.Close()
		b := &callTimes{Backend: store, start: time.Now()}
		l := MustNew([]Rule{{Name: "job", Algorithm: SlidingLog, Limit: 1, Period: 10 * time.Second}},
			WithBackend(b), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() { l.Wait(ctx, Input{Rule: "job", Key: "k"}) })
		}
		time.Sleep(13 * time.Second) // past every first retry
		cancel()
		wg.Wait()
		b.mu.Lock()
		defer b.mu.Unlock()
		retries := map[time.Duration]bool{}
		for _, at := range b.at[10:] {
			if at < 10*time.Second || at > 12500*time.Millisecond {
				t.Errorf("a retry at %v, want in 10s..12.5s", at)
			}
			retries[at] = true
		}
		if len(b.at) != 19 || len(retries) < 2 {
			t.Errorf("%d calls, retries at %d distinct instants; want 10 at 0 and 9 spread retries", len(b.at), len(retries))
		}
	})
}

// A retry due at the deadline itself is not waited for (ctx would be
// done by then); one due just before it is made, the jitter keeping it
// before the deadline.
func TestWaitAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "job", Algorithm: SlidingLog, Limit: 1, Period: time.Second}})
		defer l.Close()
		in := Input{Rule: "job", Key: "k"}
		l.Wait(context.Background(), in)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		if _, err := l.Wait(ctx, in); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 0 {
			t.Errorf("Wait for a retry at the deadline: %v after %v, want DeadlineExceeded at once", err, time.Since(start))
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second+time.Millisecond)
		defer cancel2()
		if d, err := l.Wait(ctx2, in); err != nil || !d.Allowed {
			t.Errorf("Wait with 1ms to spare: %v, allowed %v", err, d.Allowed)
		}
	})
}

// A SetLimit that raises the limit admits a waiter at once: it slept out
// the RetryAfter of the old limit, an hour under 1 per hour, though the
// raised limit had room.
func TestWaitWakesOnSetLimit_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "crawl", Algorithm: SlidingLog, Limit: 1, Period: time.Hour}}, WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		in := Input{Rule: "crawl", Key: "site"}
		if d, err := l.Decide(context.Background(), in); err != nil || !d.Allowed {
			t.Fatal(err, d.Allowed)
		}
		start := time.Now()
		time.AfterFunc(time.Minute, func() {
			if err := l.SetLimit("crawl", 2, 0); err != nil {
				t.Error(err)
			}
		})
		d, err := l.Wait(context.Background(), in)
		if err != nil || !d.Allowed {
			t.Fatalf("Wait: %v, allowed %v", err, d.Allowed)
		}
		if took := time.Since(start); took < time.Minute || took > time.Minute+maxWakeSpread {
			t.Errorf("Wait admitted after %v, want 1m (the raise) plus at most %v", took, maxWakeSpread)
		}
		if allowed(t, l, in) {
			t.Error("a third admitted under 2 per hour")
		}
	})
}

// The waiters a SetLimit wakes retry spread over maxWakeSpread, not all
// in one instant: a raise is no stampede on the backend.
func TestWaitWakesSpreadOnSetLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "crawl", Algorithm: SlidingLog, Limit: 1, Period: time.Hour}}, WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		in := Input{Rule: "crawl", Key: "site"}
		allowed(t, l, in)
		start := time.Now()
		time.AfterFunc(time.Minute, func() { l.SetLimit("crawl", 100, 0) })
		var mu sync.Mutex
		at := map[time.Duration]bool{}
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if d, err := l.Wait(context.Background(), in); err != nil || !d.Allowed {
					t.Errorf("Wait: %v, allowed %v", err, d.Allowed)
				}
				mu.Lock()
				at[time.Since(start)] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		for a := range at {
			if a < time.Minute || a > time.Minute+maxWakeSpread {
				t.Errorf("a waiter admitted after %v, want 1m..1m%v", a, maxWakeSpread)
			}
		}
		if len(at) < 2 {
			t.Errorf("20 waiters retried at %d instant(s) after the raise, want a spread", len(at))
		}
	})
}

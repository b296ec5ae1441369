package ceiling

import (
	"context"
	"errors"
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
	"go.uber.org/goleak"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func withClock(now func() time.Time) Option {
	return func(c *config) error {
		c.clock = now
		return nil
	}
}

// flaky is a remote backend that admits everything until told to fail, and
// counts its calls: the limiter's background probes apart from the rest.
// When block is set, calls wait on it or their context's end (a hung
// server) and announce themselves on entered.
type flaky struct {
	mu      sync.Mutex
	err     error
	calls   int
	probes  []time.Time // when each probe arrived
	block   chan struct{}
	entered chan struct{}
}

func isProbe(reqs []backend.Request) bool {
	return len(reqs) == 1 && strings.HasPrefix(reqs[0].Key, "ceiling-probe:")
}

func (f *flaky) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	f.mu.Lock()
	if isProbe(reqs) {
		f.probes = append(f.probes, time.Now())
	} else {
		f.calls++
	}
	err, block, entered := f.err, f.block, f.entered
	f.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (f *flaky) Reset(context.Context, ...string) error { return nil }

func (f *flaky) fail(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// callCount is how many calls other than probes the backend had.
func (f *flaky) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *flaky) probeTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.probes...)
}

// eventually polls cond every few milliseconds until it holds or a
// generous deadline passes (a loaded CI machine), and reports whether it
// held.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// logRecorder is a slog.Handler that keeps every record's level and
// message, for tests that count log lines.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, line)
	h.mu.Unlock()
	return nil
}

// count returns how many lines at level contain substr.
func (h *logRecorder) count(level slog.Level, substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, l := range h.lines {
		if strings.HasPrefix(l, level.String()+" ") && strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// recorder is an Observer that keeps what it is told.
type recorder struct {
	NopObserver
	mu        sync.Mutex
	decisions map[string]int // "rule outcome"
	failmodes map[string]int // "rule mode"
	backend   []error
	events    []DegradedEvent
}

func newRecorder() *recorder {
	return &recorder{decisions: map[string]int{}, failmodes: map[string]int{}}
}

func (o *recorder) ObserveDecision(rule string, out Outcome) {
	o.mu.Lock()
	o.decisions[rule+" "+out.String()]++
	o.mu.Unlock()
}

func (o *recorder) ObserveBackend(_ time.Duration, err error) {
	o.mu.Lock()
	o.backend = append(o.backend, err)
	o.mu.Unlock()
}

func (o *recorder) ObserveDegraded(e DegradedEvent) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func (o *recorder) ObserveFailMode(rule string, m FailMode) {
	o.mu.Lock()
	o.failmodes[rule+" "+m.String()]++
	o.mu.Unlock()
}

var errDown = fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", backend.ErrUnreachable)

func get(t *testing.T, h http.Handler) *httptest.ResponseRecorder {
	t.Helper()
	return serve(t, h, httptest.NewRequest("GET", "/", nil))
}

// The breaker's life: it opens after 5 consecutive failures and requests
// stop calling the backend; a background probe asks it instead, at an
// interval that doubles while it fails, capped; and the first answered
// probe closes the breaker without any request.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &flaky{}
		logs := &logRecorder{}
		var mu sync.Mutex
		var events []DegradedEvent
		const coolDown, maxCoolDown = 20 * time.Millisecond, 80 * time.Millisecond
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 100, Period: time.Minute}},
			WithBackend(be), WithFailMode(FailOpen), WithLogger(slog.New(logs)),
			WithBreaker(BreakerConfig{Failures: 5, CoolDown: coolDown, MaxCoolDown: maxCoolDown}),
			onDegraded(func(e DegradedEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }))
		defer l.Close()
		h := l.Handler(okHandler)

		get(t, h)
		be.fail(errDown)
		for i := range 4 {
			get(t, h)
			if got := l.Health().Status; got != "healthy" {
				t.Fatalf("after %d failures: %q, want healthy", i+1, got)
			}
		}
		get(t, h)
		if got := l.Health().Status; got != "degraded" {
			t.Fatalf("after 5 failures: %q, want degraded", got)
		}
		calls := be.callCount()
		for range 20 {
			if w := get(t, h); w.Code != http.StatusOK {
				t.Fatalf("status %d, want 200 (failing open)", w.Code)
			}
		}
		if got := be.callCount() - calls; got != 0 {
			t.Errorf("requests called the backend %d times through the open breaker", got)
		}
		if !eventually(func() bool { return len(be.probeTimes()) >= 5 }) {
			t.Fatalf("only %d background probes while degraded", len(be.probeTimes()))
		}
		// Timers never fire early: each gap is at least the jittered interval,
		// which doubles from the cool-down up to the cap.
		probes := be.probeTimes()
		interval := coolDown
		for i := 1; i < 5; i++ {
			interval = min(2*interval, maxCoolDown)
			if gap := probes[i].Sub(probes[i-1]); gap < interval*3/4 {
				t.Errorf("probe %d came %v after the previous one, want at least %v", i, gap, interval*3/4)
			}
		}
		if h := l.Health(); h.Reason != "unreachable" || h.NextProbeSeconds > maxCoolDown.Seconds() {
			t.Errorf("degraded report %+v: want reason unreachable and the next probe within %v", h, maxCoolDown)
		}

		be.fail(nil) // no request from now on
		if !eventually(func() bool { return l.Health().Status == "healthy" }) {
			t.Fatal("the backend answers again but the limiter stays degraded without traffic")
		}
		calls = be.callCount()
		for range 5 {
			get(t, h)
		}
		if got, want := be.callCount()-calls, 5; got != want {
			t.Errorf("after recovery: backend calls = %d, want %d", got, want)
		}
		// The prober reports the closing after the breaker closed: Health can
		// say healthy a moment before the event is delivered.
		eventually(func() bool { mu.Lock(); defer mu.Unlock(); return len(events) >= 2 })
		mu.Lock()
		defer mu.Unlock()
		if len(events) != 2 || !events[0].Degraded || events[1].Degraded {
			t.Fatalf("events = %+v, want one degraded then one healthy", events)
		}
		if !errors.Is(events[0].Cause, errDown) || events[0].Failures != 5 {
			t.Errorf("degraded event = %+v, want cause %v after 5 failures", events[0], errDown)
		}
		// Requests admitted unenforced while degraded: the one whose failure
		// opened the breaker and the 20 after it.
		if got, want := events[1].Unenforced, int64(1+20); got != want {
			t.Errorf("unenforced admissions while degraded = %d, want %d", got, want)
		}
		if got, want := logs.count(slog.LevelError, "backend degraded"), 1; got != want {
			t.Errorf("degraded logged %d times, want %d:\n%s", got, want, strings.Join(logs.lines, "\n"))
		}
		if got, want := logs.count(slog.LevelWarn, "healthy again"), 1; got != want {
			t.Errorf("recovery logged %d times, want %d", got, want)
		}
		if got, want := l.Health().DegradedTotal, int64(1); got != want {
			t.Errorf("DegradedTotal = %d, want %d", got, want)
		}
	})
}

// While degraded only the prober calls the backend, one probe at a time:
// requests never do, even while a probe hangs.
func TestBreakerProbesOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &flaky{}
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 100, Period: time.Minute}},
			WithBackend(be), WithFailMode(FailOpen), WithLogger(slog.New(&logRecorder{})),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond}), WithTimeout(time.Hour))
		defer l.Close()
		h := l.Handler(okHandler)
		release, entered := make(chan struct{}), make(chan struct{}, 10)
		be.mu.Lock()
		be.err, be.block, be.entered = errDown, release, entered
		be.mu.Unlock()
		go close(release) // the opening call itself must return
		get(t, h)         // opens
		<-entered         // the opening call
		release = make(chan struct{})
		be.mu.Lock()
		be.err, be.block = nil, release
		be.mu.Unlock()
		<-entered // a probe is inside the backend, and hangs there
		for range 10 {
			if w := get(t, h); w.Code != 200 {
				t.Fatalf("request during the probe: status %d", w.Code)
			}
		}
		time.Sleep(20 * time.Millisecond) // twenty probe intervals, virtual
		synctest.Wait()
		if got := len(entered); got != 0 {
			t.Errorf("%d more calls entered the backend while a probe was in flight", got)
		}
		if got, want := be.callCount(), 1; got != want {
			t.Errorf("request calls = %d, want %d (the opening failure only)", got, want)
		}
		be.mu.Lock()
		be.block, be.entered = nil, nil
		be.mu.Unlock()
		close(release)
		if !eventually(func() bool { return l.Health().Status == "healthy" }) {
			t.Fatal("the answered probe did not close the breaker")
		}
		get(t, h)
		if got, want := be.callCount(), 2; got != want {
			t.Errorf("after the probe answered: request calls = %d, want %d", got, want)
		}
	})
}

// A hung backend cannot hold a request past the timeout: the middleware's
// deadline ends the call and the fail mode applies; the probe the timeout
// starts is bounded too.
func TestTimeoutHoldsWhenTheBackendHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		be := &flaky{block: release}
		obs := newRecorder()
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1, Period: time.Minute, FailMode: FailClosed}},
			WithBackend(be), WithTimeout(10*time.Millisecond), WithObserver(obs), WithLogger(slog.New(&logRecorder{})))
		defer l.Close()
		done := make(chan *httptest.ResponseRecorder)
		go func() {
			w := httptest.NewRecorder()
			l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			done <- w
		}()
		select {
		case w := <-done:
			if w.Code != http.StatusServiceUnavailable {
				t.Errorf("status %d, want 503", w.Code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the request waited for a hung backend")
		}
		time.Sleep(confirmBudget) // virtual: the probe the timeout started times out too
		synctest.Wait()
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if len(obs.backend) != 2 || !errors.Is(obs.backend[0], ErrTimeout) || !errors.Is(obs.backend[1], ErrTimeout) {
			t.Errorf("observed backend errors %v, want two timeouts: the request's and its probe's", obs.backend)
		}
	})
}

// Fail closed answers 503 with Retry-After set to when the backend will be
// tried again, distinct from a 429, and never leaks the cause.
func TestFailClosedRetryAfterFollowsTheBreaker(t *testing.T) {
	clk := newFakeClock()
	be := &flaky{err: errDown}
	l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 3, Period: time.Minute}},
		WithBackend(be), WithFailMode(FailClosed), withClock(clk.Now), WithLogger(slog.New(&logRecorder{})),
		WithBreaker(BreakerConfig{Failures: 1, CoolDown: 8 * time.Second}))
	defer l.Close()
	w := get(t, l.Handler(okHandler))
	if w.Code != 503 || w.Header().Get("Content-Type") != "application/problem+json" || strings.Contains(w.Body.String(), "refused") {
		t.Fatalf("got %d %q %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if got := w.Header().Get("Retry-After"); got < "6" || got > "8" || len(got) != 1 {
		t.Errorf("Retry-After = %q, want the jittered cool-down, 6 to 8", got)
	}
	clk.Advance(7500 * time.Millisecond)
	if got, want := get(t, l.Handler(okHandler)).Header().Get("Retry-After"), "1"; got != want {
		t.Errorf("later Retry-After = %q, want %q", got, want)
	}
}

// Isolated failures, below the breaker's threshold, are logged sampled at
// warn: loud, not one line per request.
func TestIsolatedFailuresAreLoggedSampled(t *testing.T) {
	clk := newFakeClock()
	be := &flaky{}
	logs := &logRecorder{}
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 100, Period: time.Minute}},
		WithBackend(be), WithFailMode(FailOpen), withClock(clk.Now), WithLogger(slog.New(logs)))
	defer l.Close()
	h := l.Handler(okHandler)
	for range 10 { // fail, succeed: never 5 in a row
		be.fail(errDown)
		get(t, h)
		be.fail(nil)
		get(t, h)
	}
	if got, want := logs.count(slog.LevelWarn, "backend call failed"), 1; got != want {
		t.Errorf("warn lines = %d, want %d", got, want)
	}
	clk.Advance(time.Minute)
	be.fail(errDown)
	get(t, h)
	if got, want := logs.count(slog.LevelWarn, "occurrences=10"), 1; got != want {
		t.Errorf("second sampled line should stand for the 9 held back and itself:\n%s", strings.Join(logs.lines, "\n"))
	}
	if got := l.Health().Status; got != "healthy" {
		t.Errorf("isolated failures made the limiter %s", got)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1, Period: time.Second}}, WithBackend(&flaky{}))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFailureOptionsAreValidated(t *testing.T) {
	ok := []Rule{{Name: "r", Key: RemoteAddr, Limit: 1, Period: time.Second}}
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithFailMode(FailMode(9)), "unknown mode"},
		{WithInstances(0), "WithInstances(0)"},
		{WithBreaker(BreakerConfig{Failures: -1}), "negative"},
		{WithBreaker(BreakerConfig{CoolDown: time.Minute, MaxCoolDown: time.Second}), "MaxCoolDown"},
		{WithObserver(nil), "WithObserver(nil)"},
	} {
		if _, err := New(ok, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want it to mention %q", err, tc.want)
		}
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the default store New made is closed
	odd := []Rule{{Name: "odd", Key: RemoteAddr, Limit: 1, Period: time.Second, FailMode: FailMode(7)}}
	if _, err := New(odd); err == nil || !strings.Contains(err.Error(), `rule "odd": unknown fail mode 7`) {
		t.Errorf("a rule with an unknown fail mode: err = %v", err)
	}
}

// FailLocal on the real memory store: while the backend is down the rule
// still holds, at its share.
func TestFailLocalOnTheMemoryStore(t *testing.T) {
	for _, alg := range backend.Algorithms() {
		l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 4, Period: time.Hour, Algorithm: alg}},
			WithBackend(&flaky{err: errDown}), WithInstances(2), WithLogger(slog.New(&logRecorder{})))
		h := l.Handler(okHandler)
		want := []int{200, 200, 429, 429}
		var got []int
		var last *httptest.ResponseRecorder
		for range want {
			last = get(t, h)
			got = append(got, last.Code)
		}
		if !sameInts(got, want) {
			t.Errorf("%v: statuses = %v, want %v", alg, got, want)
		}
		if last.Header().Get("Retry-After") == "" || !strings.Contains(last.Header().Get("RateLimit"), `"otp";r=0`) {
			t.Errorf("%v: local 429 without its state: %v", alg, last.Header())
		}
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestCheckPassesOnTheMemoryStore(t *testing.T) {
	var rules []Rule
	for i, alg := range backend.Algorithms() {
		rules = append(rules, Rule{Name: alg.String() + strings.Repeat("x", i), Key: RemoteAddr, Limit: 5, Period: time.Second, Algorithm: alg})
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l := MustNew(rules)
	defer l.Close() // stops the default store's janitor
	if err := l.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The settlement after the handler is a backend call too: a hung backend
// cannot hold the request past the timeout there either.
func TestSettlementIsBoundedByTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		be := &flaky{}
		logs := &logRecorder{}
		l := MustNew([]Rule{{Name: "tokens", Key: RemoteAddr, Limit: 1000, Period: time.Minute,
			Estimate: func(*http.Request) (int64, error) { return 10, nil }}},
			WithBackend(be), WithTimeout(10*time.Millisecond), WithLogger(slog.New(logs)))
		defer l.Close()
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			be.mu.Lock()
			be.block = release // the backend hangs from now on
			be.mu.Unlock()
			if err := Settle(r, "tokens", 40); err != nil {
				t.Error(err)
			}
		}))
		done := make(chan int)
		go func() { done <- get(t, h).Code }()
		select {
		case code := <-done:
			if code != 200 {
				t.Errorf("status %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the settlement waited for a hung backend")
		}
		if got := logs.count(slog.LevelError, "settlement failed"); got != 1 {
			t.Errorf("settlement failures logged %d times, want 1", got)
		}
		synctest.Wait() // the resend of the settlement (named by a Once) has gone
		if got, want := be.callCount(), 3; got != want {
			t.Errorf("backend calls %d, want %d (decision, settlement, its first resend)", got, want)
		}
	})
}

// slowDecisions is a remote backend whose decisions all time out; its
// probes answer (a healthy Redis behind a process too busy to read its
// replies in time) unless frozen (a Redis that answers nothing).
type slowDecisions struct {
	frozen bool
}

func (s *slowDecisions) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if isProbe(reqs) && !s.frozen {
		return []backend.Result{{Allowed: true, Limit: reqs[0].Limit, Remaining: reqs[0].Limit - 1}}, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *slowDecisions) Reset(context.Context, ...string) error { return nil }

// A timeout is not the backend's fault until a probe, with a budget of its
// own, confirms it: until then a FailOpen rule is shed (503, counted),
// never admitted unmetered, and FailLocal decides locally. A probe that
// the backend answers keeps the breaker closed however many timeouts come
// (a CPU-flooded process on a healthy Redis); one that fails too opens it,
// and the fail modes apply in full (a frozen Redis), within the timeout
// plus the probe's budget.
func TestTimeoutsOpenTheBreakerOnlyOnceAProbeConfirmsThem(t *testing.T) {
	for _, frozen := range []bool{false, true} {
		t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var transitions []DegradedEvent
				on := func(path string) KeyFunc {
					return func(r *http.Request) (string, error) {
						if r.URL.Path != path {
							return "", ErrNoKey
						}
						return "k", nil
					}
				}
				l := MustNew([]Rule{
					{Name: "chat", Key: on("/"), Limit: 100, Period: time.Minute, FailMode: FailOpen},
					{Name: "otp", Key: on("/otp"), Limit: 2, Period: time.Minute, FailMode: FailLocal},
				}, WithBackend(&slowDecisions{frozen: frozen}), WithTimeout(100*time.Millisecond),
					WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}), WithLogger(slog.New(slog.DiscardHandler)),
					onDegraded(func(e DegradedEvent) { transitions = append(transitions, e) }))
				defer l.Close()
				h := l.Handler(okHandler)
				otp := func() int { return serve(t, h, httptest.NewRequest("GET", "/otp", nil)).Code }
				var codes []int
				for range 5 {
					w := get(t, h)
					if w.Header().Get("Retry-After") != "1" {
						t.Errorf("a shed request's Retry-After %q, want 1", w.Header().Get("Retry-After"))
					}
					codes = append(codes, w.Code)
				}
				if want := []int{503, 503, 503, 503, 503}; !sameInts(codes, want) {
					t.Errorf("FailOpen on unconfirmed timeouts: %v, want %v (shed)", codes, want)
				}
				if got, want := []int{otp(), otp(), otp()}, []int{200, 200, 429}; !sameInts(got, want) {
					t.Errorf("FailLocal on unconfirmed timeouts: %v, want %v (decided locally)", got, want)
				}
				time.Sleep(confirmBudget) // virtual: the probe's budget runs out
				synctest.Wait()
				hl := l.Health()
				if hl.Shed != 5 || hl.Rules[0].FailOpenAdmissions != 0 {
					t.Errorf("%d shed, %d failed open; want 5 and 0", hl.Shed, hl.Rules[0].FailOpenAdmissions)
				}
				if !frozen {
					if hl.Status != "healthy" || len(transitions) != 0 {
						t.Errorf("probes answered: %q with %d transitions, want healthy and none", hl.Status, len(transitions))
					}
					if got := get(t, h).Code; got != 503 {
						t.Errorf("the next timeout: %d, want 503 (shed again)", got)
					}
					return
				}
				if hl.Status != "degraded" || len(transitions) != 1 {
					t.Fatalf("the probe failed too: %q with %d transitions, want degraded, once", hl.Status, len(transitions))
				}
				start := time.Now()
				if got := get(t, h).Code; got != 200 || time.Since(start) != 0 {
					t.Errorf("with the breaker open: %d after %v, want 200 (failing open) at once", got, time.Since(start))
				}
			})
		})
	}
}

// slowProbes is a remote backend whose decisions all time out and whose
// probes answer after delay, within the confirming probe's budget but
// past the timeout: a Redis too slow for the timeout. A call that runs out
// of budget fails as the Redis store judges it by its sockets: silent (a
// plain timeout, the backend's fault), or with a reply waiting unread
// ([backend.ErrUnread], this process's) when unread is set.
type slowProbes struct {
	delay  time.Duration
	unread bool
}

func (s *slowProbes) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if isProbe(reqs) {
		select {
		case <-time.After(s.delay):
			return []backend.Result{{Allowed: true, Limit: reqs[0].Limit, Remaining: reqs[0].Limit - 1}}, nil
		case <-ctx.Done():
		}
	} else {
		<-ctx.Done()
	}
	if s.unread {
		return nil, fmt.Errorf("%w: %w", backend.ErrUnread, ctx.Err())
	}
	return nil, ctx.Err()
}

func (s *slowProbes) Reset(context.Context, ...string) error { return nil }

// A probe that the backend answers, but later than the timeout, confirms
// that the backend is too slow for the timeout, unless the backend judges
// the delay this process's: the canary goes again at the timeout, and a
// backend that stays silent through it opens the breaker (every fail mode
// applies) within the probe's answer plus the timeout, while one whose
// reply waits to be read gives no verdict, and FailOpen stays shed.
func TestSlowProbeConfirmsTimeoutsUnlessTheReplyWaitsUnread(t *testing.T) {
	for _, unread := range []bool{false, true} {
		t.Run(fmt.Sprintf("unread=%v", unread), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var transitions int
				l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 100, Period: time.Minute, FailMode: FailOpen}},
					WithBackend(&slowProbes{delay: 250 * time.Millisecond, unread: unread}), WithTimeout(100*time.Millisecond),
					WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}), WithLogger(slog.New(slog.DiscardHandler)),
					onDegraded(func(DegradedEvent) { transitions++ }))
				defer l.Close()
				h := l.Handler(okHandler)
				var codes []int
				for range 3 {
					codes = append(codes, get(t, h).Code)
				}
				if want := []int{503, 503, 503}; !sameInts(codes, want) {
					t.Errorf("FailOpen on unconfirmed timeouts: %v, want %v (shed)", codes, want)
				}
				time.Sleep(confirmBudget) // virtual: both canaries have gone
				synctest.Wait()
				hl := l.Health()
				if unread {
					if hl.Status != "healthy" || transitions != 0 {
						t.Errorf("the slow probe's reply waits unread: %q with %d transitions, want healthy and none", hl.Status, transitions)
					}
					if got := get(t, h).Code; got != 503 {
						t.Errorf("the next timeout: %d, want 503 (shed again)", got)
					}
					return
				}
				if hl.Status != "degraded" || transitions != 1 {
					t.Fatalf("a probe answered 250ms late, its canary again silent past the timeout: %q with %d transitions, want degraded, once", hl.Status, transitions)
				}
				if got := get(t, h).Code; got != 200 {
					t.Errorf("with the breaker open: %d, want 200 (failing open)", got)
				}
			})
		})
	}
}

// slowThenBack is a remote backend whose decisions time out while slow is
// set and whose probes always answer; it records the forced charges it
// applies.
type slowThenBack struct {
	mu     sync.Mutex
	slow   bool
	forced []backend.Request
}

func (s *slowThenBack) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	s.mu.Lock()
	slow := s.slow && !isProbe(reqs)
	for _, q := range reqs {
		if q.Force && !slow {
			s.forced = append(s.forced, q)
		}
	}
	s.mu.Unlock()
	if slow {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (s *slowThenBack) Reset(context.Context, ...string) error { return nil }

// What FailLocal admitted on timeouts that no probe confirmed reaches the
// backend once it answers, and an answered probe starts the hand-over, as
// a recovery does: the other instances may have seen the same timeouts
// confirmed and decided locally meanwhile.
func TestUnconfirmedTimeoutsHandOverAndChargeWhatFailLocalAdmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &slowThenBack{slow: true}
		l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 10, Period: time.Minute, FailMode: FailLocal}},
			WithBackend(be), WithInstances(2), WithTimeout(100*time.Millisecond),
			WithBreaker(BreakerConfig{Failures: 3}), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(okHandler)
		if got, want := []int{get(t, h).Code, get(t, h).Code}, []int{200, 200}; !sameInts(got, want) {
			t.Fatalf("FailLocal on unconfirmed timeouts: %v, want %v", got, want)
		}
		synctest.Wait() // the probe the first timeout started has answered
		if !l.inHandOver() || l.Health().Status != "healthy" {
			t.Errorf("after an answered probe: hand-over %v, %q; want the hand-over, healthy", l.inHandOver(), l.Health().Status)
		}
		be.mu.Lock()
		be.slow = false
		be.mu.Unlock()
		time.Sleep(l.cfg.breaker.MaxCoolDown + l.cfg.timeout) // virtual: past the hand-over
		get(t, h)                                             // answered by the backend
		synctest.Wait()
		be.mu.Lock()
		defer be.mu.Unlock()
		if len(be.forced) != 1 || be.forced[0].Cost != 2 {
			t.Errorf("forced charges %+v, want one of the 2 units FailLocal admitted", be.forced)
		}
	})
}

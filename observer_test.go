package ceiling

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// counting is a small exact in-process store: each key admits Limit units
// in total (time never passes), all or nothing. Enough to tell admitted
// from rejected without depending on a real store's clock.
type counting struct {
	mu     sync.Mutex
	used   map[string]int64
	calls  int
	remote bool
}

func newCounting() *counting { return &counting{used: map[string]int64{}} }

func (c *counting) InProcess() bool { return !c.remote }

func (c *counting) DecideInto(_ context.Context, reqs []backend.Request, out []backend.Result) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	blocked := false
	for i, r := range reqs {
		used := c.used[r.Key]
		ok := r.Force || used+r.Cost <= r.Limit
		out[i] = backend.Result{Allowed: ok, Limit: r.Limit, Remaining: max(0, r.Limit-used-r.Cost)}
		if !ok {
			out[i].Remaining = r.Limit - used
			out[i].RetryAfter = time.Second
			blocked = blocked || !r.Shadow
		}
	}
	if !blocked {
		for i, r := range reqs {
			if out[i].Allowed {
				c.used[r.Key] += r.Cost
			}
		}
	}
	return nil
}

func (c *counting) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, c.DecideInto(ctx, reqs, out)
}

func (c *counting) Reset(_ context.Context, keys ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.used, k)
	}
	return nil
}

func (c *counting) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.used {
		n += v
	}
	return n
}

func withLocalStore(b backend.Backend) Option {
	return func(c *config) error {
		c.localStore = b
		return nil
	}
}

func codes(t *testing.T, h http.Handler, n int) []int {
	t.Helper()
	out := make([]int, n)
	for i := range out {
		out[i] = get(t, h).Code
	}
	return out
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Each rule falls back by its own mode and the request needs every rule's
// fallback to admit it: closed wins (503, nothing counted locally), then
// local (429 when its share is spent), then open.
func TestMixedFailModesPerRule(t *testing.T) {
	rule := func(name string, m FailMode, shadow bool) Rule {
		return Rule{Name: name, Key: RemoteAddr, Limit: 4, Period: time.Minute, FailMode: m, Shadow: shadow}
	}
	for _, tc := range []struct {
		name       string
		rules      []Rule
		want       []int
		wantLocal  int64 // units the local store holds afterwards
		wantCounts map[string]int
	}{
		{"open only", []Rule{rule("a", FailOpen, false)}, []int{200, 200, 200, 200, 200}, 0,
			map[string]int{"a open": 5}},
		{"local: its half of 4", []Rule{rule("b", FailLocal, false)}, []int{200, 200, 429, 429, 429}, 2,
			map[string]int{"b local": 2}},
		{"open and local: local bounds the request", []Rule{rule("a", FailOpen, false), rule("b", FailLocal, false)},
			[]int{200, 200, 429, 429, 429}, 2, map[string]int{"a open": 2, "b local": 2}},
		{"closed wins over local and open", []Rule{rule("a", FailOpen, false), rule("b", FailLocal, false), rule("c", FailClosed, false)},
			[]int{503, 503, 503}, 0, map[string]int{}},
		{"a shadow rule failing closed refuses nothing", []Rule{rule("a", FailOpen, false), rule("s", FailClosed, true)},
			[]int{200, 200, 200}, 0, map[string]int{"a open": 3}},
		{"a shadow rule failing local is reported, never blocks", []Rule{rule("b", FailLocal, false), rule("s", FailLocal, true)},
			[]int{200, 200, 429}, 4, map[string]int{"b local": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local, obs := newCounting(), newRecorder()
			l := MustNew(tc.rules, WithBackend(&flaky{err: errDown}), WithFailMode(FailOpen), WithInstances(2),
				withLocalStore(local), WithObserver(obs), WithLogger(slog.New(&logRecorder{})))
			defer l.Close()
			if got := codes(t, l.Handler(okHandler), len(tc.want)); !sameInts(got, tc.want) {
				t.Errorf("statuses = %v, want %v", got, tc.want)
			}
			if got := local.total(); got != tc.wantLocal {
				t.Errorf("local store holds %d units, want %d", got, tc.wantLocal)
			}
			if len(obs.failmodes) != len(tc.wantCounts) {
				t.Errorf("fail-mode admissions = %v, want %v", obs.failmodes, tc.wantCounts)
			}
			for k, v := range tc.wantCounts {
				if obs.failmodes[k] != v {
					t.Errorf("fail-mode admissions %q = %d, want %d", k, obs.failmodes[k], v)
				}
			}
		})
	}
}

// A local share never makes a request's own cost unfittable, and
// WithInstances sizes the default share.
func TestLocalShare(t *testing.T) {
	for _, tc := range []struct {
		share            float64
		wantLim, wantBur int64
	}{
		{1, 10, 4},
		{0.5, 5, 3}, // burst 2 would not fit the cost of 3
		{0.25, 3, 3},
		{0.01, 3, 3},
	} {
		got := localRequest(backend.Request{Limit: 10, Burst: 4, Cost: 3}, tc.share)
		if got.Limit != tc.wantLim || got.Burst != tc.wantBur {
			t.Errorf("share %v: limit %d burst %d, want %d %d", tc.share, got.Limit, got.Burst, tc.wantLim, tc.wantBur)
		}
	}
	local := newCounting()
	l := MustNew([]Rule{{Name: "r", Key: RemoteAddr, Limit: 9, Period: time.Minute}},
		WithBackend(&flaky{err: errDown}), WithInstances(3), withLocalStore(local), WithLogger(slog.New(&logRecorder{})))
	defer l.Close()
	if got, want := codes(t, l.Handler(okHandler), 4), []int{200, 200, 200, 429}; !sameInts(got, want) {
		t.Errorf("9 per minute over 3 instances, failing local: %v, want %v", got, want)
	}
}

func TestFailLocalIsTheDefault(t *testing.T) {
	l := MustNew([]Rule{{Name: "r", Key: RemoteAddr, Limit: 1, Period: time.Minute}},
		WithBackend(&flaky{err: errDown}), withLocalStore(newCounting()), WithLogger(slog.New(&logRecorder{})))
	defer l.Close()
	if got, want := codes(t, l.Handler(okHandler), 2), []int{200, 429}; !sameInts(got, want) {
		t.Errorf("statuses = %v, want %v", got, want)
	}
	if got := l.Health().FailMode; got != "local" {
		t.Errorf("fail mode %q", got)
	}
}

func TestObserverSeesDecisionsAndBackendCalls(t *testing.T) {
	be := &scripted{answers: map[string]backend.Result{
		"s": {Allowed: false, Limit: 1, RetryAfter: time.Second},
	}}
	obs := newRecorder()
	l := MustNew([]Rule{
		{Name: "a", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "s", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
		{Name: "u", Key: headerKey("X-User"), Limit: 1, Period: time.Minute},
	}, WithBackend(be), WithObserver(obs), WithLogger(slog.New(&logRecorder{})))
	defer l.Close()
	h := l.Handler(okHandler)
	get(t, h)
	get(t, h)
	be.answers["a"] = backend.Result{Allowed: false, Limit: 10, RetryAfter: time.Second}
	if w := get(t, h); w.Code != 429 {
		t.Fatalf("status %d", w.Code)
	}
	want := map[string]int{"a allowed": 2, "a rejected": 1, "s shadow_rejected": 3}
	if len(obs.decisions) != len(want) {
		t.Errorf("decisions = %v, want %v", obs.decisions, want)
	}
	for k, v := range want {
		if obs.decisions[k] != v {
			t.Errorf("decisions[%q] = %d, want %d", k, obs.decisions[k], v)
		}
	}
	if len(obs.backend) != 3 || obs.backend[0] != nil {
		t.Errorf("backend observations = %v, want 3 answered calls", obs.backend)
	}
}

func TestShadowReporting(t *testing.T) {
	clk := newFakeClock()
	be := &scripted{answers: map[string]backend.Result{
		"otp:new": {Allowed: false, Limit: 1, RetryAfter: time.Minute},
		"otp:try": {Allowed: false, Limit: 1, RetryAfter: time.Minute},
	}}
	rules := []Rule{
		{Name: "otp:ip", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "otp:new", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
		{Name: "otp:ok", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
		{Name: "otp:try", Key: RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
	}
	logs := &logRecorder{}
	l := MustNew(rules, WithBackend(be), WithShadowHeader(), withClock(clk.Now), WithLogger(slog.New(logs)))
	defer l.Close()
	w := get(t, l.Handler(okHandler))
	if w.Code != 200 {
		t.Fatalf("status %d: a shadow rule refused", w.Code)
	}
	if got, want := w.Header().Get("RateLimit-Shadow"), `"otp:new", "otp:try"`; got != want {
		t.Errorf("RateLimit-Shadow = %q, want %q", got, want)
	}
	if !sfList.MatchString(w.Header().Get("RateLimit-Shadow")) {
		t.Errorf("RateLimit-Shadow is not a structured field list")
	}
	quiet := MustNew(rules, WithBackend(be), WithLogger(slog.New(&logRecorder{})))
	if got := get(t, quiet.Handler(okHandler)).Header().Get("RateLimit-Shadow"); got != "" {
		t.Errorf("RateLimit-Shadow sent without WithShadowHeader: %q", got)
	}

	for range 4 {
		get(t, l.Handler(okHandler))
	}
	if got, want := logs.count(slog.LevelInfo, "rule=otp:new requests=1"), 1; got != want {
		t.Errorf("first sampled line: %d, want %d:\n%s", got, want, strings.Join(logs.lines, "\n"))
	}
	if got, want := logs.count(slog.LevelInfo, "shadow rule would have rejected"), 2; got != want {
		t.Errorf("shadow lines in the first interval = %d, want %d (one per rule)", got, want)
	}
	clk.Advance(10 * time.Second)
	get(t, l.Handler(okHandler))
	if got, want := logs.count(slog.LevelInfo, "rule=otp:new requests=5"), 1; got != want {
		t.Errorf("the next interval's line should stand for 5 requests:\n%s", strings.Join(logs.lines, "\n"))
	}
	if got, want := l.Health().Rules[1].ShadowRejections, int64(6); got != want {
		t.Errorf("shadow rejections reported = %d, want %d", got, want)
	}
}

func TestHealthHandler(t *testing.T) {
	clk := newFakeClock()
	be := &flaky{}
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(be), WithFailMode(FailOpen), withClock(clk.Now), WithLogger(slog.New(&logRecorder{})),
		WithBreaker(BreakerConfig{Failures: 2, CoolDown: 5 * time.Second}))
	defer l.Close()
	h := l.Handler(okHandler)
	check := func(wantCode int, wantStatus, wantReason string) Health {
		t.Helper()
		w := get(t, l.HealthHandler())
		var got Health
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatalf("health body: %v: %s", err, w.Body)
		}
		if w.Code != wantCode || got.Status != wantStatus || string(got.Reason) != wantReason || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("health = %d %+v, want %d %q with reason %q", w.Code, got, wantCode, wantStatus, wantReason)
		}
		if strings.Contains(w.Body.String(), "127.0.0.1") || strings.Contains(w.Body.String(), "refused") {
			t.Errorf("the public health body repeats the error: %s", w.Body)
		}
		return got
	}
	get(t, h)
	check(200, "healthy", "")
	be.fail(errDown)
	get(t, h)
	get(t, h)
	got := check(503, "degraded", "unreachable")
	if got.NextProbeSeconds > 5 || got.NextProbeSeconds < 3.75 || !got.Since.Equal(clk.Now()) || got.Backend != "remote" || got.Rules[0].FailOpenAdmissions != 2 {
		t.Errorf("degraded report = %+v", got)
	}
	if got.DegradedTotal != 1 {
		t.Errorf("DegradedTotal = %d, want 1", got.DegradedTotal)
	}
}

// The public reason is the kind of failure, whatever the error says; the
// log has the whole error.
func TestHealthReasonIsTheKindOnly(t *testing.T) {
	secret := `deciding key "otp:phone:7B-u1Ox5FO9uZgEGSVBHqQ" on 10.0.0.7:6379 (script 3f2a9c)`
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: dial tcp 10.0.0.7:6379: %s", backend.ErrUnreachable, secret), "unreachable"},
		{fmt.Errorf("%w: NOAUTH Authentication required; %s", backend.ErrAuth, secret), "auth"},
		{fmt.Errorf("%w: READONLY You can't write against a read only replica; %s", backend.ErrReadOnly, secret), "read-only"},
		{fmt.Errorf("%w: OOM command not allowed; %s", backend.ErrOutOfMemory, secret), "out of memory"},
		{fmt.Errorf("%w after 100ms: %s", ErrTimeout, secret), "timeout"},
		{fmt.Errorf("%s: %w", secret, context.DeadlineExceeded), "timeout"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, "unreachable"},
		{fmt.Errorf("%s: %w", secret, syscall.ECONNRESET), "unreachable"},
		{errors.New(secret), "error"},
	} {
		logs := &logRecorder{}
		l := MustNew([]Rule{{Name: "otp:phone", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
			WithBackend(&flaky{err: tc.err}), WithFailMode(FailOpen), WithLogger(slog.New(logs)),
			WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}))
		get(t, l.Handler(okHandler))
		if isTimeout(tc.err) && !eventually(func() bool { return l.Health().Status == "degraded" }) {
			t.Errorf("%v: not degraded once the probe confirmed the timeout", tc.err)
		}
		w := get(t, l.HealthHandler())
		var h Health
		if err := json.Unmarshal(w.Body.Bytes(), &h); err != nil {
			t.Fatal(err)
		}
		if string(h.Reason) != tc.want || strings.Contains(w.Body.String(), "7B-u1Ox") || strings.Contains(w.Body.String(), "10.0.0.7") {
			t.Errorf("%v: health body %s, want reason %q and nothing of the error", tc.err, w.Body, tc.want)
		}
		// The line follows the state it reports: wait for it, as for the state.
		if strings.Contains(tc.err.Error(), "7B-u1Ox") && !eventually(func() bool { return logs.count(slog.LevelError, "7B-u1Ox") == 1 }) {
			t.Errorf("%v: the degraded log line does not carry the whole error", tc.err)
		}
		l.Close()
	}
}

// Declaring several instances on an in-process backend is a warning at
// start-up and in the health report, not a failure.
func TestInProcessBackendWithInstancesWarns(t *testing.T) {
	logs := &logRecorder{}
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(newCounting()), WithInstances(4), WithLogger(slog.New(logs)))
	defer l.Close()
	if got, want := logs.count(slog.LevelWarn, "per instance"), 1; got != want {
		t.Errorf("start-up warnings = %d, want %d", got, want)
	}
	w := get(t, l.HealthHandler())
	var h Health
	json.Unmarshal(w.Body.Bytes(), &h)
	if w.Code != 200 || h.Status != "healthy" || !slices.ContainsFunc(h.Warnings, func(s string) bool { return strings.Contains(s, "4 times") }) {
		t.Errorf("health = %d %+v, want 200 with the warning", w.Code, h)
	}
	single := &logRecorder{}
	MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}}, WithBackend(newCounting()), WithLogger(slog.New(single)))
	if n := len(single.lines); n != 0 {
		t.Errorf("one instance logged %v", single.lines)
	}
}

func TestCheckProvesTheBackendRejects(t *testing.T) {
	rules := []Rule{
		{Name: "a", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "b", Key: RemoteAddr, Limit: 10, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "c", Key: RemoteAddr, Limit: 10, Period: time.Minute, Algorithm: SlidingLog},
	}
	good := newCounting()
	if err := MustNew(rules, WithBackend(good)).Check(context.Background()); err != nil {
		t.Errorf("a backend that enforces failed the check: %v", err)
	}
	if good.calls != 2*2 || good.total() != 0 {
		t.Errorf("check made %d calls and left %d units, want 4 calls (2 algorithms) and nothing", good.calls, good.total())
	}

	err := MustNew(rules, WithBackend(&scripted{})).Check(context.Background())
	if !errors.Is(err, ErrNotEnforcing) || !strings.Contains(err.Error(), "rolling_window") {
		t.Errorf("a backend that admits everything: err = %v, want ErrNotEnforcing naming the algorithm", err)
	}
	err = MustNew(rules, WithBackend(&flaky{err: errDown})).Check(context.Background())
	if !errors.Is(err, errDown) || !strings.Contains(err.Error(), "did not decide") {
		t.Errorf("a backend that is down: err = %v", err)
	}
	if err := MustNew(rules, WithBackend(rejectAll{})).Check(context.Background()); err == nil || !strings.Contains(err.Error(), "under its limit") {
		t.Errorf("a backend that rejects everything: err = %v", err)
	}
	release := make(chan struct{})
	defer close(release)
	hung := MustNew(rules, WithBackend(&flaky{block: release}), WithTimeout(5*time.Millisecond))
	if err := hung.Check(context.Background()); !errors.Is(err, ErrTimeout) {
		t.Errorf("a hung backend: err = %v, want a timeout", err)
	}
	// Cleaning the canaries up is bounded too, even if Reset hangs.
	stuck := resetHangs{counting: &counting{used: map[string]int64{}, remote: true}, release: release}
	done := make(chan error)
	go func() {
		done <- MustNew(rules, WithBackend(stuck), WithTimeout(5*time.Millisecond)).Check(context.Background())
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("an enforcing backend whose Reset hangs: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Check waited for a hung Reset")
	}
}

// rejectAll is a backend that refuses every request.
type rejectAll struct{}

func (rejectAll) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	return make([]backend.Result, len(reqs)), nil
}

func (rejectAll) Reset(context.Context, ...string) error { return nil }

// resetHangs enforces limits but hangs in Reset until release is closed
// or its context ends.
type resetHangs struct {
	*counting
	release chan struct{}
}

func (r resetHangs) Reset(ctx context.Context, _ ...string) error {
	select {
	case <-r.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// onDegraded is the observer option that calls fn on each transition
// between healthy and degraded.
func onDegraded(fn func(DegradedEvent)) Option { return WithObserver(degradedHook{fn: fn}) }

type degradedHook struct {
	NopObserver
	fn func(DegradedEvent)
}

func (d degradedHook) ObserveDegraded(e DegradedEvent) { d.fn(e) }

// WithObserver given twice tells both observers everything, in order: a
// pager beside the metrics, with no second hook to learn.
func TestEveryObserverIsTold(t *testing.T) {
	var order []string
	var mu sync.Mutex
	pager := func(name string) Option {
		return onDegraded(func(e DegradedEvent) {
			mu.Lock()
			order = append(order, fmt.Sprintf("%s %v", name, e.Degraded))
			mu.Unlock()
		})
	}
	obs := newRecorder()
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 10, Period: time.Minute}},
		WithBackend(&flaky{err: errDown}), WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Hour}), pager("first"), WithObserver(obs), pager("second"))
	defer l.Close()
	get(t, l.Handler(okHandler))
	mu.Lock()
	got := strings.Join(order, ", ")
	mu.Unlock()
	if want := "first true, second true"; got != want {
		t.Errorf("transitions observed: %q, want %q", got, want)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.failmodes["ip open"] != 1 || len(obs.events) != 1 {
		t.Errorf("the observer between them saw fail-mode admissions %v and %d transitions, want ip open once and one", obs.failmodes, len(obs.events))
	}
}

type configRecorder struct {
	NopObserver
	got []observedConfig
}

// observedConfig is what one ObserveConfig call was told.
type observedConfig struct {
	Rules   []string
	Timeout time.Duration
	Health  func() Health
}

func (c *configRecorder) ObserveConfig(rules []string, timeout time.Duration, health func() Health) {
	c.got = append(c.got, observedConfig{rules, timeout, health})
}

// An observer learns the rules and the timeout a remote backend's
// calls are bounded by, once; an in-process backend has no timeout.
func TestObserverIsToldTheRulesAndTheTimeout(t *testing.T) {
	rules := []Rule{
		{Name: "chat:minute", Key: RemoteAddr, Limit: 3, Period: time.Minute},
		{Name: "chat:day", Key: RemoteAddr, Limit: 100, Period: 24 * time.Hour},
	}
	remote := newCounting()
	remote.remote = true
	for _, tc := range []struct {
		name    string
		opts    []Option
		timeout time.Duration
	}{
		{"remote", []Option{WithBackend(remote), WithTimeout(250 * time.Millisecond)}, 250 * time.Millisecond},
		{"remote default", []Option{WithBackend(remote)}, defaultTimeout},
		{"in process", []Option{WithBackend(newCounting()), WithTimeout(250 * time.Millisecond)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &configRecorder{}
			l := MustNew(rules, append(tc.opts, WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))...)
			defer l.Close()
			if len(obs.got) != 1 {
				t.Fatalf("ObserveConfig called %d times, want once", len(obs.got))
			}
			c := obs.got[0]
			if want := []string{"chat:minute", "chat:day"}; !slices.Equal(c.Rules, want) {
				t.Errorf("rules = %q, want %q", c.Rules, want)
			}
			if c.Timeout != tc.timeout {
				t.Errorf("timeout = %v, want %v", c.Timeout, tc.timeout)
			}
		})
	}
}

type callCounter struct {
	NopObserver
	mu            sync.Mutex
	calls, cached int
}

func (c *callCounter) ObserveBackend(time.Duration, error) { c.mu.Lock(); c.calls++; c.mu.Unlock() }

type cacheCounter struct{ *callCounter }

func (c cacheCounter) ObserveCached() { c.mu.Lock(); c.cached++; c.mu.Unlock() }

// An answer from the deny cache is not a backend call: its latency would
// hide a slow backend's quantiles. It is counted apart, for an observer
// that counts it.
func TestCachedAnswersAreNotBackendCalls(t *testing.T) {
	rules := []Rule{{Name: "ip", Key: RemoteAddr, Limit: 100, Period: time.Minute}}
	for _, asks := range []bool{true, false} {
		be := &denyCached{spent: "no key starts so"}
		counts := &callCounter{}
		var obs Observer = counts
		if asks {
			obs = cacheCounter{counts}
		}
		l := MustNew(rules, WithBackend(be), WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))
		h := l.Handler(okHandler)
		if got, want := codes(t, h, 3), []int{200, 200, 200}; !sameInts(got, want) {
			t.Fatalf("statuses = %v, want %v", got, want)
		}
		be.mu.Lock()
		be.spent = "" // every key is in the deny cache
		be.mu.Unlock()
		if got, want := codes(t, h, 2), []int{429, 429}; !sameInts(got, want) {
			t.Fatalf("statuses = %v, want %v", got, want)
		}
		l.Close()
		counts.mu.Lock()
		calls, cached := counts.calls, counts.cached
		counts.mu.Unlock()
		if calls != 3 {
			t.Errorf("observer counting cached answers %v: backend calls observed = %d, want 3", asks, calls)
		}
		if want := map[bool]int{true: 2, false: 0}[asks]; cached != want {
			t.Errorf("observer counting cached answers %v: cached answers observed = %d, want %d", asks, cached, want)
		}
	}
}

type requestKey struct{}

// breakable is a memory store behind the bare Backend contract, as a
// remote backend would be, that fails once broken.
type breakable struct {
	store  *memory.Store
	broken atomic.Bool
}

func (b *breakable) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if b.broken.Load() {
		return nil, errors.New("dial tcp 127.0.0.1:1: connection refused")
	}
	return b.store.Decide(ctx, reqs)
}

func (b *breakable) Reset(ctx context.Context, keys ...string) error {
	return b.store.Reset(ctx, keys...)
}

// requestRecorder notes, for each ObserveRequest, the request's context
// value, whether it was admitted, the first rejecting rule and the error.
type requestRecorder struct {
	NopObserver
	mu   sync.Mutex
	seen []string
}

func (o *requestRecorder) ObserveRequest(ctx context.Context, d *Decision, err error) {
	s, _ := ctx.Value(requestKey{}).(string)
	switch {
	case err != nil:
		var ue *UnavailableError
		if errors.As(err, &ue) {
			s += " unavailable:" + ue.Rule
		} else {
			s += " error"
		}
	case d.Allowed:
		s += " admitted"
	default:
		s += " rejected:" + d.Rejected().Rule.Name
	}
	o.mu.Lock()
	o.seen = append(o.seen, s)
	o.mu.Unlock()
}

// Every observer is told of each decided request once, with the
// request's own context (where its span is) and the decision: admitted,
// rejected, and refused failing closed.
func TestObserveRequestGetsTheRequestsContext(t *testing.T) {
	be := &breakable{store: memory.New()}
	t.Cleanup(func() { be.store.Close() })
	a, b := &requestRecorder{}, &requestRecorder{}
	l := MustNew([]Rule{
		{Name: "minute", Key: Static("k"), Limit: 2, Period: time.Minute},
		{Name: "pay", Key: Static("k"), Limit: 100, Period: time.Minute, FailMode: FailClosed},
	}, WithBackend(be), WithObserver(a), WithObserver(b), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 100, CoolDown: time.Hour}))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	send := func(id string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), requestKey{}, id))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	var codes []int
	for _, id := range []string{"r1", "r2", "r3"} {
		codes = append(codes, send(id))
	}
	be.broken.Store(true)
	codes = append(codes, send("r4"))
	if want := []int{200, 200, 429, 503}; !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	want := []string{"r1 admitted", "r2 admitted", "r3 rejected:minute", "r4 unavailable:pay"}
	for name, o := range map[string]*requestRecorder{"first": a, "second": b} {
		if !slices.Equal(o.seen, want) {
			t.Errorf("%s observer saw %q, want %q", name, o.seen, want)
		}
	}
}

// A dashboard adds a rule's outcomes to get the requests it decided, and
// reads its allowed outcomes as what it was charged for. A rule that had
// room in a request another rule refused was charged nothing: it is
// not_charged, never allowed (issue 15: 30 "allowed" for a day rule while
// 15 requests were admitted).
func TestOutcomesSumToRequestsPerRule(t *testing.T) {
	store := newCounting()
	obs := newRecorder()
	l := MustNew([]Rule{
		{Name: "chat:minute", Key: RemoteAddr, Limit: 3, Period: time.Minute},
		{Name: "chat:day", Key: RemoteAddr, Limit: 100, Period: 24 * time.Hour},
		{Name: "chat:new", Key: RemoteAddr, Limit: 2, Period: time.Minute, Shadow: true},
	}, WithBackend(store), WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	const requests = 10
	if got, want := codes(t, l.Handler(okHandler), requests), []int{200, 200, 200, 429, 429, 429, 429, 429, 429, 429}; !sameInts(got, want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	want := map[string]int{
		"chat:minute allowed": 3, "chat:minute rejected": 7,
		"chat:day allowed": 3, "chat:day not_charged": 7,
		// The shadow rule fits twice, then would have refused every request.
		"chat:new allowed": 2, "chat:new shadow_rejected": 8,
	}
	for k, v := range want {
		if got := obs.decisions[k]; got != v {
			t.Errorf("decisions[%q] = %d, want %d (all: %v)", k, got, v, obs.decisions)
		}
	}
	perRule := map[string]int{}
	allowed := 0
	for k, n := range obs.decisions {
		var rule, outcome string
		for i := len(k) - 1; i >= 0; i-- {
			if k[i] == ' ' {
				rule, outcome = k[:i], k[i+1:]
				break
			}
		}
		perRule[rule] += n
		if outcome == OutcomeAllowed.String() {
			allowed += n
		}
	}
	for _, r := range []string{"chat:minute", "chat:day", "chat:new"} {
		if got := perRule[r]; got != requests {
			t.Errorf("outcomes of %s sum to %d, want one per request: %d", r, got, requests)
		}
	}
	// Each allowed outcome is one unit consumed in the store, no more.
	if got, want := store.total(), int64(allowed); got != want {
		t.Errorf("units consumed = %d, allowed outcomes = %d", got, want)
	}
}

func TestOutcomeLabels(t *testing.T) {
	for o, want := range map[Outcome]string{
		OutcomeAllowed: "allowed", OutcomeRejected: "rejected",
		OutcomeShadowRejected: "shadow_rejected", OutcomeNotCharged: "not_charged",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d) = %q, want %q", o, got, want)
		}
	}
}

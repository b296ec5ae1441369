package ceilingprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var ok = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

func get(h http.Handler) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	return w.Code
}

// requestsHelp is the requests counter's help text.
const requestsHelp = "Requests each rule decided, by result: allowed (admitted and charged by the backend), rejected, shadow_rejected (a shadow rule that would have rejected), not_charged (the rule had room but another rule rejected the request), fail_open (admitted unlimited: the backend could not decide and the rule fails open), fail_local (admitted by this instance's own store: the rule fails local), fail_closed (refused with 503: the rule fails closed and the backend could not decide) or shed (refused with 503: this process was too busy to ask the backend; counted on the request's first enforced rule)."

func TestDecisionsByRuleAndOutcome(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	store := memory.New()
	defer store.Close()
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: ceiling.SlidingLog},
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Hour, Algorithm: ceiling.SlidingLog, Shadow: true},
		{Name: "day", Key: ceiling.RemoteAddr, Limit: 100, Period: 24 * time.Hour},
	}, ceiling.WithBackend(store), ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	h := l.Handler(ok)
	var codes []int
	for range 4 {
		codes = append(codes, get(h))
	}
	if got, want := codes, []int{200, 200, 200, 429}; !equal(got, want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	want := `
# HELP ceiling_rate_limiting_requests_total ` + requestsHelp + `
# TYPE ceiling_rate_limiting_requests_total counter
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="day"} 3
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="ip"} 3
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="new"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="not_charged",ceiling_rate_limiting_rule="day"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="rejected",ceiling_rate_limiting_rule="ip"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="shadow_rejected",ceiling_rate_limiting_rule="new"} 3
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want), "ceiling_rate_limiting_requests_total"); err != nil {
		t.Error(err)
	}
	// The memory store is in process: its calls are timed too, never failed.
	if got, want := testutil.CollectAndCount(obs, "ceiling_rate_limiting_backend_duration_seconds"), 1; got != want {
		t.Errorf("histogram series = %d, want %d", got, want)
	}
}

// flaky fails while down is set, hangs while hang is, and rejects from its
// deny cache while cached is.
type flaky struct {
	mu     sync.Mutex
	down   bool
	hang   bool
	cached bool
}

func (f *flaky) set(down, hang bool) {
	f.mu.Lock()
	f.down, f.hang = down, hang
	f.mu.Unlock()
}

func (f *flaky) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	f.mu.Lock()
	down, hang := f.down, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if down {
		return nil, fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connect: connection refused", backend.ErrUnreachable)
	}
	out := make([]backend.Result, len(reqs))
	f.mu.Lock()
	cached := f.cached
	f.mu.Unlock()
	if cached {
		for i, r := range reqs {
			out[i] = backend.Result{Limit: r.Limit, RetryAfter: time.Second, Cached: true}
		}
		return out, nil
	}
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (f *flaky) Reset(context.Context, ...string) error { return nil }

func TestDegradationErrorsAndFailModeAdmissions(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	be := &flaky{}
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "shop", Key: ceiling.Static("s"), Limit: 100, Period: time.Minute, FailMode: ceiling.FailLocal},
	}, ceiling.WithBackend(be), ceiling.WithObserver(obs), ceiling.WithTimeout(5*time.Millisecond),
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 3, CoolDown: time.Hour}),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(ok)
	get(h)
	be.set(false, true) // hung: one timeout, shed (no probe has confirmed it)
	get(h)
	// The timeout started a probe, which times out too on the hung
	// backend and so confirms that the backend is at fault.
	waitCalls(t, obs, 3)
	be.set(true, false) // refused: two errors open the breaker
	get(h)
	get(h)
	degraded := `
# HELP ceiling_rate_limiting_degraded 1 while the backend is not called (circuit breaker open) and fail modes decide, else 0.
# TYPE ceiling_rate_limiting_degraded gauge
ceiling_rate_limiting_degraded{limiter="api"} 1
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(degraded), "ceiling_rate_limiting_degraded"); err != nil {
		t.Error(err)
	}
	for range 5 { // the breaker is open: no backend calls
		get(h)
	}
	want := `
# HELP ceiling_rate_limiting_backend_errors_total Backend calls that failed, by kind (ceiling.KindOf): overloaded (never sent: this process was too busy, the request was shed with 503), unreachable, timeout, auth, read-only, out of memory or error.
# TYPE ceiling_rate_limiting_backend_errors_total counter
ceiling_rate_limiting_backend_errors_total{error_type="auth",limiter="api"} 0
ceiling_rate_limiting_backend_errors_total{error_type="error",limiter="api"} 0
ceiling_rate_limiting_backend_errors_total{error_type="out of memory",limiter="api"} 0
ceiling_rate_limiting_backend_errors_total{error_type="overloaded",limiter="api"} 0
ceiling_rate_limiting_backend_errors_total{error_type="read-only",limiter="api"} 0
ceiling_rate_limiting_backend_errors_total{error_type="timeout",limiter="api"} 2
ceiling_rate_limiting_backend_errors_total{error_type="unreachable",limiter="api"} 2
# HELP ceiling_rate_limiting_fail_mode_admissions_total Rule admissions decided by a fail mode instead of the backend: open (not enforced) or local (enforced per instance).
# TYPE ceiling_rate_limiting_fail_mode_admissions_total counter
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="local",ceiling_rate_limiting_rule="chat",limiter="api"} 0
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="local",ceiling_rate_limiting_rule="shop",limiter="api"} 7
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="open",ceiling_rate_limiting_rule="chat",limiter="api"} 7
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="open",ceiling_rate_limiting_rule="shop",limiter="api"} 0
# HELP ceiling_rate_limiting_degraded_transitions_total Transitions from healthy to degraded.
# TYPE ceiling_rate_limiting_degraded_transitions_total counter
ceiling_rate_limiting_degraded_transitions_total{limiter="api"} 1
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want),
		"ceiling_rate_limiting_backend_errors_total", "ceiling_rate_limiting_fail_mode_admissions_total", "ceiling_rate_limiting_degraded_transitions_total"); err != nil {
		t.Error(err)
	}
	// Each rule counts each request once: the first as allowed, the seven
	// its fail mode admitted as fail_open or fail_local, never as allowed,
	// which would count unmetered admissions with the backend's; the shed
	// request counts once, as shed on its first enforced rule.
	requests := `
# HELP ceiling_rate_limiting_requests_total ` + requestsHelp + `
# TYPE ceiling_rate_limiting_requests_total counter
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="chat",limiter="api"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="shop",limiter="api"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="fail_closed",ceiling_rate_limiting_rule="chat",limiter="api"} 0
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="fail_closed",ceiling_rate_limiting_rule="shop",limiter="api"} 0
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="fail_local",ceiling_rate_limiting_rule="shop",limiter="api"} 7
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="fail_open",ceiling_rate_limiting_rule="chat",limiter="api"} 7
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="shed",ceiling_rate_limiting_rule="chat",limiter="api"} 1
ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="shed",ceiling_rate_limiting_rule="shop",limiter="api"} 0
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(requests), "ceiling_rate_limiting_requests_total"); err != nil {
		t.Error(err)
	}
	// Five calls were made, none while open: four for requests (one
	// answered, three failed) and the probe.
	if got := histogramCount(t, obs); got != 5 {
		t.Errorf("backend calls observed = %d, want 5", got)
	}
}

// Each failed call is counted under its kind, as the health report names
// it: a refused connection, the limiter's timeout, a refused password, a
// read-only replica, a full server, or any other error; one that timed out
// while go-redis was still failing to dial is unreachable, its root cause.
func TestBackendErrorsByKind(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	for _, err := range []error{
		fmt.Errorf("deciding: %w: dial tcp: connection refused", backend.ErrUnreachable),
		fmt.Errorf("%w after 100ms: %w", ceiling.ErrTimeout, context.DeadlineExceeded),
		fmt.Errorf("%w after 100ms: %w: dial tcp: connection refused", ceiling.ErrTimeout, backend.ErrUnreachable),
		fmt.Errorf("%w: WRONGPASS invalid username-password pair", backend.ErrAuth),
		fmt.Errorf("%w: READONLY You can't write against a read only replica", backend.ErrReadOnly),
		fmt.Errorf("%w: OOM command not allowed when used memory > 'maxmemory'", backend.ErrOutOfMemory),
		fmt.Errorf("%w: OOM command not allowed when used memory > 'maxmemory'", backend.ErrOutOfMemory),
		errors.New("ERR unknown command"),
	} {
		obs.ObserveBackend(time.Millisecond, err)
	}
	want := `
# HELP ceiling_rate_limiting_backend_errors_total Backend calls that failed, by kind (ceiling.KindOf): overloaded (never sent: this process was too busy, the request was shed with 503), unreachable, timeout, auth, read-only, out of memory or error.
# TYPE ceiling_rate_limiting_backend_errors_total counter
ceiling_rate_limiting_backend_errors_total{error_type="auth"} 1
ceiling_rate_limiting_backend_errors_total{error_type="error"} 1
ceiling_rate_limiting_backend_errors_total{error_type="out of memory"} 2
ceiling_rate_limiting_backend_errors_total{error_type="overloaded"} 0
ceiling_rate_limiting_backend_errors_total{error_type="read-only"} 1
ceiling_rate_limiting_backend_errors_total{error_type="timeout"} 1
ceiling_rate_limiting_backend_errors_total{error_type="unreachable"} 2
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want), "ceiling_rate_limiting_backend_errors_total"); err != nil {
		t.Error(err)
	}
}

// The series the alerts watch exist before anything happens, at zero:
// increase() cannot see a counter's first value, so a fail-open burst that
// created its series would never alert. The timeout is the limiter's own,
// and absent for an in-process backend (nothing is timed out there).
func TestAlertedSeriesStartAtZero(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
	}, ceiling.WithBackend(&flaky{}), ceiling.WithObserver(obs), ceiling.WithTimeout(250*time.Millisecond),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	want := `
# HELP ceiling_rate_limiting_backend_errors_total Backend calls that failed, by kind (ceiling.KindOf): overloaded (never sent: this process was too busy, the request was shed with 503), unreachable, timeout, auth, read-only, out of memory or error.
# TYPE ceiling_rate_limiting_backend_errors_total counter
ceiling_rate_limiting_backend_errors_total{error_type="auth"} 0
ceiling_rate_limiting_backend_errors_total{error_type="error"} 0
ceiling_rate_limiting_backend_errors_total{error_type="out of memory"} 0
ceiling_rate_limiting_backend_errors_total{error_type="overloaded"} 0
ceiling_rate_limiting_backend_errors_total{error_type="read-only"} 0
ceiling_rate_limiting_backend_errors_total{error_type="timeout"} 0
ceiling_rate_limiting_backend_errors_total{error_type="unreachable"} 0
# HELP ceiling_rate_limiting_backend_timeout_seconds The backend call timeout (ceiling.WithTimeout) of the limiters observed, the smallest if several; absent for in-process backends, which are never timed out.
# TYPE ceiling_rate_limiting_backend_timeout_seconds gauge
ceiling_rate_limiting_backend_timeout_seconds 0.25
# HELP ceiling_rate_limiting_fail_mode_admissions_total Rule admissions decided by a fail mode instead of the backend: open (not enforced) or local (enforced per instance).
# TYPE ceiling_rate_limiting_fail_mode_admissions_total counter
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="local",ceiling_rate_limiting_rule="chat"} 0
ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="open",ceiling_rate_limiting_rule="chat"} 0
`
	names := []string{"ceiling_rate_limiting_backend_errors_total", "ceiling_rate_limiting_backend_timeout_seconds", "ceiling_rate_limiting_fail_mode_admissions_total"}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// A second limiter on the same observer with a shorter timeout: the
	// alert must compare with the shortest.
	l2 := ceiling.MustNew([]ceiling.Rule{{Name: "otp", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}},
		ceiling.WithBackend(&flaky{}), ceiling.WithObserver(obs), ceiling.WithTimeout(50*time.Millisecond),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l2.Close()
	shorter := `
# HELP ceiling_rate_limiting_backend_timeout_seconds The backend call timeout (ceiling.WithTimeout) of the limiters observed, the smallest if several; absent for in-process backends, which are never timed out.
# TYPE ceiling_rate_limiting_backend_timeout_seconds gauge
ceiling_rate_limiting_backend_timeout_seconds 0.05
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(shorter), "ceiling_rate_limiting_backend_timeout_seconds"); err != nil {
		t.Error(err)
	}

	inproc := ceilingprom.New(ceilingprom.Options{})
	l3 := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}},
		ceiling.WithObserver(inproc), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l3.Close()
	if got := testutil.CollectAndCount(inproc, "ceiling_rate_limiting_backend_timeout_seconds"); got != 0 {
		t.Errorf("an in-process limiter exports %d timeout series, want none", got)
	}
}

// Deny-cache answers are counted as hits, not as backend calls whose
// near-zero latency would hide a slow backend.
func TestDenyCacheHits(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	be := &flaky{}
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute}},
		ceiling.WithBackend(be), ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(ok)
	get(h)
	be.mu.Lock()
	be.cached = true
	be.mu.Unlock()
	if got := get(h); got != 429 {
		t.Fatalf("status %d, want 429 from the deny cache", got)
	}
	get(h)
	want := `
# HELP ceiling_rate_limiting_deny_cache_hits_total Decisions answered in process by the backend's deny cache (keys known to be over their limit), without a backend call; not counted as backend calls.
# TYPE ceiling_rate_limiting_deny_cache_hits_total counter
ceiling_rate_limiting_deny_cache_hits_total 2
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want), "ceiling_rate_limiting_deny_cache_hits_total"); err != nil {
		t.Error(err)
	}
	if got := histogramCount(t, obs); got != 1 {
		t.Errorf("backend calls observed = %d, want 1", got)
	}
}

// histogram_quantile never exceeds the highest finite bucket bound, so the
// latency alert (p99 above 80% of the timeout) is blind to a timeout past
// it: the default buckets reach ceiling's default timeout (100 ms) and timeouts up to 10s.
func TestDefaultBucketsReachTheTimeout(t *testing.T) {
	highest := ceilingprom.DefaultBuckets[len(ceilingprom.DefaultBuckets)-1]
	for _, timeout := range []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second} {
		if highest < timeout.Seconds() {
			t.Errorf("the highest bucket, %vs, is below a timeout of %v", highest, timeout)
		}
	}
	if !slices.IsSorted(ceilingprom.DefaultBuckets) {
		t.Errorf("DefaultBuckets are not sorted: %v", ceilingprom.DefaultBuckets)
	}
}

func TestMetricNamesFollowConventions(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	obs.ObserveDecision("r", ceiling.OutcomeAllowed)
	obs.ObserveBackend(time.Millisecond, errors.New("x"))
	obs.ObserveFailMode("r", ceiling.FailOpen)
	obs.ObserveCached()
	problems, err := testutil.CollectAndLint(obs)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(obs); err != nil {
		t.Errorf("registering: %v", err)
	}
}

func histogramCount(t *testing.T, obs *ceilingprom.Observer) uint64 {
	t.Helper()
	m := series(t, obs, "ceiling_rate_limiting_backend_duration_seconds")
	if len(m) == 0 {
		t.Fatal("no ceiling_rate_limiting_backend_duration_seconds")
	}
	return m[0].GetHistogram().GetSampleCount()
}

func equal(a, b []int) bool {
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

// Keys the memory store evicted while they held spent units are counted,
// from zero: a fresh-key flood past the key bound gives callers quota back.
func TestEvictedKeys(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	store := memory.New(memory.WithMaxKeys(64), memory.WithSweepInterval(0), memory.WithLogger(slog.New(slog.DiscardHandler)))
	defer store.Close()
	l := ceiling.MustNew([]ceiling.Rule{{Name: "otp", Limit: 3, Period: 15 * time.Minute}},
		ceiling.WithBackend(store), ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	want := func(n uint64) string {
		return fmt.Sprintf(`
# HELP ceiling_rate_limiting_evicted_keys_total Keys an in-process store (the memory backend, FailLocal's store) evicted while they held spent units, to stay under its key bound: each gave a caller quota back.
# TYPE ceiling_rate_limiting_evicted_keys_total counter
ceiling_rate_limiting_evicted_keys_total %d
`, n)
	}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want(0)), "ceiling_rate_limiting_evicted_keys_total"); err != nil {
		t.Error(err)
	}
	for i := range 1000 {
		if _, err := l.Decide(context.Background(), ceiling.Input{Rule: "otp", Key: fmt.Sprint("+4475", i)}); err != nil {
			t.Fatal(err)
		}
	}
	n := store.Evictions()
	if n == 0 {
		t.Fatal("the flood evicted nothing")
	}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want(n)), "ceiling_rate_limiting_evicted_keys_total"); err != nil {
		t.Error(err)
	}
}

// The slots a limiter's concurrency rules hold are a gauge per rule, read
// from its health at each scrape, and add up across the limiters an
// observer serves; a rate rule's is 0.
func TestConcurrencySlotsInUse(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	rules := []ceiling.Rule{
		{Name: "jobs", Limit: 5, Period: time.Minute, Algorithm: ceiling.Concurrency},
		{Name: "calls", Limit: 100, Period: time.Minute},
	}
	var ls []*ceiling.Limiter
	for range 2 {
		l := ceiling.MustNew(rules, ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		ls = append(ls, l)
	}
	want := func(jobs int) string {
		return fmt.Sprintf(`
# HELP ceiling_rate_limiting_concurrency_slots_in_use Units of a Concurrency rule's limit this process holds now, for requests it admitted that have not ended (ceiling.RuleHealth.SlotsInUse); 0 for rate rules.
# TYPE ceiling_rate_limiting_concurrency_slots_in_use gauge
ceiling_rate_limiting_concurrency_slots_in_use{ceiling_rate_limiting_rule="calls"} 0
ceiling_rate_limiting_concurrency_slots_in_use{ceiling_rate_limiting_rule="jobs"} %d
`, jobs)
	}
	var ds []ceiling.Decision
	for _, cost := range []int64{2, 1} { // 2 on one limiter, 1 on the other
		d, err := ls[len(ds)].Decide(context.Background(), ceiling.Input{Rule: "jobs", Key: "tenant", Cost: cost})
		if err != nil || !d.Allowed {
			t.Fatalf("refused under the limit (%v)", err)
		}
		ds = append(ds, d)
	}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want(3)), "ceiling_rate_limiting_concurrency_slots_in_use"); err != nil {
		t.Error(err)
	}
	for _, d := range ds {
		d.Release()
	}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want(0)), "ceiling_rate_limiting_concurrency_slots_in_use"); err != nil {
		t.Error(err)
	}
}

// waitCalls waits, on real time since the limiter's probe runs on it, until
// obs has observed n backend calls.
func waitCalls(t *testing.T, obs *ceilingprom.Observer, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); histogramCount(t, obs) < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // the probe's budget runs on real time
	}
}

// A scrape that sees a failed call in the duration histogram sees its
// error too: the error is counted first. A reader racing a writer of
// failed calls never finds more calls than errors.
func TestAFailedCallIsNeverSeenBeforeItsError(t *testing.T) {
	obs := ceilingprom.New(ceilingprom.Options{})
	refused := fmt.Errorf("%w: connection refused", backend.ErrUnreachable)
	const calls = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range calls {
			obs.ObserveBackend(time.Millisecond, refused)
		}
	}()
	for seen := uint64(0); seen < calls; {
		seen = histogramCount(t, obs)
		if errs := errorsTotal(t, obs); errs < seen {
			t.Fatalf("%d calls in the histogram, %v errors counted", seen, errs)
		}
	}
	<-done
}

// errorsTotal is ceiling_rate_limiting_backend_errors_total over its kinds.
func errorsTotal(t *testing.T, obs *ceilingprom.Observer) uint64 {
	t.Helper()
	var n float64
	for _, m := range series(t, obs, "ceiling_rate_limiting_backend_errors_total") {
		n += m.GetCounter().GetValue()
	}
	return uint64(n)
}

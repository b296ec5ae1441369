package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ceiling-go/ceiling/backend"
)

// Decide and the middleware are one path: the same rule and key value is
// one budget, whichever way it is spent.
func TestDecideSharesTheMiddlewaresBudget(t *testing.T) {
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: SlidingLog}})
	defer l.Close()
	ctx := context.Background()
	for i := range 2 {
		d, err := l.Decide(ctx, Input{Rule: "ip", Key: "192.0.2.1"})
		if err != nil || !d.Allowed {
			t.Fatalf("Decide %d: %+v, %v", i, d, err)
		}
		if got, want := d.Results[0].Remaining, int64(2-i); got != want {
			t.Errorf("Decide %d: remaining %d, want %d", i, got, want)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:4711"
	h := l.Handler(okHandler)
	if got, want := serve(t, h, r).Code, 200; got != want {
		t.Fatalf("third unit over HTTP: %d, want %d", got, want)
	}
	d, err := l.Decide(ctx, Input{Rule: "ip", Key: "192.0.2.1"})
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("fourth unit through Decide: %+v, %v; want a rejection with a wait", d, err)
	}
	if rr := d.Rejected(); rr == nil || rr.Rule.Name != "ip" {
		t.Errorf("Rejected() = %+v, want rule ip", rr)
	}
	if got, want := serve(t, h, r).Code, 429; got != want {
		t.Errorf("fifth unit over HTTP: %d, want %d", got, want)
	}
}

// One backend call per Decide, all or nothing, with results in declaration
// order whatever the order of the inputs.
func TestDecideIsOneCallAllOrNothing(t *testing.T) {
	be := newCounting()
	be.remote = true
	l := MustNew([]Rule{
		{Name: "minute", Limit: 2, Period: time.Minute},
		{Name: "day", Limit: 100, Period: 24 * time.Hour},
	}, WithBackend(be))
	defer l.Close()
	ctx := context.Background()
	var got []bool
	for range 4 {
		d, err := l.Decide(ctx, Input{Rule: "day", Key: "shop-1"}, Input{Rule: "minute", Key: "shop-1"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Results[0].Rule.Name != "minute" || d.Results[1].Rule.Name != "day" {
			t.Fatalf("results %s, %s: want declaration order", d.Results[0].Rule.Name, d.Results[1].Rule.Name)
		}
		got = append(got, d.Allowed)
	}
	if want := []bool{true, true, false, false}; !slices.Equal(got, want) {
		t.Errorf("admissions %v, want %v", got, want)
	}
	if got, want := be.calls, 4; got != want {
		t.Errorf("backend calls %d, want %d", got, want)
	}
	if got, want := be.total(), int64(4); got != want {
		t.Errorf("units stored %d, want %d: a refused call must consume from no rule", got, want)
	}
}

// A wrong input is an error naming the rule, and nothing reaches the
// backend.
func TestDecideRefusesBadInputs(t *testing.T) {
	be := &scripted{}
	l := MustNew([]Rule{
		{Name: "a", Limit: 5, Period: time.Minute},
		{Name: "b", Limit: 5, Period: time.Minute, Algorithm: GCRA},
	}, WithBackend(be), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	for _, tc := range []struct {
		name   string
		inputs []Input
		want   string
	}{
		{"unknown rule", []Input{{Rule: "a", Key: "k"}, {Rule: "nope", Key: "k"}}, `rule "nope": not declared`},
		{"twice", []Input{{Rule: "a", Key: "k"}, {Rule: "a", Key: "j"}}, `rule "a": decided twice`},
		{"empty key", []Input{{Rule: "b"}}, `rule "b": empty key`},
		{"negative cost", []Input{{Rule: "a", Key: "k", Cost: -1}}, `rule "a": negative cost`},
		{"limit too large", []Input{{Rule: "a", Key: "k", Limit: backend.MaxLimit + 1}}, `rule "a": limit for this call`},
		{"negative burst", []Input{{Rule: "b", Key: "k", Burst: -2}}, `rule "b": limit for this call`},
	} {
		d, err := l.Decide(context.Background(), tc.inputs...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
		if d.Allowed {
			t.Errorf("%s: a refused call reports Allowed", tc.name)
		}
	}
	if _, err := l.Decide(context.Background(), Input{Rule: "a"}); !errors.Is(err, errEmptyKey) {
		t.Errorf("empty key: %v, want errEmptyKey", err)
	}
	if n := be.callCount(); n != 0 {
		t.Errorf("backend called %d times for bad inputs", n)
	}
	if d, err := l.Decide(context.Background()); err != nil || !d.Allowed || be.callCount() != 0 {
		t.Errorf("no inputs: %+v, %v, %d calls; want admitted without a call", d, err, be.callCount())
	}
}

// A per-call limit and burst replace the rule's in the one backend call,
// and FailLocal scales the call's limit, not the rule's.
func TestDecideLimitOverride(t *testing.T) {
	be := &scripted{}
	l := MustNew([]Rule{
		{Name: "plan", Limit: 10, Period: time.Minute, Burst: 10, Algorithm: GCRA},
		{Name: "ip", Limit: 100, Period: time.Minute},
	}, WithBackend(be))
	defer l.Close()
	// Burst is GCRA's: on the ip rule (the default RollingWindow) a per-call
	// burst would be silently dropped, so it is refused.
	if _, err := l.Decide(context.Background(), Input{Rule: "ip", Key: "a", Burst: 5}); err == nil || !strings.Contains(err.Error(), "Burst is GCRA's") {
		t.Errorf("a burst on a rolling-window rule: %v, want an error", err)
	}
	if _, err := l.Decide(context.Background(), Input{Rule: "plan", Key: "tenant", Limit: 100, Burst: 20, Cost: 3}, Input{Rule: "ip", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	if len(be.calls) != 1 || len(be.calls[0]) != 2 {
		t.Fatalf("calls %v, want one call of two requests", be.calls)
	}
	got := be.calls[0][0]
	if got.Limit != 100 || got.Burst != 20 || got.Cost != 3 || got.Period != time.Minute {
		t.Errorf("plan request %+v, want limit 100 burst 20 cost 3 over a minute", got)
	}
	if ip := be.calls[0][1]; ip.Limit != 100 || ip.Burst != 0 || ip.Cost != 1 {
		t.Errorf("ip request %+v, want the rule's own limit and cost 1", ip)
	}

	local := newCounting()
	down := MustNew([]Rule{{Name: "plan", Limit: 10, Period: time.Minute}},
		WithBackend(&flaky{err: errDown}), WithInstances(2), withLocalStore(local), WithLogger(slog.New(slog.DiscardHandler)))
	defer down.Close()
	var admitted int
	for range 60 {
		d, err := down.Decide(context.Background(), Input{Rule: "plan", Key: "tenant", Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
			if d.Results[0].Fallback != FailLocal {
				t.Fatalf("fallback %v, want local", d.Results[0].Fallback)
			}
		}
	}
	if admitted != 50 {
		t.Errorf("failing local with a per-call limit of 100 over 2 instances: %d admitted, want 50", admitted)
	}
}

// Fail modes, the breaker and the observer apply to Decide exactly as to
// the middleware.
func TestDecideFailModesAndBreaker(t *testing.T) {
	be := &flaky{err: errDown}
	obs := newRecorder()
	l := MustNew([]Rule{
		{Name: "open", Limit: 5, Period: time.Minute, FailMode: FailOpen},
		{Name: "closed", Limit: 5, Period: time.Minute, FailMode: FailClosed},
	}, WithBackend(be), WithObserver(obs), WithBreaker(BreakerConfig{Failures: 2, CoolDown: time.Hour}),
		WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	ctx := context.Background()

	d, err := l.Decide(ctx, Input{Rule: "open", Key: "k"})
	if err != nil || !d.Allowed || d.Results[0].Fallback != FailOpen {
		t.Fatalf("failing open: %+v, %v", d, err)
	}
	d, err = l.Decide(ctx, Input{Rule: "open", Key: "k"}, Input{Rule: "closed", Key: "k"})
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Rule != "closed" || !errors.Is(err, errDown) || d.Allowed {
		t.Fatalf("failing closed: %+v, %v; want an UnavailableError for rule closed", d, err)
	}
	if ue.RetryAfter < 45*time.Minute || ue.RetryAfter > time.Hour {
		t.Errorf("RetryAfter %v, want the breaker's cool-down less its jitter, 45m to 1h (the second failure opened it)", ue.RetryAfter)
	}
	if got := l.Health().Status; got != "degraded" {
		t.Errorf("after 2 failed Decide calls: %q, want degraded", got)
	}
	calls := be.callCount()
	if _, err := l.Decide(ctx, Input{Rule: "open", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if be.callCount() != calls {
		t.Error("Decide called the backend through an open breaker")
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got, want := obs.failmodes["open open"], 2; got != want {
		t.Errorf("fail-open admissions observed %d, want %d", got, want)
	}
	if got, want := len(obs.backend), 2; got != want {
		t.Errorf("backend calls observed %d, want %d", got, want)
	}
	if got, want := len(obs.events), 1; got != want {
		t.Errorf("degradation events %d, want %d", got, want)
	}
}

// Shadow rules report through Decide and never refuse.
func TestDecideShadowRule(t *testing.T) {
	obs := newRecorder()
	l := MustNew([]Rule{{Name: "new", Limit: 1, Period: time.Hour, Shadow: true}}, WithObserver(obs),
		WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	for range 3 {
		if d, err := l.Decide(context.Background(), Input{Rule: "new", Key: "k"}); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if got, want := obs.decisions["new shadow_rejected"], 2; got != want {
		t.Errorf("shadow rejections observed %d, want %d", got, want)
	}
	if got, want := l.Health().Rules[0].ShadowRejections, int64(2); got != want {
		t.Errorf("shadow rejections counted %d, want %d", got, want)
	}
}

// A rule without a Key is for Decide only: the middleware refuses it at
// construction, naming it, instead of never applying it.
func TestRuleWithoutKeyIsForDecideOnly(t *testing.T) {
	l := MustNew([]Rule{{Name: "grpc:user", Limit: 1, Period: time.Minute}})
	defer l.Close()
	if d, err := l.Decide(context.Background(), Input{Rule: "grpc:user", Key: "u1"}); err != nil || !d.Allowed {
		t.Fatalf("Decide: %+v, %v", d, err)
	}
	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(string), `rule "grpc:user" has no Key`) {
			t.Errorf("Handler with a keyless rule: recovered %v, want a panic naming the rule", v)
		}
	}()
	l.Handler(okHandler)
}

// A key function that returns "" is bad input naming the rule (400), never
// a budget every such request shares; it is logged once per rule.
func TestEmptyKeyValueIsRefusedNamingTheRule(t *testing.T) {
	logs := &logRecorder{}
	be := &scripted{}
	l := MustNew([]Rule{
		{Name: "account", Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, Limit: 1, Period: time.Minute},
	}, WithBackend(be), WithLogger(slog.New(logs)))
	defer l.Close()
	h := l.Handler(okHandler)
	for range 3 {
		w := get(t, h)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `rule \"account\": empty key value`) {
			t.Fatalf("empty key: %d %s, want 400 naming the rule", w.Code, w.Body)
		}
	}
	if n := be.callCount(); n != 0 {
		t.Errorf("backend called %d times for empty keys", n)
	}
	if got, want := logs.count(slog.LevelWarn, "rule=account"), 1; got != want {
		t.Errorf("empty key logged %d times, want %d", got, want)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Account", "acme")
	if got := serve(t, h, r).Code; got != 200 {
		t.Errorf("with a key: %d", got)
	}
}

// Decide keeps the memory hot path's promise: nothing allocated but the
// Results it returns, which are the caller's
// (TestDecideResultsAreTheCallersOwn); the memory store's key is built in
// place.
func TestDecideAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("-race allocates")
	}
	l := MustNew([]Rule{{Name: "ip", Limit: 1_000_000_000, Period: time.Second}})
	defer l.Close()
	ctx := context.Background()
	in := []Input{{Rule: "ip", Key: "192.0.2.1"}}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := l.Decide(ctx, in...); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 1 {
		t.Errorf("Decide allocates %.1f times, want once (the Results it returns)", allocs)
	}
}

// The Results Decide returns are the caller's: later decisions, on this
// goroutine or any other, never write them, and a caller that appends to
// them writes no other Decision's.
func TestDecideResultsAreTheCallersOwn(t *testing.T) {
	l := MustNew([]Rule{
		{Name: "ip", Limit: 1_000_000, Period: time.Hour},
		{Name: "user", Limit: 1_000, Period: time.Hour},
	})
	defer l.Close()
	ctx := context.Background()
	type kept struct {
		d    Decision
		want []RuleResult
	}
	var all []kept
	for i := range 100 {
		in := []Input{{Rule: "ip", Key: "192.0.2.1"}}
		if i%3 == 0 {
			in = append(in, Input{Rule: "user", Key: "u"})
		}
		d, err := l.Decide(ctx, in...)
		if err != nil || !d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		all = append(all, kept{d, slices.Clone(d.Results)})
		if i%2 == 0 {
			grown := append(d.Results, RuleResult{Rule: &Rule{Name: "appended"}})
			grown[0].Remaining = -1 // the caller's own copy, never another Decision's
		}
	}
	for i, k := range all {
		if !reflect.DeepEqual(k.d.Results, k.want) {
			t.Fatalf("decision %d's Results changed after later decisions:\n got %+v\nwant %+v", i, k.d.Results, k.want)
		}
	}
}

// reset clears a pooled state's Decision field by field: a field added to
// Decision must be cleared there, and counted here.
func TestResetClearsEveryDecisionField(t *testing.T) {
	if n := reflect.TypeFor[Decision]().NumField(); n != 4 {
		t.Fatalf("Decision has %d fields; state.reset clears 4: clear the new one there", n)
	}
	st := newState(1)
	st.decision = Decision{Allowed: true, Results: make([]RuleResult, 1), RetryAfter: time.Second, leases: &held{}}
	st.reset()
	if d := st.decision; d.Allowed || len(d.Results) != 0 || d.RetryAfter != 0 || d.leases != nil {
		t.Errorf("after reset: %+v", d)
	}
}

// add fills the pooled request and result slots field by field: none may
// keep what an earlier decision left there, whatever fields the structs
// grow.
func TestAddOverwritesEveryField(t *testing.T) {
	l := MustNew([]Rule{{Name: "ip", Limit: 10, Period: time.Second, Shadow: true}})
	defer l.Close()
	st := newState(1)
	st.reqs = append(st.reqs[:0], backend.Request{})
	st.decision.Results = append(st.decision.Results[:0], RuleResult{})
	scribble(t, reflect.ValueOf(&st.reqs[0]).Elem())
	scribble(t, reflect.ValueOf(&st.decision.Results[0]).Elem())
	st.reset()
	if err := l.add(st, &l.rules[0], "192.0.2.1", 3, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	want := backend.Request{Key: "ip\x00192.0.2.1", Algorithm: RollingWindow, Limit: 10, Period: time.Second, Cost: 3, Shadow: true}
	if got := st.reqs[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("request %+v, want %+v", got, want)
	}
	if got, want := st.decision.Results[0], (RuleResult{Rule: &l.rules[0], limit: 10}); !reflect.DeepEqual(got, want) {
		t.Errorf("result %+v, want %+v", got, want)
	}
}

// scribble sets every field of v, exported or not, to a value that is not
// its zero.
func scribble(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Field(i)
			scribble(t, reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem())
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.String:
		v.SetString("stale")
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
	default:
		t.Fatalf("scribble: teach it %v fields", v.Kind())
	}
}

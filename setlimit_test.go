package ceiling

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// limitSeen is an observer that records ObserveLimit's calls.
type limitSeen struct {
	NopObserver
	mu   sync.Mutex
	seen []string
}

func (o *limitSeen) ObserveLimit(rule string, limit, burst int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, rule+":"+strconv.FormatInt(limit, 10)+"/"+strconv.FormatInt(burst, 10))
}

func allowed(t *testing.T, l *Limiter, in ...Input) bool {
	t.Helper()
	d, err := l.Decide(context.Background(), in...)
	if err != nil {
		t.Fatal(err)
	}
	return d.Allowed
}

// SetLimit lowers and raises a rule's limit for the next decisions, on
// the keys' existing state, and says so in the log, the observer, Health,
// Rules and RateLimit-Policy.
func TestSetLimitLowersAndRaises(t *testing.T) {
	var logs bytes.Buffer
	obs := &limitSeen{}
	l := MustNew([]Rule{{Name: "api", Limit: 5, Period: time.Minute}},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithObserver(obs), WithObserver(NopObserver{}))
	defer l.Close()
	in := Input{Rule: "api", Key: "u"}
	for range 3 {
		if !allowed(t, l, in) {
			t.Fatal("rejected under the limit")
		}
	}
	if err := l.SetLimit("api", 2, 0); err != nil {
		t.Fatal(err)
	}
	if allowed(t, l, in) {
		t.Error("admitted with 3 held under a limit lowered to 2")
	}
	if err := l.SetLimit("api", 10, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if !allowed(t, l, in) {
			t.Fatalf("request %d rejected under a limit raised to 10", 4+i)
		}
	}
	if allowed(t, l, in) {
		t.Error("an 11th admitted under 10")
	}
	if got := l.Health().Rules[0].Limit; got != 10 {
		t.Errorf("Health limit %d, want 10", got)
	}
	if got := l.Rules()[0].Limit; got != 10 {
		t.Errorf("Rules limit %d, want 10", got)
	}
	if got, want := l.RateLimitPolicy(nil), `"api";q=10;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := strings.Join(obs.seen, " "), "api:2/0 api:10/0"; got != want {
		t.Errorf("observed %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), `msg="ceiling: a rule's limit changed" rule=api limit=10 burst=0 previous_limit=2`) {
		t.Errorf("no log line for the change in:\n%s", logs.String())
	}
}

// SetLimit refuses what New refuses, with New's errors, and changes
// nothing then.
func TestSetLimitValidatesLikeNew(t *testing.T) {
	l := MustNew([]Rule{{Name: "otp", Algorithm: SlidingLog, Limit: 3, Period: time.Minute, Cost: 2}})
	defer l.Close()
	for _, c := range []struct{ limit, burst int64 }{{0, 0}, {3, 5}, {MaxSlidingLogLimit + 1, 0}, {1, 0}} {
		err := l.SetLimit("otp", c.limit, c.burst)
		_, want := New([]Rule{{Name: "otp", Algorithm: SlidingLog, Limit: c.limit, Burst: c.burst, Period: time.Minute, Cost: 2}})
		if err == nil || want == nil || err.Error() != want.Error() {
			t.Errorf("SetLimit(%d, %d): %v, want New's %v", c.limit, c.burst, err, want)
		}
	}
	if err := l.SetLimit("nope", 3, 0); err == nil {
		t.Error("SetLimit of an undeclared rule succeeded")
	}
	if got := l.Health().Rules[0].Limit; got != 3 {
		t.Errorf("limit %d after refused changes, want 3", got)
	}
}

// A GCRA rule raised from 10 to 100 per second admits at once, though
// its key holds the whole old burst (the debt is read as units); lowered
// to 5, it holds them against the new burst.
func TestSetLimitGCRA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := MustNew([]Rule{{Name: "api", Algorithm: GCRA, Limit: 10, Period: time.Second}})
		defer l.Close()
		in := Input{Rule: "api", Key: "u"}
		for range 10 {
			allowed(t, l, in)
		}
		if allowed(t, l, in) {
			t.Fatal("an 11th admitted under burst 10")
		}
		if err := l.SetLimit("api", 100, 0); err != nil {
			t.Fatal(err)
		}
		for i := range 90 {
			if !allowed(t, l, in) {
				t.Fatalf("request %d rejected under 100 per second with 10 held", 11+i)
			}
		}
		if err := l.SetLimit("api", 5, 0); err != nil {
			t.Fatal(err)
		}
		d, _ := l.Decide(context.Background(), in)
		// 100 units held, each leaving every 10ms: 96 must leave first.
		if d.Allowed || d.RetryAfter != 960*time.Millisecond {
			t.Errorf("under 5 with 100 held: allowed %v, RetryAfter %v, want a rejection for 960ms", d.Allowed, d.RetryAfter)
		}
	})
}

// A Concurrency rule lowered below the slots held admits nothing until
// enough are released, and raised admits at once.
func TestSetLimitConcurrency(t *testing.T) {
	l := MustNew([]Rule{{Name: "jobs", Algorithm: Concurrency, Limit: 3, Period: time.Minute}})
	defer l.Close()
	in := Input{Rule: "jobs", Key: "t"}
	var held []Decision
	for range 2 {
		d, err := l.Decide(context.Background(), in)
		if err != nil || !d.Allowed {
			t.Fatal(err, d.Allowed)
		}
		held = append(held, d)
	}
	if err := l.SetLimit("jobs", 1, 0); err != nil {
		t.Fatal(err)
	}
	if allowed(t, l, in) {
		t.Error("admitted with 2 slots held under a limit of 1")
	}
	held[0].Release()
	if allowed(t, l, in) {
		t.Error("admitted with 1 slot held under a limit of 1")
	}
	if err := l.SetLimit("jobs", 4, 0); err != nil {
		t.Fatal(err)
	}
	if !allowed(t, l, in) {
		t.Error("rejected with 1 slot held under a limit raised to 4")
	}
}

// Requests in flight while the limit changes each see one limit, the
// old or the new (run with -race).
func TestSetLimitWhileDeciding(t *testing.T) {
	l := MustNew([]Rule{{Name: "api", Algorithm: GCRA, Limit: 1000, Burst: 1000, Period: time.Second}}, WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 200 {
				d, err := l.Decide(context.Background(), Input{Rule: "api", Key: strconv.Itoa(g)})
				if err != nil {
					t.Error(err)
					return
				}
				if lim := d.Results[0].Limit; lim != 1000 && lim != 2000 {
					t.Errorf("decided under limit %d", lim)
					return
				}
			}
		})
	}
	for i := range 100 {
		if err := l.SetLimit("api", 1000*int64(1+i%2), 1000*int64(1+i%2)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

// SetLimit changes the limit of a rule with an Estimate. It refused
// every such rule with "set Cost or Estimate, not both": New had
// defaulted the stored rule's Cost to 1, and SetLimit validated that copy.
func TestSetLimitOfAnEstimateRule_Regression(t *testing.T) {
	l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-Key"), Limit: 100, Period: time.Minute,
		Estimate: func(r *http.Request) (int64, error) { return 1, nil },
	}}, WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	if err := l.SetLimit("tokens", 50, 0); err != nil {
		t.Fatalf("SetLimit: %v", err)
	}
	if got := l.Health().Rules[0].Limit; got != 50 {
		t.Errorf("Health limit %d, want 50", got)
	}
	if err := l.SetLimit("tokens", 0, 0); err == nil {
		t.Error("SetLimit to 0 succeeded")
	}
}

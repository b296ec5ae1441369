package backend

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestValidateNamesTheFaultyField(t *testing.T) {
	ok := Request{Key: "k", Limit: 10, Period: time.Minute, Cost: 1}
	for _, tc := range []struct {
		name   string
		change func(*Request)
		want   string
	}{
		{"empty key", func(r *Request) { r.Key = "" }, "empty key"},
		{"zero limit", func(r *Request) { r.Limit = 0 }, "limit 0"},
		{"huge limit", func(r *Request) { r.Limit = MaxLimit + 1 }, "limit"},
		{"tiny period", func(r *Request) { r.Period = time.Microsecond }, "period"},
		{"long period", func(r *Request) { r.Period = MaxPeriod + time.Hour }, "period"},
		{"negative burst", func(r *Request) { r.Burst = -1 }, "burst -1"},
		{"algorithm", func(r *Request) { r.Algorithm = Concurrency + 1 }, "unknown algorithm"},
		{"concurrency without a lease", func(r *Request) { r.Algorithm = Concurrency }, "lease 0"},
		{"concurrency lease too large", func(r *Request) { r.Algorithm, r.Lease = Concurrency, MaxLease+1 }, "lease"},
		{"huge cost", func(r *Request) { r.Cost = MaxLimit + 1 }, "cost"},
		{"huge refund", func(r *Request) { r.Cost = -MaxLimit - 1 }, "cost"},
		// One unit per 90 days with a burst of a billion: a tolerance no
		// double can hold exactly.
		{"gcra tolerance", func(r *Request) { r.Algorithm, r.Limit, r.Period, r.Burst = GCRA, 1, MaxPeriod, MaxLimit }, "spans more than"},
	} {
		r := ok
		tc.change(&r)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest mentioning %q", tc.name, err, tc.want)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid request: %v", err)
	}
	// The same burst over a sliding log is fine: only GCRA multiplies it.
	big := Request{Key: "k", Limit: 1, Period: MaxPeriod, Burst: MaxLimit, Algorithm: SlidingLog}
	if err := big.Validate(); err != nil {
		t.Errorf("sliding log with a large burst: %v", err)
	}
}

// TestAlgorithmValues pins the numbers behind the names: they are API
// (configuration files store them). RollingWindow took 0 when it became the
// default; GCRA, 0 before, moved to the end and the others kept theirs.
func TestAlgorithmValues(t *testing.T) {
	want := []struct {
		alg  Algorithm
		n    uint8
		name string
	}{
		{RollingWindow, 0, "rolling_window"},
		{SlidingLog, 1, "sliding_log"},
		{SlidingWindow, 2, "sliding_window"},
		{FixedWindow, 3, "fixed_window"},
		{GCRA, 4, "gcra"},
	}
	var zero Algorithm
	if zero != RollingWindow {
		t.Errorf("the zero Algorithm is %v, want rolling_window", zero)
	}
	all := Algorithms()
	if len(all) != len(want) {
		t.Fatalf("Algorithms() = %v, want %d of them", all, len(want))
	}
	for i, w := range want {
		if uint8(w.alg) != w.n || w.alg.String() != w.name || all[i] != w.alg {
			t.Errorf("%v = %d (Algorithms()[%d] = %v), want %s = %d", w.alg, uint8(w.alg), i, all[i], w.name, w.n)
		}
		r := Request{Key: "k", Algorithm: w.alg, Limit: 1, Period: time.Second}
		if err := r.Validate(); err != nil {
			t.Errorf("%v: %v", w.alg, err)
		}
	}
	// Concurrency is not a rate, so Algorithms leaves it out; its value
	// follows the rates'.
	if uint8(Concurrency) != 5 || Concurrency.String() != "concurrency" {
		t.Errorf("Concurrency = %d %q, want 5 concurrency", uint8(Concurrency), Concurrency)
	}
	if got := (Concurrency + 1).String(); got != "unknown" {
		t.Errorf("Algorithm(%d).String() = %q, want unknown", Concurrency+1, got)
	}
}

package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// The stamp contract of ALGORITHMS.md: an admission says where its units
// went (Result.Stamp), and a refund that passes that stamp gives back only
// those units, while they still count.

// epochMicros is Epoch in µs, the origin of the stamps below.
var epochMicros = Epoch.UnixMicro()

// testStamps pins Result.Stamp (µs): where an admission's units went, and
// zero for a peek, a refund, a rejection and every request of a rejected
// call. 3 per second, first admission at 100ms.
func (s *suite) testStamps(t *testing.T) {
	// The stamp of 1 unit at 100ms, then of 5 forced at 100ms.
	stamps := map[backend.Algorithm][2]int64{
		// W = 62_500: 100ms is in bucket 1 after Epoch's.
		backend.RollingWindow: {62_500, 62_500},
		// T = 333_334: the stored TAT, then 5T more.
		backend.GCRA:          {100_000 + 333_334, 100_000 + 6*333_334},
		backend.SlidingLog:    {100_000, 100_000},
		backend.SlidingWindow: {100_000, 100_000},
		backend.FixedWindow:   {100_000, 100_000},
	}
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 1)
		e.at(us(100_000))
		stampIs(t, "1 unit", e.one(r), epochMicros+stamps[alg][0])
		peek := r
		peek.Cost = 0
		stampIs(t, "a peek", e.one(peek), 0)
		forced := r
		forced.Cost, forced.Force = 5, true
		stampIs(t, "5 forced", e.one(forced), epochMicros+stamps[alg][1])
		stampIs(t, "a rejection", e.one(r), 0)
		refund := r
		refund.Cost = -1
		stampIs(t, "a refund", e.one(refund), 0)
		other := req(e.key("other"), alg, 3, time.Second, 1)
		for i, res := range e.decide(other, r) {
			stampIs(t, fmt.Sprintf("request %d of a rejected call", i), res, 0)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		e := s.env(t)
		r := backend.Request{Key: e.key("k"), Algorithm: backend.Concurrency, Limit: 3, Period: time.Second, Cost: 1, Lease: 7}
		stampIs(t, "an acquisition", e.one(r), 0)
	})
}

func stampIs(t *testing.T, label string, got backend.Result, want int64) {
	t.Helper()
	if got.Stamp != want {
		t.Errorf("%s: Stamp = %d, want %d (%+v)", label, got.Stamp, want, got)
	}
}

// settleStep is one request of the lead's settlement scenario: at (ms
// after Epoch), who asks for cost units; a refund passes the stamp of
// who's admission.
type settleStep struct {
	at   int64
	who  string
	cost int64
	ok   bool
}

// testStampedSettlement is the reservation that settles below its
// estimate while others spend (limit 10 per 60s): A reserves 5, B takes 5
// one by one, A settles 0 (a stamped refund of 5), then C asks for 5 and
// D for 5. A refund of the newest units gave A's refund B's units, and
// 15 real units fitted in one window. With the stamp, D is refused and no
// window holds more than 10 real units (A used none). The fixed window
// runs it across a boundary (A reserves at 59s, B spends at 60-62s in the
// next window, A settles at 62s): A's units were in the window that
// ended, so its refund gives back nothing.
func (s *suite) testStampedSettlement(t *testing.T) {
	rolling := []settleStep{
		{0, "A", 5, true},
		{4000, "B", 1, true}, {5000, "B", 1, true}, {6000, "B", 1, true}, {7000, "B", 1, true}, {8000, "B", 1, true},
		{50_000, "A", -5, true},
		{50_000, "C", 5, true},
		{64_000, "D", 5, false},
	}
	fixed := []settleStep{
		{59_000, "A", 5, true},
		{60_000, "B", 1, true}, {60_500, "B", 1, true}, {61_000, "B", 1, true}, {61_500, "B", 1, true}, {62_000, "B", 1, true},
		{62_000, "A", -5, true},
		{62_000, "C", 5, true},
		{64_000, "D", 5, false},
	}
	cases := []struct {
		alg     backend.Algorithm
		steps   []settleStep
		aligned bool // windows are the aligned ones, not every rolling one
		// D's answer (µs).
		d want
	}{
		// 9 live units at 64s (B's of 5-8s, C's); D waits for B's of 8s.
		{backend.SlidingLog, rolling, false, want{rem: 1, reset: 46_000_000, retry: 4_000_000}},
		// W = 3.75s: B's in buckets 1 (4) and 2 (1), C's in 13; at 64s
		// (bucket 17) 5 fit once bucket 2 leaves, at 19W, and 1 once
		// bucket 1 does, at 18W; C's leave at 30W.
		{backend.RollingWindow, rolling, false, want{rem: 0, reset: 48_500_000, retry: 7_250_000, next: 3_500_000}},
		{backend.FixedWindow, fixed, true, want{rem: 0, reset: 56_000_000, retry: 56_000_000, next: 56_000_000}},
	}
	for _, c := range cases {
		t.Run(c.alg.String(), func(t *testing.T) {
			e := s.env(t)
			rule := req(e.key("k"), c.alg, 10, time.Minute, 0)
			stamps := map[string]int64{}
			type unit struct{ at, n int64 }
			var real []unit // units taken and used: A's reservation used none
			for _, st := range c.steps {
				e.at(time.Duration(st.at) * time.Millisecond)
				r := rule
				r.Cost = st.cost
				if st.cost < 0 {
					r.Stamp = stamps[st.who]
				}
				got := e.one(r)
				label := fmt.Sprintf("%s asks for %d at %dms", st.who, st.cost, st.at)
				if got.Allowed != st.ok {
					t.Fatalf("%s: %+v, want Allowed %v", label, got, st.ok)
				}
				if st.cost > 0 && got.Allowed {
					stamps[st.who] = got.Stamp
					if st.who != "A" {
						real = append(real, unit{st.at, st.cost})
					}
				}
				if st.who == "D" {
					check(t, label, got, c.d.result(10))
				}
			}
			for _, from := range real {
				start := from.at
				if c.aligned {
					start -= start % 60_000
				}
				n := int64(0)
				for _, u := range real {
					if u.at >= start && u.at < start+60_000 {
						n += u.n
					}
				}
				if n > 10 {
					t.Errorf("%d real units in the minute from %dms, want at most 10 (%v)", n, start, real)
				}
			}
		})
	}
}

// testStampNoLongerCounts pins a stamped refund whose admission's units
// have stopped counting: it gives back nothing, where a refund of the
// newest units would give back another request's (3 per second).
func (s *suite) testStampNoLongerCounts(t *testing.T) {
	type step = stampStep
	cases := map[backend.Algorithm][]step{
		// 2 in bucket 0, 1 in bucket 16; at 1.07s (bucket 17) bucket 0
		// has left: the refund finds nothing to take.
		backend.RollingWindow: {
			{0, 2, false, want{ok: true, rem: 1, reset: 1_062_500}},
			{1_000_000, 1, false, want{ok: true, rem: 0, reset: 1_062_500, next: 62_500}},
			{1_070_000, -2, true, want{ok: true, rem: 2, reset: 992_500}},
		},
		// The run of 0s left at 1s.
		backend.SlidingLog: {
			{0, 2, false, want{ok: true, rem: 1, reset: 1_000_000}},
			{500_000, 1, false, want{ok: true, rem: 0, reset: 1_000_000, next: 500_000}},
			{1_000_000, -2, true, want{ok: true, rem: 2, reset: 500_000}},
		},
		// The stamp's window ended at 1s.
		backend.FixedWindow: {
			{500_000, 2, false, want{ok: true, rem: 1, reset: 500_000}},
			{1_200_000, 1, false, want{ok: true, rem: 2, reset: 800_000}},
			{1_300_000, -2, true, want{ok: true, rem: 2, reset: 700_000}},
		},
		// The stamp's window is two windows back.
		backend.SlidingWindow: {
			{500_000, 2, false, want{ok: true, rem: 1, reset: 1_500_000}},
			{2_200_000, 1, false, want{ok: true, rem: 2, reset: 1_800_000}},
			{2_300_000, -2, true, want{ok: true, rem: 2, reset: 1_700_000}},
		},
		// T = 333_334: the first admission's units ended at 666_668,
		// before the refund at 0.7s; the key's TAT is the second's.
		backend.GCRA: {
			{0, 2, false, want{ok: true, rem: 1, reset: 666_668}},
			{600_000, 1, false, want{ok: true, rem: 1, reset: 400_002}},
			{700_000, -2, true, want{ok: true, rem: 2, reset: 300_002}},
		},
	}
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		runStamped(t, e, req(e.key("k"), alg, 3, time.Second, 0), cases[alg])
	})
	// The sliding window also takes a stamped refund from the previous
	// window's count: 2 at 0.5s, 1 at 1.2s; at 1.5s a refund of 1 stamped
	// 0.5s leaves prev = 1 (weighing 0.5) and cur = 1: 1.5 used. Unstamped
	// it would empty cur: 1 used.
	t.Run("sliding_window_previous", func(t *testing.T) {
		e := s.env(t)
		runStamped(t, e, req(e.key("k"), backend.SlidingWindow, 3, time.Second, 0), []step{
			{500_000, 2, false, want{ok: true, rem: 1, reset: 1_500_000}},
			{1_200_000, 1, false, want{ok: true, rem: 0, reset: 1_800_000, next: 299_001}},
			{1_500_000, -1, true, want{ok: true, rem: 1, reset: 1_500_000}},
		})
	})
}

// stampStep is one request of a stamped-refund table.
type stampStep struct {
	at, cost int64 // µs after Epoch
	stamped  bool  // a refund with the first admission's stamp
	want     want
}

// runStamped drives rule through steps; a stamped step passes the stamp of
// the first admission.
func runStamped(t *testing.T, e *env, rule backend.Request, steps []stampStep) {
	t.Helper()
	var first int64
	for i, st := range steps {
		e.at(us(st.at))
		r := rule
		r.Cost = st.cost
		if st.stamped {
			r.Stamp = first
		}
		got := e.one(r)
		if first == 0 {
			first = got.Stamp
		}
		check(t, fmt.Sprintf("step %d (t=%dµs cost=%d stamped=%v)", i, st.at, st.cost, st.stamped), got, st.want.result(rule.Limit))
	}
}

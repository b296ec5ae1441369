package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// tableStep is one instant of the shared scenario: at Epoch+at (µs), ask for
// cost units of a 3-per-second rule.
type tableStep struct {
	at, cost int64
}

// tableSteps is the scenario every algorithm is driven through: a burst of
// four at t0, a peek, requests through the first window, across the
// boundary at 1s, a refund after everything went idle, and a cost above the
// limit.
var tableSteps = []tableStep{
	{0, 1}, {0, 1}, {0, 1}, {0, 1}, // t0: burst; the fourth is one too many
	{100_000, 0},    // t1: peek
	{400_000, 1},    // t2
	{999_000, 1},    // t3: just before the window boundary
	{1_000_000, 1},  // t4: the boundary
	{1_300_000, 2},  // t5: two at once
	{1_300_000, 1},  // t5: one
	{1_400_000, 1},  // t6
	{2_500_000, -1}, // t7: refund after going idle
	{2_500_000, 5},  // t7: more than the limit can ever admit
}

const (
	tableLimit  = 3
	tablePeriod = time.Second
)

// tableWant holds, per algorithm, the hand-computed answer to each step of
// tableSteps (3 per second, burst 0 = 3). The working, in µs:
//
// Rolling window: W = 1e6/16 = 62_500, bucket b = now/W (Epoch is a whole
// second); a unit of bucket x counts until (x+17)W, so t0's three count
// until 1_062_500: 62.5ms after a sliding log lets them go. next is the
// instant the newest buckets hold at most 2.
//
// GCRA: T = ceil(1e6/3) = 333_334, tau = 3T = 1_000_002; remaining is
// (tau - (tat-now))/T, reset tat-now, retry nt-now-tau.
//
// Fixed window: windows [0,1e6), [1e6,2e6), ...; retry and reset are the
// time to the window's end.
//
// Sliding log: each unit counts while now < e+P; retry is e[k+c-L-1]+P-now.
//
// Sliding window counter: Pm = 1000 ms; weight w = remm*1e6/Pm ppm; for
// example at t0 the fourth unit waits until prev'=3 weighs at most 666_666
// ppm in the next window: remm <= 666, rem <= 666_999, so now' = 1_333_001.
var tableWant = map[backend.Algorithm][]want{
	backend.RollingWindow: {
		{ok: true, rem: 2, reset: 1_062_500},
		{ok: true, rem: 1, reset: 1_062_500},
		{ok: true, rem: 0, reset: 1_062_500, next: 1_062_500},
		{ok: false, rem: 0, reset: 1_062_500, retry: 1_062_500, next: 1_062_500},
		{ok: true, rem: 0, reset: 962_500, next: 962_500},
		{ok: false, rem: 0, reset: 662_500, retry: 662_500, next: 662_500},
		{ok: false, rem: 0, reset: 63_500, retry: 63_500, next: 63_500},
		{ok: false, rem: 0, reset: 62_500, retry: 62_500, next: 62_500}, // a sliding log admits here: t0's bucket counts until 17W
		{ok: true, rem: 1, reset: 1_012_500},
		{ok: true, rem: 0, reset: 1_012_500, next: 1_012_500},
		{ok: false, rem: 0, reset: 912_500, retry: 912_500, next: 912_500},
		{ok: true, rem: 3, reset: 0},
		{ok: false, rem: 3, reset: 0, never: true},
	},
	backend.GCRA: {
		{ok: true, rem: 2, reset: 333_334},
		{ok: true, rem: 1, reset: 666_668},
		{ok: true, rem: 0, reset: 1_000_002, next: 333_334},
		{ok: false, rem: 0, reset: 1_000_002, retry: 333_334, next: 333_334},
		{ok: true, rem: 0, reset: 900_002, next: 233_334},
		{ok: true, rem: 0, reset: 933_336, next: 266_668},
		{ok: true, rem: 0, reset: 667_670, next: 1_002},
		{ok: false, rem: 0, reset: 666_670, retry: 2, next: 2}, // nt-now = 1_000_004: 2µs over tau
		{ok: false, rem: 1, reset: 366_670, retry: 33_336},
		{ok: true, rem: 0, reset: 700_004, next: 33_336},
		{ok: true, rem: 0, reset: 933_338, next: 266_670},
		{ok: true, rem: 3, reset: 0},
		{ok: false, rem: 3, reset: 0, never: true},
	},
	backend.FixedWindow: {
		{ok: true, rem: 2, reset: 1_000_000},
		{ok: true, rem: 1, reset: 1_000_000},
		{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000},
		{ok: false, rem: 0, reset: 1_000_000, retry: 1_000_000, next: 1_000_000},
		{ok: true, rem: 0, reset: 900_000, next: 900_000},
		{ok: false, rem: 0, reset: 600_000, retry: 600_000, next: 600_000},
		{ok: false, rem: 0, reset: 1_000, retry: 1_000, next: 1_000},
		{ok: true, rem: 2, reset: 1_000_000}, // a new window: the count starts over
		{ok: true, rem: 0, reset: 700_000, next: 700_000},
		{ok: false, rem: 0, reset: 700_000, retry: 700_000, next: 700_000},
		{ok: false, rem: 0, reset: 600_000, retry: 600_000, next: 600_000},
		{ok: true, rem: 3, reset: 0},
		{ok: false, rem: 3, reset: 0, never: true},
	},
	backend.SlidingLog: {
		{ok: true, rem: 2, reset: 1_000_000},
		{ok: true, rem: 1, reset: 1_000_000},
		{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000},
		{ok: false, rem: 0, reset: 1_000_000, retry: 1_000_000, next: 1_000_000},
		{ok: true, rem: 0, reset: 900_000, next: 900_000},
		{ok: false, rem: 0, reset: 600_000, retry: 600_000, next: 600_000},
		{ok: false, rem: 0, reset: 1_000, retry: 1_000, next: 1_000},
		{ok: true, rem: 2, reset: 1_000_000}, // the three units of t0 expire at exactly 1s
		{ok: true, rem: 0, reset: 1_000_000, next: 700_000},
		{ok: false, rem: 0, reset: 1_000_000, retry: 700_000, next: 700_000}, // waits for the unit of t4
		{ok: false, rem: 0, reset: 900_000, retry: 600_000, next: 600_000},
		{ok: true, rem: 3, reset: 0},
		{ok: false, rem: 3, reset: 0, never: true},
	},
	backend.SlidingWindow: {
		{ok: true, rem: 2, reset: 2_000_000},
		{ok: true, rem: 1, reset: 2_000_000},
		{ok: true, rem: 0, reset: 2_000_000, next: 1_333_001},
		{ok: false, rem: 0, reset: 2_000_000, retry: 1_333_001, next: 1_333_001},
		{ok: true, rem: 0, reset: 1_900_000, next: 1_233_001},
		{ok: false, rem: 0, reset: 1_600_000, retry: 933_001, next: 933_001},
		{ok: false, rem: 0, reset: 1_001_000, retry: 334_001, next: 334_001},
		{ok: false, rem: 0, reset: 1_000_000, retry: 333_001, next: 333_001}, // prev = 3 still weighs fully
		{ok: false, rem: 0, reset: 700_000, retry: 366_001, next: 33_001},    // 2 wait longer than 1
		{ok: false, rem: 0, reset: 700_000, retry: 33_001, next: 33_001},
		{ok: true, rem: 0, reset: 1_600_000, next: 266_001}, // 3*0.6 + 1 = 2.8 <= 3; one more at 0.333 + 2
		{ok: true, rem: 2, reset: 500_000},                  // prev = 1 still weighs 0.5
		{ok: false, rem: 2, reset: 500_000, never: true},
	},
}

func (s *suite) testTable(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			e := s.env(t)
			runTable(t, e, e.key("k"), alg, func(r backend.Request) backend.Result { return e.one(r) })
		})
	}
}

func runTable(t *testing.T, e *env, key string, alg backend.Algorithm, decide func(backend.Request) backend.Result) {
	t.Helper()
	wants := tableWant[alg]
	if len(wants) != len(tableSteps) {
		t.Fatalf("table for %v has %d rows, want %d", alg, len(wants), len(tableSteps))
	}
	for i, st := range tableSteps {
		e.at(us(st.at))
		got := decide(req(key, alg, tableLimit, tablePeriod, st.cost))
		check(t, fmt.Sprintf("step %d (t=%dµs cost=%d)", i, st.at, st.cost), got, wants[i].result(tableLimit))
	}
}

// testGCRABurst pins that Burst, not Limit, sizes GCRA's bucket: 10 per
// second (T = 100ms) with a burst of 2 (tau = 200ms).
func (s *suite) testGCRABurst(t *testing.T) {
	e := s.env(t)
	r := req(e.key("k"), backend.GCRA, 10, time.Second, 1)
	r.Burst = 2
	steps := []struct {
		at, cost int64
		want     want
	}{
		{0, 1, want{ok: true, rem: 1, reset: 100_000}},
		{0, 1, want{ok: true, rem: 0, reset: 200_000, next: 100_000}},
		{0, 1, want{ok: false, rem: 0, reset: 200_000, retry: 100_000, next: 100_000}},
		{99_999, 1, want{ok: false, rem: 0, reset: 100_001, retry: 1, next: 1}},
		{100_000, 1, want{ok: true, rem: 0, reset: 200_000, next: 100_000}},
		{100_000, 3, want{ok: false, rem: 0, reset: 200_000, never: true, next: 100_000}}, // 3 > burst, although 3 < limit
		{400_000, 0, want{ok: true, rem: 2, reset: 0}},
	}
	for i, st := range steps {
		e.at(us(st.at))
		r.Cost = st.cost
		check(t, fmt.Sprintf("step %d (t=%dµs cost=%d)", i, st.at, st.cost), e.one(r), st.want.result(10))
	}
}

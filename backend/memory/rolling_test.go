package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	refmodel "github.com/ceiling-go/ceiling/backend/internal/model"
)

// modelRun decides calls on a Store and on the reference model at the same
// instants, requiring the same results and the same stored state after
// every call.
type modelRun struct {
	t   *testing.T
	s   *Store
	m   *refmodel.Model
	now time.Time
}

func newModelRun(t *testing.T, at time.Time, opts ...Option) *modelRun {
	r := &modelRun{t: t, m: refmodel.New(), now: at}
	r.s = New(append([]Option{WithClock(func() time.Time { return r.now }), WithSweepInterval(0)}, opts...)...)
	t.Cleanup(func() { r.s.Close() })
	return r
}

func (r *modelRun) decide(step string, call ...backend.Request) []backend.Result {
	r.t.Helper()
	got, err := r.s.Decide(ctx, call)
	if err != nil {
		r.t.Fatalf("%s: %v", step, err)
	}
	want, err := r.m.Decide(r.now.UnixMicro(), call)
	if err != nil {
		r.t.Fatalf("%s: model: %v", step, err)
	}
	for i := range call {
		if got[i] != want[i] {
			r.t.Fatalf("%s: request %d (%+v):\n got %+v\nwant %+v", step, i, call[i], got[i], want[i])
		}
		st, ok := r.m.Stored(call[i].Key)
		if err := r.s.inspect(call[i].Key, st, ok, false); err != nil {
			r.t.Fatalf("%s: key %q: %v", step, call[i].Key, err)
		}
	}
	return got
}

// tier reports the tier holding key's rolling window, and whether one does.
func (s *Store) tier(key string) (rollTier, bool) {
	h := s.hash(key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t, i := sh.rolls.find(h, tier8)
	return t, i >= 0
}

// TestRollingWindowTiers: a key's counts are as wide as its limit and its
// units need (8 bits for a limit of 10), forced charges move it to wider
// ones, and it comes back once they have left; through single and
// multi-request calls, with the model's answers all along. Past 2^32-1
// units in all, the sum is no longer kept (counts saturate at Nmax each).
func TestRollingWindowTiers(t *testing.T) {
	run := newModelRun(t, time.Unix(1_700_000_000, 0))
	r := backend.Request{Key: "k", Limit: 10, Period: time.Hour, Cost: 1}
	wantTier := func(step string, want rollTier) {
		t.Helper()
		if got, ok := run.s.tier(r.Key); !ok || got != want {
			t.Fatalf("%s: the key is in tier %d (held: %v), want %d", step, got, ok, want)
		}
	}
	run.decide("1 of 10", r)
	wantTier("a limit of 10", tier8)

	forced := r
	forced.Force, forced.Cost = true, 1000
	run.decide("forced 1000", forced)
	wantTier("1001 units", tier16)
	forced.Cost = 100_000
	run.decide("forced 100,000", forced, forced) // a multi-request call
	wantTier("201,001 units", tier32)
	forced.Cost = backend.MaxLimit
	for i := range 5 {
		run.decide("forced 1e9", forced)
		run.now = run.now.Add(time.Duration(i) * time.Minute)
	}
	run.decide("a peek past 2^32 units", backend.Request{Key: r.Key, Limit: 10, Period: time.Hour})
	refund := r
	refund.Cost = -backend.MaxLimit
	run.decide("refund 1e9", refund)
	run.decide("refund 2e9", refund, refund)
	run.decide("1 more, rejected", r)
	// The minute buckets leave one by one: the newest one keeps the key
	// in the 32-bit tier until it leaves too.
	for range 18 {
		run.now = run.now.Add(time.Hour / 16)
		run.decide("a peek as buckets leave", backend.Request{Key: r.Key, Limit: 10, Period: time.Hour})
	}
	run.decide("1 of 10 again", r)
	wantTier("back to one unit", tier8)

	// A limit that 8 bits cannot hold, and a period too long for the narrow
	// tiers' widths.
	big := backend.Request{Key: "big", Limit: 1000, Period: time.Minute, Cost: 1}
	run.decide("1 of 1000", big)
	keyTier := func(key string, want rollTier) {
		t.Helper()
		if got, ok := run.s.tier(key); !ok || got != want {
			t.Fatalf("%s is in tier %d (held: %v), want %d", key, got, ok, want)
		}
	}
	keyTier("big", tier16)
	day := backend.Request{Key: "day", Limit: 10, Period: 20 * time.Hour, Cost: 1}
	run.decide("1 of 10 per 20 hours", day)
	keyTier("day", tier32)
	refund = big
	refund.Cost = -1
	run.decide("refund the one unit", refund)
	if _, ok := run.s.tier("big"); ok {
		t.Error("a key refunded to empty is still held")
	}
}

// TestRollingWindowNearTheUnixEpoch drives the rolling window with a clock
// around the Unix epoch, where bucket numbers are small or negative (a
// ring slot is a bucket number modulo 17), against the model.
func TestRollingWindowNearTheUnixEpoch(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 17))
	for seq := range 200 {
		run := newModelRun(t, time.UnixMicro(-2000+rng.Int64N(4000)))
		keys := []string{"a", "b"}
		for range 40 {
			run.now = run.now.Add(time.Duration(rng.Int64N(300)) * time.Microsecond)
			n := 1 + rng.IntN(2)
			call := make([]backend.Request, n)
			for i := range call {
				call[i] = backend.Request{
					Key:    keys[rng.IntN(len(keys))],
					Limit:  1 + rng.Int64N(300),
					Period: []time.Duration{time.Millisecond, 1700 * time.Microsecond, 3 * time.Millisecond}[rng.IntN(3)],
					Cost:   rng.Int64N(12) - 3,
					Force:  rng.IntN(6) == 0,
				}
			}
			run.decide(fmt.Sprint("sequence ", seq), call...)
		}
	}
}

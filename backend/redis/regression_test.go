package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
)

// Disagreements the differential test found, each replayed against the
// model. Keys {x}… and {y}… are in different Cluster slots; b (limit 1,
// cost 2) rejects every call it is in, so the {x} slot's script has run and
// must be undone.

var allAlgorithms = []backend.Algorithm{backend.GCRA, backend.SlidingLog, backend.SlidingWindow, backend.FixedWindow}

// rejects is a request that can never fit, in the {y} slot.
var rejects = backend.Request{Key: "{y}b", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 2}

// TestClusterShadowRefundRegression: undoing a rejected cross-slot call
// gave back the cost of a shadow request that did not fit, which never
// consumed: 5 units admitted in a fixed window of 2.
func TestClusterShadowRefundRegression(t *testing.T) {
	a := backend.Request{Key: "{x}a", Algorithm: backend.FixedWindow, Limit: 2, Period: time.Hour, Cost: 2}
	shadow := a
	shadow.Cost, shadow.Shadow = 1, true
	one := a
	one.Cost = 1
	clusterDifferential(t).Replay(t, []backendtest.Step{
		{At: time.Second, Decide: []backend.Request{a}},
		{At: time.Second, Decide: []backend.Request{shadow, rejects}},
		{At: time.Second, Decide: []backend.Request{shadow, rejects}},
		{At: time.Second, Decide: []backend.Request{shadow, rejects}},
		{At: time.Second, Decide: []backend.Request{one}},
	})
}

// TestClusterUndoOfARefundRegression: a refund inside a call another slot
// rejects was undone by charging it again, forced, which over-charged when
// the refund gave back less (here nothing) and re-dated a sliding log's
// units to the undo's instant. A rejected call changes nothing.
func TestClusterUndoOfARefundRegression(t *testing.T) {
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			a := backend.Request{Key: "{x}a", Algorithm: alg, Limit: 3, Period: time.Hour, Cost: -2}
			peek := a
			peek.Cost = 0
			charge := a
			charge.Cost = 2
			clusterDifferential(t).Replay(t, []backendtest.Step{
				{At: time.Second, Decide: []backend.Request{a, rejects}},
				{At: time.Second, Decide: []backend.Request{peek}}, // 3 remaining, not 1
				{At: 2 * time.Second, Decide: []backend.Request{charge}},
				{At: time.Minute, Decide: []backend.Request{a, rejects}},
				{At: 30 * time.Minute, Decide: []backend.Request{peek}}, // the units of 2s, not of 1m
			})
		})
	}
}

// TestClusterSlidingLogUndoRegression: the undo of a sliding log stopped
// after the first run at the call's instant, while the script stores one
// run per request: 4 remaining instead of 5.
func TestClusterSlidingLogUndoRegression(t *testing.T) {
	one := backend.Request{Key: "{x}a", Algorithm: backend.SlidingLog, Limit: 5, Period: time.Hour, Cost: 1}
	two := one
	two.Cost = 2
	peek := one
	peek.Cost = 0
	clusterDifferential(t).Replay(t, []backendtest.Step{
		{At: time.Second, Decide: []backend.Request{one, two, rejects}},
		{At: time.Second, Decide: []backend.Request{peek}},
	})
}

// TestClusterUndoUnderAnotherPeriodRegression: a rejected cross-slot call
// whose {x} request, under another period, started its window over wiped
// the 5 units written under the hour: 30 remaining instead of 25.
func TestClusterUndoUnderAnotherPeriodRegression(t *testing.T) {
	for _, alg := range []backend.Algorithm{backend.FixedWindow, backend.SlidingWindow, backend.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			hour := backend.Request{Key: "{x}f", Algorithm: alg, Limit: 30, Period: time.Hour, Cost: 5}
			short := hour
			short.Period, short.Cost = 1500*time.Millisecond, 1
			peek := hour
			peek.Cost = 0
			clusterDifferential(t).Replay(t, []backendtest.Step{
				{At: 1600 * time.Millisecond, Decide: []backend.Request{hour}},
				{At: 3600 * time.Millisecond, Decide: []backend.Request{short, rejects}},
				{At: 3600 * time.Millisecond, Decide: []backend.Request{peek}},
			})
		})
	}
}

// TestDenyCacheSameKeyTwiceRegression: [a, a] of limit 1 is rejected by its
// second request, which saw the first one's write; the cache learnt that
// rejection and refused a alone for about an hour, where Redis admits it.
func TestDenyCacheSameKeyTwiceRegression(t *testing.T) {
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			a := backend.Request{Key: "a", Algorithm: alg, Limit: 1, Period: time.Hour, Cost: 1}
			denyDifferential(t).Replay(t, []backendtest.Step{
				{At: time.Second, Decide: []backend.Request{a, a}},
				{At: 2 * time.Second, Decide: []backend.Request{a}},
			})
		})
	}
}

// TestDenyCacheDeadlinePrecisionRegression: the cache counted its deadline
// from a clock reading with nanoseconds, after the reply, so at the
// microsecond Redis admits again it still refused (RetryAfter 448ns).
func TestDenyCacheDeadlinePrecisionRegression(t *testing.T) {
	a := backend.Request{Key: "a", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1}
	denyDifferential(t).Replay(t, []backendtest.Step{
		{At: time.Second + 448, Decide: []backend.Request{a}},
		{At: time.Second + 448, Decide: []backend.Request{a}}, // rejected for 1s
		{At: 2 * time.Second, Decide: []backend.Request{a}},   // admitted
	})
}

// TestDenyCacheOtherRuleOnTheKeyRegression: a denial answered another rule
// sharing the key (another period), and outlived a write under such a rule
// that started the key's window over.
func TestDenyCacheOtherRuleOnTheKeyRegression(t *testing.T) {
	minute := backend.Request{Key: "a", Algorithm: backend.SlidingWindow, Limit: 4, Period: time.Minute, Cost: 4}
	one := minute
	one.Cost = 1
	hour := one
	hour.Limit, hour.Period = 1, time.Hour
	denyDifferential(t).Replay(t, []backendtest.Step{
		{At: 4 * time.Minute, Decide: []backend.Request{minute}},
		{At: 4 * time.Minute, Decide: []backend.Request{one}}, // rejected, remembered
		{At: 5 * time.Minute, Decide: []backend.Request{hour, one}},
		{At: 5 * time.Minute, Decide: []backend.Request{one}},
	})
}

// TestDenyCacheClockBehindRegression: a GCRA rejection was remembered until
// its RetryAfter; the clock then stepped back, the backend anchored the
// key's debt at the new now (shorter by the step), and the cache went on
// refusing 1 ms past the instant the backend admits again. A clock earlier
// than the latest call the cache saw on the key now forgets its denial.
func TestDenyCacheClockBehindRegression(t *testing.T) {
	c := backend.Request{Key: "c", Algorithm: backend.GCRA, Limit: 1, Period: 25 * time.Hour, Cost: 1}
	peek := c
	peek.Cost = 0
	denyDifferential(t).Replay(t, []backendtest.Step{
		{At: time.Millisecond, Decide: []backend.Request{c}},
		{At: 1592673750 * time.Microsecond, Decide: []backend.Request{c}},
		{At: 0, Decide: []backend.Request{peek}},
		{At: 377 * time.Millisecond, Decide: []backend.Request{c}},
	})
}

// TestClusterLeaseUndoClockBehindRegression: a rejected cross-slot call
// that renewed (released) a lease was undone; the clock then stepped back
// about 4 s behind the key's last write.
func TestClusterLeaseUndoClockBehindRegression(t *testing.T) {
	for name, d := range map[string]func(testing.TB) backendtest.Differential{
		"cluster": clusterDifferential, "cluster+deny": clusterDenyDifferential,
	} {
		t.Run(name, func(t *testing.T) {
			d(t).Replay(t, []backendtest.Step{
				{At: 18576002999999 * time.Microsecond, Decide: []backend.Request{
					{Key: "{x}b", Algorithm: backend.Concurrency, Limit: 1, Period: 1 * time.Second, Cost: 1, Lease: 1},
				}},
				{At: 18576003999998 * time.Microsecond, Decide: []backend.Request{
					{Key: "{x}b", Algorithm: backend.Concurrency, Limit: 1, Period: 1 * time.Second, Cost: -1, Lease: 4503599627370495},
					{Key: "{y}d", Algorithm: backend.RollingWindow, Limit: 1, Period: 2160 * time.Hour, Cost: 3},
				}},
				{At: 18576000000001 * time.Microsecond, Decide: []backend.Request{
					{Key: "{x}b", Algorithm: backend.Concurrency, Limit: 1, Period: 1 * time.Second, Cost: 0, Lease: 2},
				}},
			})
		})
	}
}

// TestClusterLeaseUndoAfterDropRegression: the undo of a rejected
// cross-slot call put back the time of the key's write before the call,
// although the call's drop of an expired lease is written whatever it
// decides (at its own now): after a clock step back the live lease then
// counted 1 s longer than the model says.
func TestClusterLeaseUndoAfterDropRegression(t *testing.T) {
	short := backend.Request{Key: "{x}b", Algorithm: backend.Concurrency, Limit: 2, Period: time.Second, Cost: 1, Lease: 1}
	long := short
	long.Period, long.Lease = 10*time.Second, 2
	release := short
	release.Cost, release.Lease = -1, 99 // no such lease, yet a write
	peek := long
	peek.Cost = 0
	clusterDifferential(t).Replay(t, []backendtest.Step{
		{At: 10 * time.Second, Decide: []backend.Request{short, long}},
		{At: 12 * time.Second, Decide: []backend.Request{release, rejects}},
		{At: 11 * time.Second, Decide: []backend.Request{peek}}, // full again in 8s, not 9s
	})
}

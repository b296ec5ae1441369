package memory

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	refmodel "github.com/ceiling-go/ceiling/backend/internal/model"
)

// differential is the model-based test of the Store, inspecting its tables
// after every step.
func differential(t testing.TB) backendtest.Differential {
	return backendtest.Differential{
		Paste: "differential(t)",
		New: func(t testing.TB, now func() time.Time) backendtest.Target {
			s := New(WithClock(now), WithSweepInterval(0))
			return backendtest.Target{Backend: s, Inspect: s.inspect}
		},
	}
}

// TestDifferential compares the Store with the reference model on random
// sequences (see backend/backendtest/README.md for the knobs).
func TestDifferential(t *testing.T) {
	d := differential(t)
	d.Sequences = 2000 // about 5s under the race detector
	d.Run(t)
}

// inspect compares the state the Store holds for key with the model's: the
// same values, and no state kept once back to full.
func (s *Store) inspect(key string, want refmodel.State, ok, _ bool) error {
	h := s.hash(key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var got refmodel.State
	found := 0
	if i := sh.gcra.find(h); i >= 0 {
		found++
		st := sh.gcra.slots[i].v
		got = refmodel.State{Algorithm: backend.GCRA, TAT: st.tat, T: st.t, Expires: st.tat}
	}
	if i := sh.windows.find(h); i >= 0 {
		found++
		w := sh.windows.slots[i].v
		got = refmodel.State{Algorithm: want.Algorithm, Start: w.start, Expires: w.exp}
		if want.Algorithm == backend.FixedWindow {
			got.Count = w.a
		} else {
			got.Prev, got.Cur = w.a, w.b
		}
	}
	if i := sh.logs.find(h); i >= 0 {
		found++
		l := sh.logs.slots[i].v
		got = refmodel.State{Algorithm: backend.SlidingLog, Expires: l.exp}
		sum := int64(0)
		for j := range l.n {
			r := l.at(j)
			sum += r.n
			if r.n == 0 {
				continue // a stamped refund's empty run: no entry
			}
			got.Log = mergeRun(got.Log, refmodel.Run{T: r.t, N: r.n})
		}
		if sum != l.k {
			return fmt.Errorf("the log's runs hold %d units, its count says %d", sum, l.k)
		}
	}
	for _, t := range []rollTier{tier8, tier16, tier32} {
		i := sh.rolls.findIn(t, h)
		if i < 0 {
			continue
		}
		found++
		r := sh.rolls.load(t, i)
		v := r.stored()
		got = refmodel.State{Algorithm: backend.RollingWindow, W: r.w, Last: r.last, Expires: r.expiry(&v)}
		for x := r.last - rollBuckets; x <= r.last; x++ {
			got.Buckets = append(got.Buckets, int64(r.n[ringSlot(x)]))
		}
		var sum int64
		for _, n := range r.n {
			sum += int64(n)
		}
		if int64(r.s) != min(sum, math.MaxUint32) {
			return fmt.Errorf("a rolling window's counts hold %d units, its sum says %d", sum, r.s)
		}
		if need := tierFor(sum, r.w); need > t {
			return fmt.Errorf("a rolling window holding %d units, %dµs buckets, is in tier %d, which cannot hold them", sum, r.w, t)
		}
	}
	if i := sh.leases.find(h); i >= 0 {
		found++
		ls := sh.leases.slots[i].v
		got = refmodel.State{Algorithm: backend.Concurrency, Expires: leaseExpiry(&ls)}
		var count int64
		for x := ls.first; x != nil; x = x.next {
			if x.next != nil && x.next.exp < x.exp {
				return fmt.Errorf("lease %d expires after the next one, %d", x.id, x.next.id)
			}
			if ls.byID[x.id] != x {
				return fmt.Errorf("lease %d is not indexed by its id", x.id)
			}
			got.Leases = append(got.Leases, refmodel.Lease{ID: x.id, N: x.n, Exp: ls.expOf(x)})
			count += x.n
		}
		if count != ls.count || len(ls.byID) != len(got.Leases) {
			return fmt.Errorf("%d leases holding %d units, but %d indexed and a count of %d", len(got.Leases), count, len(ls.byID), ls.count)
		}
		// The model keeps leases in insertion order, the Store by expiry.
		byID := func(a, b refmodel.Lease) int { return cmp.Compare(a.ID, b.ID) }
		slices.SortFunc(got.Leases, byID)
		want.Leases = slices.Clone(want.Leases)
		slices.SortFunc(want.Leases, byID)
	}
	switch {
	case found > 1:
		return fmt.Errorf("the key is in %d tables", found)
	case !ok && found == 0:
		return nil
	case !ok:
		return fmt.Errorf("the Store holds %+v for a key the model holds nothing for", got)
	case found == 0:
		return fmt.Errorf("the Store holds nothing, the model %+v", want)
	}
	want.Written = 0
	if !slices.Equal(got.Log, want.Log) || got.Algorithm != want.Algorithm || got.TAT != want.TAT || got.T != want.T || got.Start != want.Start ||
		got.Count != want.Count || got.Prev != want.Prev || got.Cur != want.Cur || got.Expires != want.Expires ||
		got.W != want.W || got.Last != want.Last || !slices.Equal(got.Buckets, want.Buckets) || !slices.Equal(got.Leases, want.Leases) {
		return fmt.Errorf("stored %+v, want %+v", got, want)
	}
	return nil
}

// mergeRun appends r to log, merging it into the last run at the same
// instant.
func mergeRun(log []refmodel.Run, r refmodel.Run) []refmodel.Run {
	if n := len(log); n > 0 && log[n-1].T == r.T {
		log[n-1].N += r.N
		return log
	}
	return append(log, r)
}

// TestConcurrentMatchesReplay races 8 goroutines on shared keys: every key
// holds exactly the replay of the admitted calls afterwards.
func TestConcurrentMatchesReplay(t *testing.T) {
	differential(t).Concurrent(t, 8, 20, 100)
}

// TestRollingAnchoredUnderALaterRequestsWidth pins a call whose first
// request on a rolling-window key reads it under another bucket width
// (another period: the state is absent to it) and whose second reads it
// under the stored width with the clock behind it: the stored state is
// anchored and written as the model says, whether the first request wrote
// or not, and whether the call is admitted or not.
func TestRollingAnchoredUnderALaterRequestsWidth(t *testing.T) {
	t.Run("two peeks", func(t *testing.T) {
		differential(t).Replay(t, []backendtest.Step{
			{At: 25243200321510 * time.Microsecond, Decide: []backend.Request{
				{Key: "c", Algorithm: backend.RollingWindow, Limit: 1, Period: 1 * time.Hour, Cost: 1},
			}},
			{At: 25241721000001 * time.Microsecond, Decide: []backend.Request{
				{Key: "c", Algorithm: backend.RollingWindow, Limit: 1, Period: 3 * time.Second, Cost: 0},
				{Key: "c", Algorithm: backend.RollingWindow, Limit: 1, Period: 1 * time.Hour, Cost: 0},
			}},
		})
	})
	t.Run("a write, then a rejection", func(t *testing.T) {
		differential(t).Replay(t, []backendtest.Step{
			{At: 2187 * time.Microsecond, Decide: []backend.Request{
				{Key: "d", Algorithm: backend.RollingWindow, Limit: 1, Period: 1500 * time.Microsecond, Cost: 1},
			}},
			{At: 0, Decide: []backend.Request{
				{Key: "d", Algorithm: backend.RollingWindow, Limit: 1, Period: 1500 * time.Millisecond, Cost: 1},
				{Key: "d", Algorithm: backend.RollingWindow, Limit: 1, Period: 1500 * time.Microsecond, Cost: 3},
			}},
		})
	})
}

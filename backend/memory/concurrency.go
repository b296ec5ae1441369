package memory

import (
	"slices"

	"github.com/ceiling-go/ceiling/backend"
)

// The Concurrency algorithm of ALGORITHMS.md: leases held until released
// or expired.

// lease is one acquisition: n units held by id until exp (µs).
type lease struct {
	id, n, exp int64
}

// leaseState is a Concurrency key's leases, in insertion order, and exp,
// the last of their expiries. Its slice is never changed in place: a step
// that changes it makes a new one, so a rejected call leaves the stored
// state as it was.
type leaseState struct {
	exp, at int64 // at: the now of the write (anchor.go)
	leases  []lease
}

func leaseExpiry(st *leaseState) int64 { return st.exp }

// liveLeases returns st's leases that are live at now and their units,
// without copying when none has expired.
func liveLeases(st leaseState, now int64) ([]lease, int64) {
	var count int64
	expired := false
	for _, l := range st.leases {
		if l.exp > now {
			count += l.n
		} else {
			expired = true
		}
	}
	if !expired {
		return st.leases, count
	}
	live := make([]lease, 0, len(st.leases))
	for _, l := range st.leases {
		if l.exp > now {
			live = append(live, l)
		}
	}
	return live, count
}

// leaseStep decides r on a Concurrency key whose state is st, returning the
// state to write; false means r was rejected and nothing is written.
func leaseStep(r *backend.Request, now int64, st leaseState, res *backend.Result) (leaseState, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	live, count := liveLeases(st, now)
	*res = backend.Result{Allowed: true, Limit: L}
	i := slices.IndexFunc(live, func(l lease) bool { return l.id == r.Lease })
	switch {
	case c > 0 && i >= 0:
		// A renewal, or an acquisition retried: the same units, longer.
		live = slices.Clone(live)
		live[i].exp = now + P
	case c > 0 && !r.Force && c > L-count:
		res.Allowed = false
		res.RetryAfter = backend.Never
		if c <= L {
			res.RetryAfter = dur(leaseWait(live, count, L, c, now))
		}
		leaseAfter(res, L, now, live, count)
		return st, false
	case c > 0:
		live = append(slices.Clip(live), lease{id: r.Lease, n: c, exp: now + P})
		count += c
	case c < 0 && i >= 0:
		live = slices.Clone(live)
		if n := live[i].n; n+c <= 0 {
			count -= n
			live = slices.Delete(live, i, i+1)
		} else {
			live[i].n, count = n+c, count+c
		}
	}
	leaseAfter(res, L, now, live, count)
	next := leaseState{leases: live, at: now}
	for _, l := range live {
		next.exp = max(next.exp, l.exp)
	}
	if len(live) == 0 {
		next.leases = nil
	}
	return next, true
}

// leaseWait is the time until enough of the live leases expire for c more
// units to fit under L, if none is released or renewed (c <= L).
func leaseWait(live []lease, count, L, c, now int64) int64 {
	byExp := slices.Clone(live)
	slices.SortFunc(byExp, func(a, b lease) int { return int(min(max(a.exp-b.exp, -1), 1)) })
	for _, l := range byExp {
		count -= l.n
		if count+c <= L {
			return l.exp - now
		}
	}
	return 0 // unreachable for c <= L: with every lease gone, c fits
}

// leaseAfter reports a Concurrency key holding count units in live.
func leaseAfter(res *backend.Result, L, now int64, live []lease, count int64) {
	res.Remaining = max(0, L-count)
	for _, l := range live {
		res.ResetAfter = max(res.ResetAfter, dur(l.exp-now))
	}
	if res.Remaining == 0 {
		res.NextAfter = dur(leaseWait(live, count, L, 1, now))
	}
}

// putLeases stores a Concurrency key's state at slot i (-1: absent),
// deleting the key when it holds no lease. It reports whether it inserted
// or deleted.
func (s *Store) putLeases(sh *shard, h keyHash, i int, r *backend.Request, st leaseState, now int64) bool {
	return put(s, sh, &sh.leases, h, i, r, st, len(st.leases) > 0, st.exp, now)
}

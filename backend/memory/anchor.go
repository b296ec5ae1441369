package memory

import "github.com/ceiling-go/ceiling/backend"

// A clock behind the state (ALGORITHMS.md): a state stored later than now
// is anchored at now, in place, by the first request that reads it,
// whatever its call decides. No unit is forgotten and none counts longer
// than if admitted now; no count changes, so writing it gives nothing away.
// (The rolling window's anchor is ring.rebased.)

// anchorGCRA moves a GCRA state written after now back to now, keeping the
// debt it had left, and returns it.
func anchorGCRA(st *gcraState, now int64) gcraState {
	if st.at > now {
		st.tat -= st.at - now
		st.at = now
	}
	return *st
}

// anchorWindow reads a fixed or sliding window's state of a window that
// starts after now (written later, under any period) as now's window, and
// returns it.
func anchorWindow(st *window, r *backend.Request, now int64) window {
	P := micros(r.Period)
	if ws := windowStart(now, P); st.start > now {
		st.start, st.exp = ws, ws+P
		if r.Algorithm == backend.SlidingWindow && st.b > 0 {
			st.exp = ws + 2*P
		}
	}
	return *st
}

// anchorLog makes the runs of a sliding log later than now one run at
// now, and returns the log.
func anchorLog(st *logState, r *backend.Request, now int64) logState {
	if st.n == 0 || st.at(st.n-1).t <= now {
		return *st
	}
	v := logView{st: *st}
	*st, _ = v.commit(now, micros(r.Period))
	return *st
}

// anchorLeases moves the leases of a state written after now back by as
// much (one shift for all), then drops the expired ones for good, and
// returns the state, which may hold no lease any more.
func anchorLeases(ls *leaseSet, now int64) *leaseSet {
	if ls.at > now {
		ls.shift += ls.at - now
		ls.at = now
	}
	for l := ls.first; l != nil && ls.expOf(l) <= now; l = ls.first {
		ls.unlink(l)
		delete(ls.byID, l.id)
		ls.count -= l.n
		ls.at = now
	}
	return ls
}

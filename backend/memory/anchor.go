package memory

import "github.com/ceiling-go/ceiling/backend"

// A clock behind the state (ALGORITHMS.md): a state that stores a time
// later than now is anchored at now where it is stored, by whichever
// request reads it first, whatever that request's call decides. No unit is
// forgotten, and none keeps counting for longer than it would had it been
// admitted now: a failover to a replica hours behind does not hold a key
// for hours. The anchored state changes no count, so writing it on a
// rejection or a peek gives nothing away. (The rolling window's anchor is
// ring.rebased.)

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
// much (one shift for all), so that each has the time it had left at the
// write, then drops the leases that have expired, for good: a write as of
// now, whatever the call decides. It returns the state, which may hold no
// lease any more.
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

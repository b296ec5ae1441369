package memory

import "github.com/ceiling-go/ceiling/backend"

// The sliding log of ALGORITHMS.md at O(1) amortized cost per decision: a
// ring of runs, oldest first, and the units they hold, so a decision drops
// expired runs from the front, appends at the back, and reads only the
// runs it needs.

// run is n units admitted at the same instant t, one entry whatever n.
// Runs have distinct instants, none later than now (anchorLog); a stamped
// refund can leave a run of 0 units, which goes when it reaches an end.
type run struct{ t, n int64 }

// logState is a sliding log: n runs in a ring whose length is a power of
// two (or zero), the oldest at head; k the units they hold; exp the time
// its newest unit leaves the window (the key is then full again).
type logState struct {
	exp     int64
	k       int64
	head, n int
	ring    []run
}

func logExpiry(l *logState) int64 { return l.exp }

// at returns the i-th oldest run.
func (l *logState) at(i int) *run { return &l.ring[(l.head+i)&(len(l.ring)-1)] }

// push appends r as the newest run, doubling the ring when it is full.
func (l *logState) push(r run) {
	if l.n == len(l.ring) {
		l.resize(max(4, 2*len(l.ring)))
	}
	*l.at(l.n) = r
	l.n++
}

// resize moves the runs, oldest first, to a ring of size (a power of two
// that holds them).
func (l *logState) resize(size int) {
	ring := make([]run, size)
	for i := range l.n {
		ring[i] = *l.at(i)
	}
	l.ring, l.head = ring, 0
}

// clone returns a copy of l that shares no memory with it.
func (l *logState) clone() logState {
	c := *l
	c.ring = append([]run(nil), l.ring...)
	return c
}

// logView is a sliding log as a decision sees it, without copying its
// runs: the stored runs less the expired ones and the newest units
// refunded, plus units added at now. Only the last request on a key in a
// call writes its view back.
type logView struct {
	st      logState // the stored log (its ring shared), unchanged until commit
	drop    int      // leading runs of st that have expired
	dropped int64    // the units in them
	remove  int64    // newest units of the live runs taken back
	add     int64    // units added at now
	// owned: st's ring is the view's to change before commit (a lone
	// request's, or a copy), so a stamped refund edits it in place.
	owned bool
}

func newLogView(st logState, now, P int64) logView {
	v := logView{st: st}
	for v.drop < st.n && st.at(v.drop).t+P <= now {
		v.dropped += st.at(v.drop).n
		v.drop++
	}
	return v
}

// live is the number of units of the stored runs that still count.
func (v *logView) live() int64 { return v.st.k - v.dropped - v.remove }

func (v *logView) count() int64 { return v.live() + v.add }

// unit returns the time of the i-th oldest unit (0-based), walking from
// the oldest live run: at a log's limit, the oldest is the one asked for.
func (v *logView) unit(i, now int64) int64 {
	if i < v.live() {
		for j := v.drop; j < v.st.n; j++ {
			r := v.st.at(j)
			if i < r.n {
				return r.t
			}
			i -= r.n
		}
	}
	return now
}

// newest returns the time of the newest unit, walking back only over the
// runs refunds took.
func (v *logView) newest(now int64) int64 {
	if v.add > 0 {
		return now
	}
	rm := v.remove
	for j := v.st.n - 1; j >= v.drop; j-- {
		r := v.st.at(j)
		if r.n > rm {
			return r.t
		}
		rm -= r.n
	}
	return now
}

// logStep decides r on a sliding log, updating the view.
func logStep(r *backend.Request, now int64, v *logView, res *backend.Result) bool {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	k := v.count()
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && c > L-k {
		res.Allowed = false
		if c > L {
			res.RetryAfter = backend.Never
		} else {
			res.RetryAfter = dur(v.unit(k+c-L-1, now) + P - now)
		}
		logAfter(res, L, P, now, k, v)
		return false
	}
	switch {
	case c > 0:
		v.add = addCount(v.add, c)
	case c < 0 && r.Stamp != 0:
		v.takeStamped(now, P, r.Stamp, neg(c))
	case c < 0:
		g := min(neg(c), k)
		if g <= v.add {
			v.add -= g
		} else {
			v.remove += g - v.add
			v.add = 0
		}
	}
	logAfter(res, L, P, now, v.count(), v)
	if c > 0 {
		res.Stamp = now
	}
	return true
}

// takeStamped gives back up to g units of the live run admitted at stamp,
// committing the view to its log (a copy unless owned) and then finding
// the run by binary search.
func (v *logView) takeStamped(now, P, stamp, g int64) {
	if !v.owned {
		v.st = v.st.clone()
		v.owned = true
	}
	v.st, _ = v.commit(now, P)
	v.drop, v.dropped, v.remove, v.add = 0, 0, 0, 0
	st := &v.st
	lo, hi := 0, st.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if st.at(m).t < stamp {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == st.n || st.at(lo).t != stamp {
		return
	}
	r := st.at(lo)
	t := min(g, r.n)
	r.n -= t
	st.k -= t
	st.trim()
}

// trim drops runs of 0 units from both ends of the log.
func (l *logState) trim() {
	for l.n > 0 && l.at(l.n-1).n == 0 {
		l.n--
	}
	for l.n > 0 && l.at(0).n == 0 {
		l.head = (l.head + 1) & (len(l.ring) - 1)
		l.n--
	}
}

func logAfter(res *backend.Result, L, P, now, k int64, v *logView) {
	res.Remaining = max(0, L-k)
	if k > 0 {
		res.ResetAfter = dur(v.newest(now) + P - now)
	}
	if k >= L {
		res.NextAfter = dur(v.unit(k-L, now) + P - now)
	}
}

// commit applies the view to its log's ring (the stored one, to be
// replaced, or a copy) and returns the log to store; false when empty.
func (v *logView) commit(now, P int64) (logState, bool) {
	st := &v.st
	st.head = (st.head + v.drop) & max(0, len(st.ring)-1)
	st.n -= v.drop
	st.k -= v.dropped
	if st.n > 1 && st.at(st.n-2).t >= now {
		// The clock is behind: the runs from now on become one run at now.
		last := st.at(st.n - 1)
		for st.n > 1 && st.at(st.n-2).t >= now {
			last.n += st.at(st.n - 2).n
			*st.at(st.n - 2) = *last
			st.n--
			last = st.at(st.n - 1)
		}
	}
	if st.n > 0 && st.at(st.n-1).t > now {
		st.at(st.n - 1).t = now
	}
	for rm := v.remove; rm > 0 && st.n > 0; {
		last := st.at(st.n - 1)
		if last.n > rm {
			last.n -= rm
			st.k -= rm
			break
		}
		rm -= last.n
		st.k -= last.n
		st.n--
	}
	if v.add > 0 {
		if st.n > 0 && st.at(st.n-1).t == now {
			last := st.at(st.n - 1)
			n := addCount(last.n, v.add)
			st.k += n - last.n
			last.n = n
		} else {
			st.push(run{t: now, n: v.add})
			st.k += v.add
		}
	}
	st.trim()
	if st.n == 0 {
		return logState{}, false
	}
	if len(st.ring) > 16 && len(st.ring) > 4*st.n {
		// A burst grew the log; most of it has expired: give the memory back.
		size := 16
		for size < 2*st.n {
			size *= 2
		}
		st.resize(size)
	}
	st.exp = st.at(st.n-1).t + P
	return *st, true
}

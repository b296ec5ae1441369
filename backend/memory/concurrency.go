package memory

import "github.com/ceiling-go/ceiling/backend"

// The Concurrency algorithm of ALGORITHMS.md: leases held until released
// or expired.
//
// A key's leases are a list ordered by expiry and a map from id to node,
// so a decision costs O(1) in live leases: expired ones leave from the
// front, acquisitions and renewals go to the back (past longer periods'
// leases, when rules share a key), releases unlink by id. The state changes
// in place; a multi-request call records each change (leaseUndo) to take
// it back on rejection.

// lease is one acquisition: n units held by id until exp (µs, less the
// set's shift), between prev and next in order of expiry.
type lease struct {
	id, n, exp int64
	prev, next *lease
}

// leaseSet is a Concurrency key's state: its leases in order of expiry,
// indexed by id, and the units they hold. at is the now of the last write;
// shift moves every stored expiry back at once when the clock is found
// behind at (anchorLeases): a lease's expiry is its exp less shift.
type leaseSet struct {
	byID        map[int64]*lease
	first, last *lease
	count       int64
	at, shift   int64
}

func newLeaseSet() *leaseSet { return &leaseSet{byID: map[int64]*lease{}} }

func (ls *leaseSet) expOf(l *lease) int64 { return l.exp - ls.shift }

// leaseExpiry is when the key is back to full: its last lease's expiry.
func leaseExpiry(st **leaseSet) int64 {
	ls := *st
	if ls.last == nil {
		return 0
	}
	return ls.expOf(ls.last)
}

// unlink takes l out of the list, leaving its own links for a later
// relink.
func (ls *leaseSet) unlink(l *lease) {
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		ls.first = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	} else {
		ls.last = l.prev
	}
}

// linkAfter puts l in the list right after prev (nil: first).
func (ls *leaseSet) linkAfter(l, prev *lease) {
	l.prev = prev
	if prev != nil {
		l.next, prev.next = prev.next, l
	} else {
		l.next, ls.first = ls.first, l
	}
	if l.next != nil {
		l.next.prev = l
	} else {
		ls.last = l
	}
}

// place links l, expiring at exp, where the order of expiry puts it:
// at the back unless a later expiry is there (another period).
func (ls *leaseSet) place(l *lease, exp int64) {
	l.exp = exp + ls.shift
	prev := ls.last
	for prev != nil && prev.exp > l.exp {
		prev = prev.prev
	}
	ls.linkAfter(l, prev)
}

// leaseUndo records one change of a multi-request call, to take back on
// rejection: a lease added, released or changed (its n, exp and place
// after prev before), and the set's write time before it.
type leaseUndo struct {
	ls         *leaseSet
	l          *lease
	added      bool
	removed    bool
	n, exp, at int64
	prev       *lease
}

// rollback takes back the changes of undo, newest first.
func rollback(undo []leaseUndo) {
	for i := len(undo) - 1; i >= 0; i-- {
		u := &undo[i]
		ls, l := u.ls, u.l
		ls.at = u.at
		switch {
		case l == nil: // only the write time changed
		case u.added:
			ls.unlink(l)
			delete(ls.byID, l.id)
			ls.count -= l.n
		case u.removed:
			ls.linkAfter(l, u.prev)
			ls.byID[l.id] = l
			ls.count += u.n
		default:
			ls.unlink(l)
			ls.linkAfter(l, u.prev)
			ls.count += u.n - l.n
		}
		if l != nil {
			l.n, l.exp = u.n, u.exp
		}
	}
}

// leaseStep decides r on an anchored Concurrency state ls (nil: absent),
// changing it in place and recording each change in *undo (when not nil).
// It returns the state (new when ls was nil and r adds a lease); false
// means r was rejected and nothing changed.
func leaseStep(r *backend.Request, now int64, ls *leaseSet, res *backend.Result, undo *[]leaseUndo) (*leaseSet, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	*res = backend.Result{Allowed: true, Limit: L}
	var held *lease
	var count int64
	if ls != nil {
		held, count = ls.byID[r.Lease], ls.count
	}
	record := func(l *lease, added, removed bool) {
		if undo != nil {
			*undo = append(*undo, leaseUndo{ls: ls, l: l, added: added, removed: removed, n: l.n, exp: l.exp, at: ls.at, prev: l.prev})
		}
	}
	switch {
	case c > 0 && held != nil:
		// A renewal, or an acquisition retried: the same units, longer.
		record(held, false, false)
		ls.unlink(held)
		ls.place(held, now+P)
		ls.at = now
	case c > 0 && !r.Force && c > L-count:
		res.Allowed = false
		res.RetryAfter = backend.Never
		if c <= L {
			res.RetryAfter = dur(ls.wait(count, L, c, now))
		}
		ls.report(res, L, now)
		return ls, false
	case c > 0:
		if ls == nil {
			ls = newLeaseSet()
		}
		l := &lease{id: r.Lease, n: c}
		ls.place(l, now+P)
		ls.byID[l.id] = l
		ls.count += c
		record(l, true, false)
		ls.at = now
	case c < 0 && held != nil:
		record(held, false, held.n+c <= 0)
		if held.n+c <= 0 {
			ls.unlink(held)
			delete(ls.byID, held.id)
			ls.count -= held.n
		} else {
			held.n += c
			ls.count += c
		}
		ls.at = now
	case c < 0 && ls != nil:
		// A lease nobody holds: nothing to give back, but a write all
		// the same, as of now.
		if undo != nil {
			*undo = append(*undo, leaseUndo{ls: ls, at: ls.at})
		}
		ls.at = now
	}
	ls.report(res, L, now)
	return ls, true
}

// wait is the time until enough leases expire for c <= L more units to
// fit under L, if none is released or renewed.
func (ls *leaseSet) wait(count, L, c, now int64) int64 {
	for l := ls.first; l != nil; l = l.next {
		count -= l.n
		if count+c <= L {
			return ls.expOf(l) - now
		}
	}
	return 0 // unreachable for c <= L: with every lease gone, c fits
}

// report fills res's remaining, reset and next for the key's leases.
func (ls *leaseSet) report(res *backend.Result, L, now int64) {
	if ls == nil || ls.last == nil {
		res.Remaining = L
		return
	}
	res.Remaining = max(0, L-ls.count)
	res.ResetAfter = dur(ls.expOf(ls.last) - now)
	if res.Remaining == 0 {
		res.NextAfter = dur(ls.wait(ls.count, L, 1, now))
	}
}

// putLeases stores a Concurrency key's state at slot i (-1: absent),
// deleting the key when it holds no lease. It reports whether it inserted
// or deleted.
func (s *Store) putLeases(sh *shard, h keyHash, i int, r *backend.Request, ls *leaseSet, now int64) bool {
	live := ls != nil && ls.last != nil
	exp := int64(0)
	if live {
		exp = ls.expOf(ls.last)
	}
	return put(s, sh, &sh.leases, h, i, r, ls, live, exp, now)
}

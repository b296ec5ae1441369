package memory

import (
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// smallCall is the number of requests a decision handles on the stack.
const smallCall = 8

// pending is one request of a multi-request decision: where its key lives
// and the state it would write.
type pending struct {
	h     keyHash
	shard uint32
	dup   int32 // the previous request on the same key and algorithm, or -1
	last  bool  // no later request on the same key: this one writes
	dirty bool  // this request or an earlier one on its key changes state
	ok    bool  // admitted when evaluated
	idx   int   // the key's slot when loaded, -1 if absent

	tat   gcraState
	win   window
	log   logView
	roll  ring32
	rtier rollTier // the rolling window's tier when loaded
	// logP is the period log's view was built with; writeP the period of
	// the last request on the key that wrote (a sliding log's expiry).
	logP, writeP time.Duration
	cc           *leaseSet
	// emptied reports that loading the key dropped its last lease.
	emptied bool
}

// decideMany decides several requests atomically: lock every shard
// involved in ascending order (so concurrent calls cannot deadlock),
// evaluate all requests on the state as it is, and write only when none is
// rejected (shadow requests excepted: see backend.Request.Shadow).
func (s *Store) decideMany(reqs []backend.Request, results []backend.Result, pend []pending) {
	var idBuf [smallCall]uint32
	ids := idBuf[:0]
	for i := range reqs {
		p := &pend[i]
		*p = pending{h: s.hash(reqs[i].Key), dup: -1, last: true}
		p.shard = uint32(p.h.b >> s.shift)
		for j := i - 1; j >= 0; j-- {
			if pend[j].h == p.h && reqs[j].Algorithm == reqs[i].Algorithm {
				p.dup = int32(j)
				pend[j].last = false
				break
			}
		}
		ids = insertSorted(ids, p.shard)
	}
	for _, id := range ids {
		s.shards[id].mu.Lock()
	}
	now := s.now() // under the locks: see decideOne

	rejected := false
	var undo []leaseUndo // the Concurrency states' changes, in place
	for i := range reqs {
		r, p := &reqs[i], &pend[i]
		if p.dup >= 0 {
			q := &pend[p.dup]
			p.tat, p.win, p.log, p.roll, p.cc, p.dirty, p.idx, p.rtier = q.tat, q.win, q.log, q.roll, q.cc, q.dirty, q.idx, q.rtier
			p.logP, p.writeP = q.logP, q.writeP
			if r.Algorithm == backend.RollingWindow && p.idx >= 0 {
				// Under another bucket width than the loading request's,
				// the clock may be behind the stored state: anchored as
				// load would have, whatever the call has written so far.
				rt := &s.shards[p.shard].rolls
				stored := rt.load(p.rtier, p.idx)
				if moved, ok := stored.rebased(micros(r.Period), now); ok {
					rt.set(p.rtier, p.idx, &moved)
					if !p.dirty {
						p.roll = moved
					}
				}
			}
		} else {
			s.load(&s.shards[p.shard], r, p, now)
		}
		tat, win, log, roll, logP, cc := p.tat, p.win, p.log, p.roll, p.logP, p.cc
		if r.Algorithm == backend.SlidingLog && r.Period != p.logP {
			p.relog(r.Period, now)
		}
		p.ok = s.step(r, p, now, &results[i], &undo)
		if p.ok && r.Cost != 0 {
			p.dirty, p.writeP = true, r.Period
		} else {
			// A peek or a rejection writes nothing: a later request on the
			// key, maybe under another period, sees the state unchanged.
			p.tat, p.win, p.log, p.roll, p.logP, p.cc = tat, win, log, roll, logP, cc
		}
		// A shadow request reports its own rejection but blocks nothing.
		rejected = rejected || (!p.ok && !r.Shadow)
	}

	if rejected {
		// Nothing is written: the requests that would have been admitted
		// report their key's unchanged state, as a peek.
		rollback(undo)
		for i := range reqs {
			if !pend[i].ok {
				continue
			}
			peek := reqs[i]
			peek.Cost, peek.Force = 0, false
			p := pending{h: pend[i].h}
			s.load(&s.shards[pend[i].shard], &peek, &p, now)
			s.step(&peek, &p, now, &results[i], nil)
		}
		// Keys whose every lease had expired go, whatever the call decided.
		for i := range reqs {
			if p := &pend[i]; p.emptied && p.dup < 0 {
				sh := &s.shards[p.shard]
				if j := sh.leases.find(p.h); j >= 0 && sh.leases.slots[j].v.last == nil {
					sh.leases.deleteAt(j)
				}
			}
		}
	} else {
		// Slots found while loading stay valid until a write inserts or
		// deletes a key; after that, keys are looked up again.
		moved := false
		for i := range reqs {
			if p := &pend[i]; p.last && p.dirty {
				if moved {
					p.idx = -2
				}
				moved = s.store(&s.shards[p.shard], &reqs[i], p, now) || moved
			}
		}
	}

	for _, id := range ids {
		s.shards[id].mu.Unlock()
	}
}

// insertSorted adds id to the ascending, duplicate-free ids.
func insertSorted(ids []uint32, id uint32) []uint32 {
	i := len(ids)
	for i > 0 && ids[i-1] > id {
		i--
	}
	if i > 0 && ids[i-1] == id {
		return ids
	}
	ids = append(ids, 0)
	copy(ids[i+1:], ids[i:])
	ids[i] = id
	return ids
}

// load reads the stored state of p's key into p.
func (s *Store) load(sh *shard, r *backend.Request, p *pending, now int64) {
	switch r.Algorithm {
	case backend.RollingWindow:
		if p.rtier, p.idx = sh.rolls.find(p.h, tierOf(r)); p.idx >= 0 {
			p.roll = sh.rolls.load(p.rtier, p.idx)
			if moved, ok := p.roll.rebased(micros(r.Period), now); ok {
				p.roll = moved // the clock is behind: anchored, and written so
				sh.rolls.set(p.rtier, p.idx, &moved)
			}
		}
	case backend.GCRA:
		if p.idx = sh.gcra.find(p.h); p.idx >= 0 {
			p.tat = anchorGCRA(&sh.gcra.slots[p.idx].v, now)
		}
	case backend.FixedWindow, backend.SlidingWindow:
		if p.idx = sh.windows.find(p.h); p.idx >= 0 {
			p.win = anchorWindow(&sh.windows.slots[p.idx].v, r, now)
		}
	case backend.SlidingLog:
		var st logState
		if p.idx = sh.logs.find(p.h); p.idx >= 0 {
			st = anchorLog(&sh.logs.slots[p.idx].v, r, now)
		}
		p.log = newLogView(st, now, micros(r.Period))
		p.logP = r.Period
	case backend.Concurrency:
		if p.idx = sh.leases.find(p.h); p.idx >= 0 {
			// Expired leases are dropped for good: the key is stored (or
			// deleted, when none is left) whatever the call decides.
			if p.cc = anchorLeases(sh.leases.slots[p.idx].v, now); p.cc.last == nil {
				p.emptied, p.dirty = true, true
			}
		}
	}
}

// relog rebuilds p's sliding-log view for a request under another period
// than the view's (two rules sharing a key): the log as the call has left
// it so far, its expired units dropped under period.
func (p *pending) relog(period time.Duration, now int64) {
	st := p.log.st
	if p.dirty {
		// Written so far under writeP: commit that to a copy, leaving the
		// stored runs alone until the call is known to be admitted.
		v := p.log
		v.st = st.clone()
		st, _ = v.commit(now, micros(p.writeP))
	}
	p.log = newLogView(st, now, micros(period))
	p.logP = period
}

// step evaluates r on p's state, leaving in p the state it would write. A
// Concurrency state is changed in place, each change recorded in *undo
// (nil: a peek, which changes nothing).
func (s *Store) step(r *backend.Request, p *pending, now int64, out *backend.Result, undo *[]leaseUndo) bool {
	var ok bool
	switch r.Algorithm {
	case backend.RollingWindow:
		p.roll, ok = rollingStep(r, now, p.roll, out)
	case backend.GCRA:
		p.tat, ok = gcraStep(r, now, p.tat, out)
	case backend.FixedWindow:
		p.win, ok = fixedStep(r, now, p.win, out)
	case backend.SlidingWindow:
		p.win, ok = slidingStep(r, now, p.win, out)
	case backend.SlidingLog:
		ok = logStep(r, now, &p.log, out)
	case backend.Concurrency:
		p.cc, ok = leaseStep(r, now, p.cc, out, undo)
	}
	return ok
}

// store writes p's state for its key at slot p.idx, or wherever it is now
// when p.idx is -2. It reports whether it inserted or deleted a key (which
// moves other keys' slots).
func (s *Store) store(sh *shard, r *backend.Request, p *pending, now int64) bool {
	switch r.Algorithm {
	case backend.RollingWindow:
		if p.idx == -2 {
			p.rtier, p.idx = sh.rolls.find(p.h, tierOf(r))
		}
		return s.putRolling(sh, p.h, p.rtier, p.idx, r, &p.roll, now)
	case backend.GCRA:
		if p.idx == -2 {
			p.idx = sh.gcra.find(p.h)
		}
		return s.putGCRA(sh, p.h, p.idx, r, p.tat, now)
	case backend.FixedWindow, backend.SlidingWindow:
		if p.idx == -2 {
			p.idx = sh.windows.find(p.h)
		}
		return s.putWindow(sh, p.h, p.idx, r, p.win, now)
	case backend.SlidingLog:
		if p.idx == -2 {
			p.idx = sh.logs.find(p.h)
		}
		return s.putLog(sh, p.h, p.idx, r, &p.log, now, micros(p.writeP))
	case backend.Concurrency:
		if p.idx == -2 {
			p.idx = sh.leases.find(p.h)
		}
		return s.putLeases(sh, p.h, p.idx, r, p.cc, now)
	}
	return false
}

package memory

import (
	"slices"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

// settledSet holds the tickets of reservations and the records of forced
// charges, by [backend.Request.Once], so that a settlement delivered twice
// is not applied again (ALGORITHMS.md, Once). A Store cannot lose a reply,
// and ceiling's limiter sends it no Once; it honours one all the same, so
// that the contract holds on every backend. Calls that carry a Once take
// its lock around their decision: they are serialized with each other,
// never with other calls, and allocate. The set drops lapsed entries
// whenever it has doubled since it last did.
type settledSet struct {
	mu    sync.Mutex
	exp   map[settledKey]onceEntry
	swept int // len(exp) after the last sweep
}

// settledKey is one settlement: its key's digest (a Store keeps no key
// string) and its Once.
type settledKey struct {
	h    keyHash
	once int64
}

// onceEntry is a reservation's ticket or a forced charge's record, live
// until exp (µs).
type onceEntry struct {
	exp    int64
	ticket bool
}

// decideOnce decides reqs, valid and holding a Once: a refund whose ticket
// does not stand and a forced charge whose record does are decided as
// peeks, each request seeing the entries its call's earlier requests
// left. Unless the call was rejected, it then writes what the call left:
// a ticket for each reservation that placed units, none for an applied
// refund, a record for an applied forced charge.
func (s *Store) decideOnce(reqs []backend.Request, results []backend.Result) {
	o := &s.settled
	o.mu.Lock()
	defer o.mu.Unlock()
	now := s.now()
	local := slices.Clone(reqs)
	keys := make([]settledKey, len(local))
	seen := map[settledKey]onceEntry{} // the call's entries, as its requests leave them
	for i := range local {
		r := &local[i]
		if r.Once == 0 {
			continue
		}
		keys[i] = settledKey{s.hash(r.Key), r.Once}
		e, ok := seen[keys[i]]
		if !ok {
			e = o.exp[keys[i]]
		}
		live := e.exp > now
		switch {
		case r.Cost < 0 && !(live && e.ticket), r.Force && live && !e.ticket:
			r.Cost, r.Force, r.Stamp, r.Once = 0, false, 0, 0 // applied, or its ticket gone: a peek
		case r.Cost < 0:
			seen[keys[i]] = onceEntry{}
		case r.Force:
			seen[keys[i]] = onceEntry{exp: now + micros(backend.OnceKept(r.Period))}
		}
	}
	s.decide(local, results)
	for i, r := range local {
		if r.Cost > 0 && !r.Force && !r.Shadow && !results[i].Allowed {
			return // rejected: nothing was applied
		}
	}
	for i, r := range local {
		if r.Once != 0 && r.Cost > 0 && !r.Force && results[i].Allowed {
			seen[keys[i]] = onceEntry{exp: now + micros(backend.TicketKept(r.Period)), ticket: true}
		}
	}
	if o.exp == nil {
		o.exp = map[settledKey]onceEntry{}
	}
	if len(o.exp) >= 2*max(o.swept, 512) {
		for k, e := range o.exp {
			if e.exp <= now {
				delete(o.exp, k)
			}
		}
		o.swept = len(o.exp)
	}
	for k, e := range seen {
		if e.exp == 0 {
			delete(o.exp, k)
		} else {
			o.exp[k] = e
		}
	}
}

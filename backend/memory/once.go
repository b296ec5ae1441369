package memory

import (
	"slices"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

// settledSet records the settlements a Store applied by their
// [backend.Request.Once], so that a second delivery is not applied again.
// A Store cannot lose a reply, and ceiling's limiter sends it no Once; it
// honours one all the same, so that the contract holds on every backend.
// Calls that carry a Once take its lock around their decision: they are
// serialized with each other, never with other calls, and allocate. A
// record lapses backend.OnceKept of its Period after it was applied; the set drops
// lapsed records whenever it has doubled since it last did.
type settledSet struct {
	mu    sync.Mutex
	exp   map[settledKey]int64 // µs: when the record may go
	swept int                  // len(exp) after the last sweep
}

// settledKey is one settlement: its key's digest (a Store keeps no key
// string) and its Once.
type settledKey struct {
	h    keyHash
	once int64
}

// decideOnce decides reqs, valid and holding a Once, with every settlement
// already recorded (or named twice in the call) decided as a peek, and
// records the call's settlements unless it was rejected.
func (s *Store) decideOnce(reqs []backend.Request, results []backend.Result) {
	o := &s.settled
	o.mu.Lock()
	defer o.mu.Unlock()
	now := s.now()
	local := slices.Clone(reqs)
	keys := make([]settledKey, len(local))
	for i := range local {
		r := &local[i]
		if r.Once == 0 {
			continue
		}
		keys[i] = settledKey{s.hash(r.Key), r.Once}
		if exp, ok := o.exp[keys[i]]; (ok && exp > now) || slices.Contains(keys[:i], keys[i]) {
			r.Cost, r.Force, r.Stamp, r.Once = 0, false, 0, 0 // applied: answered as a peek
		}
	}
	s.decide(local, results)
	for i, r := range local {
		if r.Cost > 0 && !r.Force && !r.Shadow && !results[i].Allowed {
			return // rejected: nothing was applied
		}
	}
	if o.exp == nil {
		o.exp = map[settledKey]int64{}
	}
	if len(o.exp) >= 2*max(o.swept, 512) {
		for k, exp := range o.exp {
			if exp <= now {
				delete(o.exp, k)
			}
		}
		o.swept = len(o.exp)
	}
	for i, r := range local {
		if r.Once != 0 {
			o.exp[keys[i]] = now + micros(backend.OnceKept(r.Period))
		}
	}
}

package model

import "github.com/ceiling-go/ceiling/backend"

// denyCache is the Redis deny cache as backend/redis.WithDenyCache documents
// it, unbounded: a rejection of an unforced, non-shadow request until T
// (its RetryAfter) is answered locally, for the same key, rule and cost,
// until T.
type denyCache struct {
	entries map[string]denial
}

// denial is one remembered rejection of req; times in µs.
type denial struct {
	req                               backend.Request
	until, remaining, resetAt, nextAt int64
	// seen is the latest call on the key the backend answered: a clock
	// that reads earlier is behind a state the backend anchors at its new
	// now, which shortens the wait until promised.
	seen int64
}

// answer rejects reqs locally when one of its unforced, non-shadow,
// positive-cost requests is on a denied key with the same cost.
func (d *denyCache) answer(now int64, reqs []backend.Request) ([]backend.Result, bool) {
	var res []backend.Result
	for i, r := range reqs {
		if r.Force || r.Shadow || r.Cost <= 0 {
			continue
		}
		e, ok := d.entries[r.Key]
		if !ok || !sameRule(e.req, r) || roomBefore(reqs, i) {
			continue
		}
		if now >= e.until || now < e.seen {
			delete(d.entries, r.Key)
			continue
		}
		if res == nil {
			// The requests the cache does not deny are not read.
			res = make([]backend.Result, len(reqs))
			for j, o := range reqs {
				res[j] = backend.Result{Allowed: true, Limit: o.Limit, Unread: true, Cached: true}
			}
		}
		res[i] = backend.Result{
			Limit:      r.Limit,
			Remaining:  e.remaining,
			ResetAfter: dur(max(0, e.resetAt-now)),
			RetryAfter: dur(e.until - now),
			NextAfter:  dur(max(0, e.nextAt-now)),
			Cached:     true,
		}
	}
	return res, res != nil
}

// learn remembers the rejections of a call the backend answered, and
// forgets the keys a call refunded or wrote under another rule than their
// denial's, and those it answered at a clock behind their denial's (the
// backend anchored their state, whatever the request: a peek too). A
// rejection is remembered only when the request saw its key's stored
// state: an earlier request of the call on the same key that would have
// written makes the rejection one of a state the rejected call never
// wrote.
func (d *denyCache) learn(now int64, reqs []backend.Request, res []backend.Result, rejected bool) {
	for i, r := range reqs {
		if e, ok := d.entries[r.Key]; ok && now < e.seen {
			delete(d.entries, r.Key)
		}
		switch {
		case rejected:
			// ALGORITHMS.md: a concurrency rejection is never remembered (a
			// release on any instance can free a slot at any moment).
			if r.Cost > 0 && !r.Force && !r.Shadow && !res[i].Allowed && res[i].RetryAfter > 0 && !wroteBefore(reqs, res, i) &&
				r.Algorithm != backend.Concurrency {
				d.entries[r.Key] = denial{
					req:       r,
					until:     now + micros(res[i].RetryAfter),
					remaining: res[i].Remaining,
					resetAt:   now + micros(res[i].ResetAfter),
					nextAt:    now + micros(res[i].NextAfter),
					seen:      now,
				}
			}
		case r.Cost < 0:
			delete(d.entries, r.Key)
		case r.Cost > 0 && res[i].Allowed:
			if e, ok := d.entries[r.Key]; ok && !sameRule(e.req, r) {
				delete(d.entries, r.Key)
			} else if ok && now > e.seen {
				e.seen = now
				d.entries[r.Key] = e
			}
		}
	}
}

// wroteBefore reports whether a request before i on the same key would have
// written (admitted with a non-zero cost).
func wroteBefore(reqs []backend.Request, res []backend.Result, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && res[j].Allowed && reqs[j].Cost != 0 {
			return true
		}
	}
	return false
}

func (d *denyCache) forget(keys []string) {
	for _, k := range keys {
		delete(d.entries, k)
	}
}

// sameRule reports whether a and b ask for the same cost under the same
// rule: a denial answers only the request that was rejected.
func sameRule(a, b backend.Request) bool {
	return a.Algorithm == b.Algorithm && a.Limit == b.Limit && a.Period == b.Period && a.Burst == b.Burst && a.Cost == b.Cost
}

// roomBefore reports whether a request of the call before i on i's key may
// make room for it: a refund, or a charge under another rule (which may
// start its window over). Request i is then not the one the denial saw.
func roomBefore(reqs []backend.Request, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && (reqs[j].Cost < 0 || (reqs[j].Cost > 0 && !sameRule(reqs[j], reqs[i]))) {
			return true
		}
	}
	return false
}

package redis

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// denyCache remembers keys Redis rejected and until when (see
// WithDenyCache). It is safe for simultaneous use.
type denyCache struct {
	size int
	n    atomic.Int64 // entries, read without the lock on the fast path

	mu      sync.Mutex
	entries map[string]denial
	doubted map[string]time.Time // keys in doubt, until when (see doubt)
}

// denial is one rejection: the same request (rule and cost) on the key is
// rejected until until.
type denial struct {
	rule      rule
	until     time.Time
	remaining int64
	resetAt   time.Time
	nextAt    time.Time
	// seen is the latest answered call on the key: a clock that reads
	// earlier is behind a state the backend anchors at its new now.
	seen time.Time
}

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, entries: make(map[string]denial), doubted: make(map[string]time.Time)}
}

// answer rejects reqs locally, writing res, when one of its unforced,
// positive-cost, non-shadow requests is on a denied key.
func (d *denyCache) answer(reqs []backend.Request, res []backend.Result, now time.Time) bool {
	if d.n.Load() == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	denied := false
	for i, r := range reqs {
		if r.Force || r.Shadow || r.Cost <= 0 || d.doubtful(r.Key, now) {
			continue
		}
		e, found := d.entries[r.Key]
		if !found || e.rule != ruleOf(r) || roomBefore(reqs, i) {
			continue
		}
		if !now.Before(e.until) || now.Before(e.seen) {
			delete(d.entries, r.Key)
			d.n.Store(int64(len(d.entries)))
			continue
		}
		if !denied {
			denied = true
			for j, o := range reqs {
				res[j] = backend.Result{Allowed: true, Limit: o.Limit, Unread: true, Cached: true}
			}
		}
		res[i] = backend.Result{
			Limit:      r.Limit,
			Remaining:  e.remaining,
			ResetAfter: max(0, e.resetAt.Sub(now)),
			RetryAfter: e.until.Sub(now),
			NextAfter:  max(0, e.nextAt.Sub(now)),
			Cached:     true,
		}
	}
	return denied
}

// learn records a decision's rejections, and forgets the keys it may have
// made roomier: a refund's, a key written under another rule, a key
// answered at a clock behind the entry's (a peek included). now is when
// the call was sent, before the backend read its clock, so a rejection is
// never remembered past the instant the backend would admit again. A
// rejection after an earlier request of the call wrote the key says
// nothing about the next call, and is not remembered.
func (d *denyCache) learn(reqs []backend.Request, res []backend.Result, rejected bool, now time.Time) {
	if !rejected && d.n.Load() == 0 {
		return // nothing to learn, nothing to forget
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, r := range reqs {
		if e, found := d.entries[r.Key]; found && now.Before(e.seen) {
			// The backend anchored the key's state at this earlier clock,
			// whatever the request: the entry's instants are of the other.
			delete(d.entries, r.Key)
		}
		switch {
		case rejected:
			// a concurrency slot can come back at any moment: never remembered
			if r.Cost <= 0 || r.Force || r.Shadow || res[i].Allowed || res[i].RetryAfter <= 0 || wroteBefore(reqs, res, i) ||
				r.Algorithm == backend.Concurrency {
				continue
			}
			if _, found := d.entries[r.Key]; !found && len(d.entries) >= d.size {
				d.evict(now)
			}
			d.entries[r.Key] = denial{
				rule:      ruleOf(r),
				until:     now.Add(res[i].RetryAfter),
				remaining: res[i].Remaining,
				resetAt:   now.Add(res[i].ResetAfter),
				nextAt:    now.Add(res[i].NextAfter),
				seen:      now,
			}
		case r.Cost < 0:
			delete(d.entries, r.Key)
		case r.Cost > 0 && res[i].Allowed:
			if e, found := d.entries[r.Key]; found && e.rule != ruleOf(r) {
				delete(d.entries, r.Key)
			} else if found && now.After(e.seen) {
				e.seen = now
				d.entries[r.Key] = e
			}
		}
	}
	d.n.Store(int64(len(d.entries)))
}

// doubtFor is how long a key whose decision was sent and lost is not
// answered: longer than its caller takes to ask the cache next, even
// starved.
const doubtFor = starvedWait

// doubt records that a decision on reqs' keys was sent and may have been
// applied, though its caller got an error: for doubtFor the cache answers
// none of them, so the caller, which asks the cache next, never gets a
// rejection its own decision may have caused.
func (d *denyCache) doubt(reqs []backend.Request, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	until := now.Add(doubtFor)
	for _, r := range reqs {
		if _, found := d.doubted[r.Key]; !found && len(d.doubted) >= d.size {
			for k := range d.doubted { // full: drop one, at random
				delete(d.doubted, k)
				break
			}
		}
		d.doubted[r.Key] = until
	}
}

// doubtful reports whether key is in doubt at now, dropping an ended
// doubt. d.mu is held.
func (d *denyCache) doubtful(key string, now time.Time) bool {
	until, found := d.doubted[key]
	if !found {
		return false
	}
	if now.Before(until) {
		return true
	}
	delete(d.doubted, key)
	return false
}

// roomBefore reports whether a request of the call before i, on i's key,
// may make room for it: a refund, or a charge under another rule.
func roomBefore(reqs []backend.Request, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && (reqs[j].Cost < 0 || (reqs[j].Cost > 0 && ruleOf(reqs[j]) != ruleOf(reqs[i]))) {
			return true
		}
	}
	return false
}

// rule is what a denial must match besides the key.
type rule struct {
	alg          backend.Algorithm
	limit, burst int64
	period       time.Duration
	cost         int64
}

func ruleOf(r backend.Request) rule {
	return rule{alg: r.Algorithm, limit: r.Limit, burst: r.Burst, period: r.Period, cost: r.Cost}
}

// wroteBefore reports whether an admitted request of the call before i,
// on i's key, has a non-zero cost.
func wroteBefore(reqs []backend.Request, res []backend.Result, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && res[j].Allowed && reqs[j].Cost != 0 {
			return true
		}
	}
	return false
}

// micro truncates t to whole µs, the backends' resolution, keeping its
// monotonic reading.
func micro(t time.Time) time.Time {
	return t.Add(-time.Duration(t.Nanosecond() % 1000))
}

// evict drops the expired entries among a few (map order is random), or
// else the first: O(1) per insertion.
func (d *denyCache) evict(now time.Time) {
	looked, dropped := 0, false
	var first string
	for k, e := range d.entries {
		if looked == 0 {
			first = k
		}
		if !now.Before(e.until) {
			delete(d.entries, k)
			dropped = true
		}
		if looked++; looked == 8 {
			break
		}
	}
	if !dropped {
		delete(d.entries, first)
	}
}

// forget drops keys whose state was reset.
func (d *denyCache) forget(keys ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range keys {
		delete(d.entries, k)
	}
	d.n.Store(int64(len(d.entries)))
}

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
	// doubted are keys of a decision that was sent and whose outcome is
	// unknown (its reply lost or late), and until when the cache does not
	// answer them: see doubt.
	doubted map[string]time.Time
}

// denial is one rejection: the same request (the same rule and cost) on
// the key is rejected until until. (A larger cost is rejected too, but for
// longer than this entry knows: it goes to Redis for its true RetryAfter;
// another rule on the key, of another period or limit, is another answer.)
type denial struct {
	rule      rule
	until     time.Time
	remaining int64
	resetAt   time.Time
	nextAt    time.Time
	// seen is the latest call on the key that the backend answered: a
	// clock that reads earlier is behind a state the backend anchors at its
	// new now (ALGORITHMS.md), which shortens the wait until promised.
	seen time.Time
}

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, entries: make(map[string]denial), doubted: make(map[string]time.Time)}
}

// answer rejects reqs locally, writing res, when one of its unforced,
// positive-cost, non-shadow requests is on a denied key; it reports false,
// leaving res alone, when Redis must decide.
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

// learn records the rejections of a decision, and forgets the keys whose
// state it may have made roomier: a refund's, and a key written under
// another rule than its denial's (two rules of different periods sharing a
// key see different windows of it). now is when the call was sent, before
// the backend read its clock, so that a rejection is never remembered past
// the instant the backend would admit again.
//
// A rejected request is remembered only when it saw its key as stored: an
// earlier request of the call on the same key that would have written (an
// admitted one with a cost) makes the rejection one of a state the
// rejected call never wrote, which says nothing about the next call.
func (d *denyCache) learn(reqs []backend.Request, res []backend.Result, rejected bool, now time.Time) {
	if !rejected && d.n.Load() == 0 {
		return // nothing to learn, nothing to forget
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, r := range reqs {
		switch {
		case rejected:
			// A concurrency slot can come back at any moment (a release on
			// any instance): its rejection is never remembered.
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

// doubtFor is how long after a decision on a key was sent and lost
// (doubt) the cache does not answer the key: longer than the
// caller that lost it takes to ask the cache next, even on a process too
// busy to run it promptly (starvedWait).
const doubtFor = starvedWait

// doubt records that a decision on the keys of reqs was sent and may have
// been applied, though its caller got an error (its reply was lost, or
// came too late): for doubtFor, the cache answers no call on those keys.
// The caller,
// which asks the cache next (the limiter does, before its fail mode), then
// never gets a cached rejection learned while its own decision was out: a
// rejection of a state its own decision may have consumed from, which
// would break "a rejected request consumes nothing". After doubtFor the
// cache answers the key again from what it learned, since a rejection
// learned meanwhile holds for every later decision.
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

// doubtful reports whether key is in doubt for a call made at now,
// dropping a doubt that ended. d.mu is held.
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
// may make room for it: a refund, or a charge under another rule (which
// may see another window and start it over). Request i then is not the
// request the denial rejected.
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

// wroteBefore reports whether a request of the call before i, on i's key,
// would have written: admitted with a non-zero cost.
func wroteBefore(reqs []backend.Request, res []backend.Result, i int) bool {
	for j := range i {
		if reqs[j].Key == reqs[i].Key && res[j].Allowed && reqs[j].Cost != 0 {
			return true
		}
	}
	return false
}

// micro truncates t to whole microseconds, the backends' resolution,
// keeping its monotonic reading: the deny cache's deadlines then fall on
// the instants the backend's answers change at.
func micro(t time.Time) time.Time {
	return t.Add(-time.Duration(t.Nanosecond() % 1000))
}

// evict makes room for one entry: it drops the expired entries among a few
// it looks at (map order is random), or else the first of them, so that a
// full cache costs O(1) per insertion.
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

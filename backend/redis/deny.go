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
}

// denial is one rejection: requests on the key of the same cost are
// rejected until until. (A larger cost is rejected too, but for longer than
// this entry knows: it goes to Redis for its true RetryAfter.)
type denial struct {
	cost      int64
	until     time.Time
	remaining int64
	resetAt   time.Time
	nextAt    time.Time
}

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, entries: make(map[string]denial)}
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
		if r.Force || r.Shadow || r.Cost <= 0 {
			continue
		}
		e, found := d.entries[r.Key]
		if !found || r.Cost != e.cost {
			continue
		}
		if !now.Before(e.until) {
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

// learn records the rejections of a decision, and forgets keys that a
// decision refunded (a refund may have made room).
func (d *denyCache) learn(reqs []backend.Request, res []backend.Result, rejected bool, now time.Time) {
	var refunded bool
	for _, r := range reqs {
		refunded = refunded || r.Cost < 0
	}
	if !rejected && !refunded {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, r := range reqs {
		switch {
		case r.Cost < 0 && !rejected:
			delete(d.entries, r.Key)
		case r.Cost > 0 && !r.Force && !r.Shadow && !res[i].Allowed && res[i].RetryAfter > 0:
			if _, found := d.entries[r.Key]; !found && len(d.entries) >= d.size {
				d.evict(now)
			}
			d.entries[r.Key] = denial{
				cost:      r.Cost,
				until:     now.Add(res[i].RetryAfter),
				remaining: res[i].Remaining,
				resetAt:   now.Add(res[i].ResetAfter),
				nextAt:    now.Add(res[i].NextAfter),
			}
		}
	}
	d.n.Store(int64(len(d.entries)))
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

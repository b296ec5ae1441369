package failover

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Writes that must reach the backend after their call failed: settlements
// and slot releases that timed out or met an open breaker, and the release
// of a slot whose acquisition's outcome is unknown (its reply was lost).
// One goroutine per limiter resends them while any are pending, as soon as
// the backend answers again (a recovery or any answered call wakes it),
// then every so often, until each is applied or no longer matters: a
// lease ends and a unit stops counting at most a Period after the call
// that failed, so a write pending longer is dropped, counted and logged
// (a settlement sooner, see below).
//
// What is resent is what may be applied twice, or what surely was not
// applied, so that a settlement still takes effect at most once:
//
//   - a release of a lease is idempotent (the lease id names it: releasing
//     an absent lease does nothing), so it is resent whatever happened,
//     and so is the release of an acquisition whose reply was lost;
//   - a refund or a forced charge (a settlement under or over its
//     estimate) named by a [backend.Request.Once], as settle names every
//     settlement it sends to a remote backend, is resent whatever
//     happened: the backend answers a second delivery of it as a peek
//     for backend.OnceKept of Period (twice Period, at most
//     backend.OnceHold, a minute) after the first applied it, and this
//     loop gives it up within that, less twice the timeout, of its call's
//     failure (see Later): a retry over a slow moment, not the ride-out of
//     an outage;
//   - one without a Once is resent only when its call surely never reached
//     the backend: the breaker was open, or this process never got to send
//     it. Sent and not answered, it may have been applied, and applying it
//     again would be wrong: a second refund gives back units of other
//     requests (a stamp names where the refunded units went, not which
//     they were), a second charge bills the caller twice. It is dropped,
//     counted and logged.
//
// The bound of a settlement finally dropped (its Period passed, the
// pending bound, Close): a dropped refund leaves its reservation at its
// estimate (towards the limit); a dropped charge leaves uncounted what the
// request used past its estimate, at most the rule's capacity (settle caps
// it).

// MaxResends bounds the requests pending a resend, those a round is
// sending included; past it a write is dropped at once (counted and
// logged).
const MaxResends = 4096

// resendEvery is the longest wait between two rounds of resends while the
// backend does not answer; a recovery wakes the loop at once.
const resendEvery = time.Second

// resendGap is the shortest wait between two rounds of resends.
const resendGap = 100 * time.Millisecond

// ResendBatch is how many requests one call of a resend round carries at
// most (an item larger than that goes alone).
const ResendBatch = 256

// Resends is a limiter's pending writes and its resend loop. Set the
// function fields before the first Later; it is safe for simultaneous use
// after that.
type Resends struct {
	Group *Group
	// Send is one bounded call of reqs (skipped while the breaker is
	// open); Ready reports whether the backend is called at all (the
	// breaker is closed); Keep copies a key out of a reused arena;
	// Dropped logs n requests of a write given up for good, with the total.
	Send    func(reqs []backend.Request) error
	Ready   func() bool
	Keep    func(string) string
	Dropped func(n int, what, why string, total int64)
	// Timeout bounds one backend call: a settlement's resends end early
	// enough that the last is applied before its Once record lapses.
	Timeout time.Duration

	mu      sync.Mutex
	items   []resendItem
	n       int  // requests in items and in the round that runs
	running bool // a resend loop runs
	wake    chan struct{}
	once    sync.Once
	pending atomic.Int64 // requests in items, read on the hot path
	dropped atomic.Int64 // requests dropped for good
}

// resendItem is the requests of one failed call still to apply, and when
// they stop mattering.
type resendItem struct {
	reqs  []backend.Request
	until time.Time
	what  string
}

// Pending is how many requests wait for a resend.
func (r *Resends) Pending() int64 { return r.pending.Load() }

// DroppedTotal is how many requests were given up for good.
func (r *Resends) DroppedTotal() int64 { return r.dropped.Load() }

func (r *Resends) wakeChan() chan struct{} {
	r.once.Do(func() { r.wake = make(chan struct{}, 1) })
	return r.wake
}

// Resendable returns what of reqs, whose call failed with err, may be sent
// again (see the top of this file): releases and settlements named by a
// Once always, other refunds and forced charges only when the call was
// never sent (unsent). The acquisition of a slot becomes its release;
// renewals and peeks are not resent.
func Resendable(reqs []backend.Request, err error, unsent func(error) bool) []backend.Request {
	var out []backend.Request
	never := unsent(err)
	for _, q := range reqs {
		switch {
		case q.Cost == 0:
			continue
		case q.Algorithm == backend.Concurrency && q.Cost > 0 && !q.Force:
			if never {
				continue // not taken: nothing to give back
			}
			q.Cost = -q.Cost // an acquisition whose outcome is unknown
		case q.Algorithm == backend.Concurrency && q.Cost > 0:
			continue // a renewal: its timer tries again
		case q.Algorithm != backend.Concurrency && !never && q.Once == 0:
			continue // a settlement that may have been applied, and would be again
		}
		q.Shadow = false
		out = append(out, q)
	}
	return out
}

// Later queues what of reqs (whose call failed with err) may be sent
// again, and starts the resend loop. It reports how many requests were
// dropped instead.
func (r *Resends) Later(reqs []backend.Request, err error, what string) int {
	again := Resendable(reqs, err, Unsent)
	lost := settlements(reqs) - settlements(again)
	r.drop(lost, what, "its outcome is unknown, and applying it twice would be wrong")
	reqs = again
	if len(reqs) == 0 {
		return lost
	}
	// One item per deadline. A write is given up a Period after its call
	// failed; a settlement named by a Once sooner: its record lasts
	// backend.OnceKept(P) (2P, at most backend.OnceHold) from when the
	// failed call applied it, up to a timeout before it failed, and a
	// resend may be applied up to a timeout after it is sent, so it is
	// sent at most OnceKept(P) - 2×timeout after the failure (never, when
	// that is not positive). Kept longer, as long as a longer rule's, it
	// would find its record lapsed and be applied again.
	var items []resendItem
	now := time.Now()
	late := 0
	for _, q := range reqs {
		q.Key = r.Keep(q.Key) // the caller's arena is reused
		window := r.Window(q)
		if window <= 0 {
			late++
			continue
		}
		until := now.Add(window)
		j := slices.IndexFunc(items, func(it resendItem) bool { return it.until.Equal(until) })
		if j < 0 {
			j = len(items)
			items = append(items, resendItem{until: until, what: what})
		}
		items[j].reqs = append(items[j].reqs, q)
	}
	r.drop(late, what, "its Period is too short, beside the timeout, to send it again safely")
	lost += late
	n := len(reqs) - late
	if n == 0 {
		return lost
	}
	r.mu.Lock()
	if r.n+n > MaxResends {
		r.mu.Unlock()
		r.drop(n, what, "too many pending")
		return lost + n
	}
	r.items = append(r.items, items...)
	r.n += n
	r.pending.Store(int64(r.n))
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start && !r.Group.Go(r.loop) {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
		r.dropPending("the limiter is closed")
		return lost + n
	}
	r.Poke()
	return lost
}

// Window is how long after its call failed q may still be sent again (see
// Later): none when it is not positive.
func (r *Resends) Window(q backend.Request) time.Duration {
	if q.Once != 0 {
		return min(q.Period, backend.OnceKept(q.Period)-2*r.Timeout)
	}
	return q.Period
}

// settlements counts the refunds and charges of rate rules in reqs.
func settlements(reqs []backend.Request) int {
	n := 0
	for _, q := range reqs {
		if q.Cost != 0 && q.Algorithm != backend.Concurrency {
			n++
		}
	}
	return n
}

// Poke wakes the resend loop, if it waits: the backend answers.
func (r *Resends) Poke() {
	select {
	case r.wakeChan() <- struct{}{}:
	default:
	}
}

// loop resends pending writes while there are any: at once when woken (a
// recovery, an answered call, a new write), else every resendEvery. It
// returns when nothing is pending, or when the group stops, dropping what
// is left.
func (r *Resends) loop() {
	stop := r.Group.Stopping()
	t := time.NewTimer(resendEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			r.stop()
			return
		case <-r.wakeChan():
		case <-t.C:
		}
		if !r.round() {
			return
		}
		// At most one round per resendGap, however often the backend
		// answers: a write that keeps failing costs it little.
		gap := time.NewTimer(resendGap)
		select {
		case <-stop:
			gap.Stop()
			r.stop()
			return
		case <-gap.C:
		}
		t.Reset(resendEvery)
	}
}

// round sends every pending write the backend may take now, the items
// together in as few calls as ResendBatch allows, and keeps what failed.
// It stops early when the group stops, between calls. It reports whether
// any write is left; when none is, the loop is marked stopped before it
// returns.
func (r *Resends) round() bool {
	r.mu.Lock()
	items := r.items
	r.items = nil // r.n still counts them: the cap holds during the round
	r.mu.Unlock()
	sent := 0
	for _, it := range items {
		sent += len(it.reqs)
	}
	var keep []resendItem
	for lo := 0; lo < len(items); {
		// Now, not when the round began: the calls before this one may
		// each have taken up to the timeout, and a write sent past its
		// deadline may find its Once record lapsed and be applied again.
		now := time.Now()
		if now.After(items[lo].until) {
			r.drop(len(items[lo].reqs), items[lo].what, "pending for longer than its units count")
			lo++
			continue
		}
		stopped := false
		select {
		case <-r.Group.Stopping():
			stopped = true
		default:
		}
		if stopped || !r.Ready() {
			keep = append(keep, items[lo:]...) // wait for the recovery, or for Stop to drop them
			break
		}
		var reqs []backend.Request
		hi := lo
		for hi < len(items) && !now.After(items[hi].until) && (hi == lo || len(reqs)+len(items[hi].reqs) <= ResendBatch) {
			reqs = append(reqs, items[hi].reqs...)
			hi++
		}
		err := r.Send(reqs)
		for _, it := range items[lo:hi] {
			if err == nil {
				continue
			}
			again := Resendable(it.reqs, err, Unsent)
			r.drop(len(it.reqs)-len(again), it.what, "its outcome is unknown, and applying it twice would be wrong")
			if len(again) > 0 {
				it.reqs = again
				keep = append(keep, it)
			}
		}
		lo = hi
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n -= sent
	for _, it := range keep {
		r.n += len(it.reqs)
	}
	// Writes queued meanwhile were counted against the cap with the round's,
	// so the merge cannot pass it.
	r.items = append(keep, r.items...)
	r.pending.Store(int64(r.n))
	if len(r.items) == 0 {
		r.running = false
		return false
	}
	return true
}

// stop ends the resend loop as the group stops, dropping what is pending.
func (r *Resends) stop() {
	r.mu.Lock()
	r.running = false
	r.mu.Unlock()
	r.dropPending("the limiter was closed")
}

// dropPending drops every pending write: the limiter is closing.
func (r *Resends) dropPending(why string) {
	r.mu.Lock()
	items := r.items
	r.items, r.n = nil, 0
	r.pending.Store(0)
	r.mu.Unlock()
	for _, it := range items {
		r.drop(len(it.reqs), it.what, why)
	}
}

// drop counts and reports n requests of a write given up for good.
func (r *Resends) drop(n int, what, why string) {
	if n == 0 {
		return
	}
	total := r.dropped.Add(int64(n))
	r.Dropped(n, what, why, total)
}

package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"
	"weak"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// Concurrency is the rule kind that limits requests in flight instead of a
// rate: at most Limit units (a request takes Cost) of one key inside the
// handler at once. Period, at least a second, is the lease: how long a slot
// stays taken if its holder vanishes.
//
// The middleware takes the slot in the same backend call as the rate rules
// and gives it back when the handler returns, however it returns; with
// [Limiter.Decide] the caller gives it back with [Decision.Release]. The
// limit is exact across instances: each slot is a lease in the backend,
// renewed every Period/3 while the work runs, so a crashed instance's slots
// come back within Period. A refused request is told to retry within a
// second, since no clock predicts when slots free up. A concurrency rule has
// no Estimate.
const Concurrency = backend.Concurrency

// minLease is the shortest Period of a concurrency rule: its leases are
// renewed every third of it, a backend call each.
const minLease = time.Second

// concurrencyRetry is the most a concurrency rule tells a refused client
// to wait (see Concurrency).
const concurrencyRetry = time.Second

// validateConcurrency checks what only a concurrency rule needs.
func (r *Rule) validateConcurrency() error {
	if r.Algorithm != Concurrency {
		return nil
	}
	switch {
	case r.Period < minLease:
		return fmt.Errorf("ceiling: rule %q: a concurrency rule's Period (its lease) is %v, under %v", r.Name, r.Period, minLease)
	case r.Estimate != nil:
		return fmt.Errorf("ceiling: rule %q: a concurrency rule has no Estimate: it holds its slots until the handler returns", r.Name)
	}
	return nil
}

// newLease draws a lease id (failover.NewLease).
var newLease = failover.NewLease

// concurrencyHint caps a concurrency rule's waits (see Concurrency).
func concurrencyHint(res *backend.Result) {
	if res.RetryAfter > concurrencyRetry {
		res.RetryAfter = concurrencyRetry
	}
	res.NextAfter = min(res.NextAfter, concurrencyRetry)
}

// held is the slots one admitted decision holds: the acquisitions to
// renew while it runs and to release when it ends. It is safe for
// simultaneous use.
type held struct {
	leaseSet
	moved []bool // per request: moved to the backend, still counted locally (h.op guards it)
	every time.Duration

	op      sync.Mutex // one renewal or release at a time, so none races a move
	mu      sync.Mutex // guards what follows
	done    bool
	timer   *time.Timer
	cleanup runtime.Cleanup
}

// hold returns what the decision in st holds, or nil: the concurrency
// rules that took a slot (not those admitted failing open, which took
// nothing). The decision was admitted.
func (l *Limiter) hold(st *state) *held {
	var h *held
	for i := range st.reqs {
		q := &st.reqs[i]
		rr := &st.decision.Results[i]
		if q.Algorithm != Concurrency || q.Cost <= 0 || !rr.Allowed || rr.Fallback == FailOpen {
			continue
		}
		if h == nil {
			h = &held{leaseSet: leaseSet{l: l}, every: q.Period / 3}
		}
		h.reqs = append(h.reqs, *q)
		h.reqs[len(h.reqs)-1].Key = l.kept(q.Key) // held past this state's reuse
		h.rules = append(h.rules, rr.Rule.Name)
		h.idx = append(h.idx, l.ruleIndex(rr.Rule))
		h.local = append(h.local, rr.Fallback == FailLocal)
		h.every = min(h.every, q.Period/3)
	}
	if h == nil {
		return nil
	}
	l.countSlots(h.reqs, h.idx, +1)
	// The renewals hold the held weakly, and a cleanup releases it once
	// nobody can: a Decision dropped without Release frees its slots when
	// the garbage collector notices, instead of renewing them forever.
	wp := weak.Make(h)
	h.mu.Lock() // the first renewal may read h.timer before this returns
	defer h.mu.Unlock()
	h.timer = time.AfterFunc(h.every, func() {
		if h := wp.Value(); h != nil {
			h.renew()
		}
	})
	h.cleanup = runtime.AddCleanup(h, dropped, h.leaseSet)
	if l.remote {
		l.holdSlots(wp)
	}
	return h
}

// heldSlots is the set of decisions holding slots, held weakly, for the
// recovery to take them again on the backend (retakeSlots) before anyone
// decides there again: the slots FailLocal took, and those whose leases may
// have lapsed during the outage.
type heldSlots struct {
	mu sync.Mutex
	m  map[weak.Pointer[held]]struct{}
}

func (s *heldSlots) add(p weak.Pointer[held]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[weak.Pointer[held]]struct{})
	}
	s.m[p] = struct{}{}
}

func (s *heldSlots) remove(h *held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, weak.Make(h))
}

// live returns the decisions still in the set, forgetting those collected.
func (s *heldSlots) live() []*held {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*held
	for p := range s.m {
		if h := p.Value(); h != nil {
			out = append(out, h)
		} else {
			delete(s.m, p)
		}
	}
	return out
}

// retakeSlots takes every slot this instance holds again on the backend,
// each by its lease and forced, so that every instance counts them; the
// probe calls it before the breaker closes. A moved slot stays counted on
// the local store too until the hand-over ends, as the rate rules' units
// do, so the local store cannot admit a fresh share beside it. On error the
// slots not moved stay local, and the backend is not yet trusted.
func (l *Limiter) retakeSlots(ctx context.Context) error {
	hs := l.liveSlots()
	for lo := 0; lo < len(hs); lo += chargeBatch {
		if err := l.retake(ctx, hs[lo:min(lo+chargeBatch, len(hs))]); err != nil {
			return err
		}
	}
	return nil
}

// retake takes the slots of hs again on the backend in one call.
func (l *Limiter) retake(ctx context.Context, hs []*held) error {
	for _, h := range hs {
		h.op.Lock() // no renewal or release of h meanwhile
	}
	defer func() {
		for _, h := range hs {
			h.op.Unlock()
		}
	}()
	var acquire []backend.Request
	var holding []*held
	moved := 0
	for _, h := range hs {
		if !h.holding() {
			continue // released: its release gives the slots back
		}
		holding = append(holding, h)
		for j, q := range h.reqs {
			q.Force, q.Shadow = true, false
			acquire = append(acquire, q)
			if h.local[j] {
				moved++
			}
		}
	}
	if len(acquire) == 0 {
		return nil
	}
	if err := l.bounded(ctx, op{reqs: acquire, out: make([]backend.Result, len(acquire))}); err != nil {
		return fmt.Errorf("ceiling: recovery: taking %d concurrency slots again on the backend: %w", len(acquire), err)
	}
	for _, h := range holding {
		h.markMoved()
	}
	l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: took the concurrency slots this instance holds again on the backend",
		slog.Int("slots", len(acquire)), slog.Int("from_fail_local", moved))
	return nil
}

// markMoved records that h's local slots are on the backend now, and still
// counted on the local store until the hand-over ends. h.op is held.
func (h *held) markMoved() {
	for i := range h.local {
		if h.local[i] {
			if h.moved == nil {
				h.moved = make([]bool, len(h.reqs))
			}
			h.moved[i], h.local[i] = true, false
		}
	}
}

// leaseSet is a held's slots: also what the cleanup of a dropped held
// needs, without the held.
type leaseSet struct {
	l     *Limiter
	reqs  []backend.Request // the acquisitions (Cost > 0, Lease set)
	local []bool            // per request: taken on FailLocal's store (h.op guards it)
	rules []string          // per request: the rule, for logs
	idx   []int             // per request: the rule's index, for the slots in use
}

// dropped releases the slots of a Decision that was garbage collected
// without [Decision.Release], and says so: it is a bug in the caller, and
// the slots were held for nothing meanwhile.
func dropped(s leaseSet) {
	s.l.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn,
		"ceiling: a Decision holding concurrency slots was dropped without Release; released by the garbage collector",
		slog.Any("rules", s.rules))
	s.l.countSlots(s.reqs, s.idx, -1)
	s.l.leaseCall(s.reqs, s.local, -1)
}

// countSlots adds (sign +1) or takes away (-1) the units that reqs, the
// acquisitions of one held, take from their rules' slots in use
// ([RuleHealth.SlotsInUse]): counted when the decision starts holding
// them and until its release, whatever store they are on.
func (l *Limiter) countSlots(reqs []backend.Request, idx []int, sign int64) {
	for i, q := range reqs {
		l.slotsInUse(idx[i], sign*q.Cost)
	}
}

// Release gives back the concurrency slots the decision holds (see
// [Concurrency]) and stops their renewal: defer it right after an admitted
// [Limiter.Decide]. It is idempotent and safe for simultaneous use; a
// failed release is sent again in the background until the lease ends. A
// Decision dropped without Release is released by the garbage collector,
// with a warning in the log.
func (d *Decision) Release() {
	if d.leases != nil {
		d.leases.release()
	}
}

func (h *held) release() { h.releaseWith(nil) }

// holding reports whether h's slots are still held: not yet released.
func (h *held) holding() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.done
}

// releaseWith gives back h's slots in the same backend call as extra, the
// settlements of the request that held them (which no backend refuses), so
// that one call after the handler does both. It returns that call's error
// for the caller to report; the release's own is logged here.
func (h *held) releaseWith(extra []backend.Request) error {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		if len(extra) == 0 {
			return nil
		}
		err := h.l.callOutside(context.Background(), op{reqs: extra, out: make([]backend.Result, len(extra))})
		if err != nil {
			h.l.resendLater(extra, err, "settlement")
		}
		return err
	}
	h.done = true
	h.timer.Stop()
	h.cleanup.Stop()
	h.mu.Unlock()
	h.l.countSlots(h.reqs, h.idx, -1)
	h.op.Lock()
	defer h.op.Unlock()
	h.l.dropSlots(h)
	remote, _ := h.l.leaseCalls(h.reqs, h.local, -1, extra)
	return remote
}

// renew takes the slots again for another lease, forced: the work is still
// running, even if a lease lapsed during an outage. It also moves to the
// backend any FailLocal slot that retakeSlots missed, and renews a moved
// slot on the local store while the hand-over lasts, giving it back there
// at the first renewal after.
func (h *held) renew() {
	h.op.Lock()
	defer h.op.Unlock()
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	local := h.local // h.op guards it
	l := h.l
	if slices.Contains(local, true) && l.remote && l.breakerClosed() {
		var moving []backend.Request
		for i, q := range h.reqs {
			if local[i] {
				moving = append(moving, q)
			}
		}
		if l.leaseCall(moving, make([]bool, len(moving)), +1) == nil {
			h.markMoved()
		}
	}
	if h.moved != nil {
		var moved []backend.Request
		for i, q := range h.reqs {
			if h.moved[i] {
				moved = append(moved, q)
			}
		}
		sign := int64(+1)
		if !l.inHandOver() {
			sign, h.moved = -1, nil
		}
		_, _ = l.leaseCalls(moved, slices.Repeat([]bool{true}, len(moved)), sign, nil)
	}
	l.leaseCall(h.reqs, local, +1)
	h.mu.Lock()
	if !h.done {
		h.timer.Reset(h.every)
	}
	h.mu.Unlock()
}

// leaseCall releases (sign -1) or renews (+1, forced) leases: one bounded
// call to the backend for those it holds, one to FailLocal's store for the
// others. A failure is logged and returned; the leases then expire by
// themselves.
func (l *Limiter) leaseCall(reqs []backend.Request, local []bool, sign int64) error {
	remote, inProc := l.leaseCalls(reqs, local, sign, nil)
	return errors.Join(remote, inProc)
}

// leaseCalls is leaseCall with extra requests in the backend's call,
// returning that call's error and the local store's apart.
func (l *Limiter) leaseCalls(reqs []backend.Request, local []bool, sign int64, extra []backend.Request) (remoteErr, localErr error) {
	var remote, inProc []backend.Request
	// A slot decided during the hand-over after a recovery was taken on
	// FailLocal's store too: its release gives that back as well
	// (releasing a lease the store does not hold does nothing).
	handedOver := sign < 0 && l.loadedLocal() != nil
	for i, q := range reqs {
		q.Cost, q.Force, q.Shadow = sign*q.Cost, sign > 0, false
		if local[i] || handedOver {
			inProc = append(inProc, q)
		}
		if !local[i] {
			remote = append(remote, q)
		}
	}
	what := "release"
	if sign > 0 {
		what = "renewal"
	}
	if len(extra) > 0 {
		what += " with the request's settlements"
	}
	ctx := context.Background()
	held := len(remote) > 0 // a lease of the backend's is in the call, not only extra
	remote = append(remote, extra...)
	if len(remote) > 0 {
		if e := l.callOutside(ctx, op{reqs: remote, out: make([]backend.Result, len(remote))}); e != nil {
			remoteErr = fmt.Errorf("ceiling: concurrency %s: %w", what, e)
			if sign < 0 {
				what := "concurrency release"
				if len(extra) > 0 {
					what = "settlement"
				}
				l.resendLater(remote, e, what)
			}
		}
	}
	if len(inProc) > 0 {
		if e := l.localStore().Decide(ctx, inProc, make([]backend.Result, len(inProc))); e != nil {
			localErr = fmt.Errorf("ceiling: concurrency %s on the local store: %w", what, e)
		}
	}
	leaseErr := localErr
	if held {
		leaseErr = errors.Join(remoteErr, localErr)
	}
	if err := leaseErr; err != nil {
		l.logLease("ceiling: a concurrency "+what+" failed; the slots come back when their leases expire", err)
	}
	return remoteErr, localErr
}

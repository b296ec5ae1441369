package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

// extrasKey is the request-context key under which the handler finds its
// request's *extras.
type extrasKey struct{}

// extras is what prefetches and settlements keep for one request. It exists
// only when the limiter has prefetches or rules with an Estimate, so that a
// limiter without them pays no allocation for it; it is never pooled,
// because a handler may keep its request (and so this) after returning.
type extras struct {
	l *Limiter

	// Written by the middleware's goroutine before the handler runs.
	cancel context.CancelFunc
	calls  []prefetchCall
	est    []estimate

	mu     sync.Mutex
	res    []reservation
	closed bool // settled: later Settle calls are refused

	// leases are the concurrency slots the admitted request holds, given
	// back in the settlements' call (set by the middleware before the
	// handler runs).
	leases *held
}

// estimate is the Estimate of the request at index i of the decision.
type estimate struct {
	i int
	n int64
	// planned: the request was decided under the rule's plan (no limit
	// from Limits), so its settlement goes under the plan then current.
	planned bool
}

// reservation is what one admitted rule reserved and what it will settle to.
// It copies the backend request: the decision it came from is pooled.
type reservation struct {
	rule   *Rule
	req    backend.Request // req.Cost is the number of units reserved
	stamp  int64           // where the backend placed them (Result.Stamp)
	actual int64
	// planned: req's limit is the rule's plan, not a Limits plan's: the
	// settlement takes the plan current when it is sent (see settle).
	planned bool
}

// ErrNotReserved is returned (wrapped) by [Settle] when the request holds no
// reservation under the rule: the rule has no Estimate or did not apply, the
// request was admitted without a decision (failing open), or the handler has
// already returned.
var ErrNotReserved = errors.New("no reservation to settle")

// Settle reports the real cost of r under the named rule, whose Estimate
// reserved units when r was admitted. r is the request the handler received.
// The difference is applied when the handler returns, in one backend call
// for all of the request's rules (which also gives back the request's
// [Concurrency] slots): units not used are refunded, and units
// used beyond the reservation are charged even past the limit, so that the
// key goes into debt and the next requests wait it out. The excess one
// request can charge is capped at the rule's capacity (Limit, or Burst for
// GCRA): at most one more full budget of debt.
//
// The last call for a rule wins. Without one, the reservation settles at
// the estimate: a handler that fails or panics before calling Settle is
// charged what it estimated, and one that knows it used nothing settles 0
// before returning. A panic is re-raised after settling. Settle is safe for
// simultaneous use by the handler's goroutines.
//
// A refund comes off the units the reservation placed, which the backend
// names by the stamp it returned ([backend.Result].Stamp). A backend that
// returns none (Stamp 0 for an admission: one that does not implement
// stamps) gets no refund: the reservation stands at its estimate, which
// may admit fewer requests than the limit, never more.
//
// To a remote backend a reservation goes named by a [backend.Request.Once],
// and the backend writes a ticket for it with the admission, kept twice
// the rule's Period. Its settlement carries the same Once: a refund is
// applied only while the ticket stands, and consumes it, leaving nothing
// behind, so that a key's tickets are bounded by its reservations that
// hold units, never by how often it refunds; one that finds no ticket
// (applied already, or lost with the reservation's units in a restart of
// the backend) gives back nothing. A charge past the reservation consumes
// the ticket and leaves a record, kept H = twice the rule's Period, at
// most a minute ([backend.OnceKept], [backend.OnceHold]).
//
// A settlement whose backend call fails is logged, and sent again in the
// background once the backend answers, for up to min(Period, H - 2×timeout)
// after its call failed, the timeout being the limiter's (none at all when
// that leaves nothing: a later resend could outlive its record): it takes
// effect once however often it is sent, even when a reply was lost after
// the backend applied it. The resend is a retry over a slow moment, not
// the ride-out of an outage: one given up (still failing then, or pending
// when the limiter closes) is logged and counted in [Health].DroppedWrites;
// a dropped refund leaves its reservation at its estimate.
func Settle(r *http.Request, rule string, actual int64) error {
	if actual < 0 {
		return fmt.Errorf("ceiling: rule %q: settle: negative cost %d", rule, actual)
	}
	x, _ := r.Context().Value(extrasKey{}).(*extras)
	if x == nil {
		return fmt.Errorf("ceiling: rule %q: %w", rule, ErrNotReserved)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("ceiling: rule %q: %w: the handler has returned", rule, ErrNotReserved)
	}
	for i := range x.res {
		if x.res[i].rule.Name == rule {
			x.res[i].actual = actual
			return nil
		}
	}
	return fmt.Errorf("ceiling: rule %q: %w", rule, ErrNotReserved)
}

// hasExtras reports whether requests need an extras: prefetches to run or
// reservations to settle.
func (l *Limiter) hasExtras() bool {
	if len(l.cfg.prefetches) > 0 {
		return true
	}
	for i := range l.rules {
		if l.rules[i].Estimate != nil {
			return true
		}
	}
	return false
}

// beginExtras gives st a fresh extras for one request.
func (l *Limiter) beginExtras(st *state) { st.x = &extras{l: l} }

// endExtras runs when the middleware returns, after the handler (panicking
// or not) or the rejection: it stops the prefetches, then settles.
func (l *Limiter) endExtras(r *http.Request, st *state) {
	x := st.x
	st.x = nil
	x.stopPrefetches()
	x.settle(r.Context())
}

// cost returns the units rule takes from r: its Cost, or its Estimate,
// which st's extras remember for the settlement. An estimate of zero
// reserves one unit, the least that asks "is any budget left". An Estimate
// that returns ErrNoKey (the request names no cost) estimates the default
// cost, one unit: were ErrNoKey passed on, the middleware would leave the
// rule out, and a client would switch the rule off by sending no cost.
func (l *Limiter) cost(r *http.Request, st *state, rule *Rule) (int64, error) {
	if rule.Estimate == nil {
		return rule.Cost, nil
	}
	n, err := rule.Estimate(r)
	if errors.Is(err, ErrNoKey) {
		n, err = 1, nil
	}
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("negative estimate %d", n)
	}
	st.x.est = append(st.x.est, estimate{i: len(st.reqs), n: n})
	return max(n, 1), nil
}

// admit returns the request the next handler gets: r itself unless the
// limiter has prefetches or reservations, else r carrying them.
func (l *Limiter) admit(r *http.Request, st *state) *http.Request {
	x := st.x
	if x == nil {
		return r
	}
	for _, e := range x.est {
		// A shadow rule that did not fit reserved nothing; nor did a rule
		// decided by its fail mode while the backend was down.
		rr := &st.decision.Results[e.i]
		if !rr.Allowed || rr.Fallback != inherit {
			continue
		}
		req := st.reqs[e.i]
		req.Key = l.kept(req.Key)
		x.res = append(x.res, reservation{rule: rr.Rule, req: req, stamp: rr.Stamp, actual: e.n, planned: e.planned})
	}
	return r.WithContext(context.WithValue(r.Context(), extrasKey{}, x))
}

// settle applies every reservation's difference, and gives back the
// request's concurrency slots, in one backend call. A refund carries the
// reservation's stamp ([backend.Request.Stamp]), so that it gives back only
// units the reservation took, never another request's. To a backend that
// can lose a reply, each settlement goes named by its reservation's
// [backend.Request.Once] (its ticket), so that one whose reply was lost can
// be sent again and still take effect once. The request's context may be done (the
// client left) but the work was done: the call keeps its values and, like
// every backend call, ignores the cancellation.
func (x *extras) settle(ctx context.Context) {
	x.mu.Lock()
	x.closed = true
	res := x.res
	x.mu.Unlock()
	l := x.l
	var reqs []backend.Request
	var names []string
	for _, rv := range res {
		delta := min(rv.actual-rv.req.Cost, capacityOf(rv.req)) // the request's limit, which Limits may have set
		if delta == 0 {
			continue
		}
		q := rv.req
		q.Cost, q.Force, q.Shadow = delta, delta > 0, false
		if rv.planned {
			// A SetLimit since the reservation: write under the limit
			// the rule enforces now, as every other request does. GCRA
			// stores debt at its writer's rate, so a settlement under the
			// old one would have the key's units leave at the old rate
			// (a lowered limit drained as fast as before).
			pl := planOf(rv.rule)
			q.Limit, q.Burst = pl.limit, pl.burst
		}
		if delta < 0 {
			// The units the reservation placed, not the newest: those may
			// be another request's, which the refund would hand out again.
			// A backend that placed them without a stamp gets no refund.
			if rv.stamp == 0 {
				continue
			}
			q.Stamp = rv.stamp
		}
		// The reservation's Once (see add): a refund applies only while
		// its ticket stands, and consumes it; a charge leaves a record.
		q.Once = rv.req.Once
		reqs = append(reqs, q)
		names = append(names, rv.rule.Name)
	}
	var err error
	switch {
	case x.leases != nil:
		err = x.leases.releaseWith(reqs)
	case len(reqs) > 0:
		err = l.callOutside(ctx, op{reqs: reqs, out: make([]backend.Result, len(reqs))})
		if err != nil {
			l.resendLater(reqs, err, "settlement")
		}
	}
	if err != nil && len(reqs) > 0 {
		l.cfg.logger.LogAttrs(ctx, slog.LevelError, "ceiling: settlement failed; sent again once the backend answers",
			slog.Any("rules", names), slog.Any("err", err))
	}
}

// newOnce returns a settlement's [backend.Request.Once]: random in 2^63, from
// a generator seeded at random per process, so that settlements of every
// instance sharing a backend differ.
func newOnce() int64 { return rand.Int64N(math.MaxInt64) + 1 }

// errChargeConcurrency refuses a Charge on a Concurrency rule.
var errChargeConcurrency = errors.New("a concurrency rule holds slots by lease: take them with Decide and give them back with Decision.Release, not Charge")

// rule returns the rule named name.
func (l *Limiter) rule(name string) (*Rule, error) {
	for i := range l.rules {
		if l.rules[i].Name == name {
			return &l.rules[i], nil
		}
	}
	return nil, fmt.Errorf("ceiling: rule %q: not declared", name)
}

// request returns the backend request for rule's key value: the stored key
// the middleware uses, so that support tooling sees what requests see.
func (l *Limiter) request(rule *Rule, keyValue string) backend.Request {
	st := l.states.Get().(*state)
	st.reset()
	key := l.kept(l.storedKey(st, rule.Name, keyValue))
	l.states.Put(st)
	pl := planOf(rule)
	return backend.Request{Key: key, Algorithm: rule.Algorithm, Limit: pl.limit, Period: rule.Period, Burst: pl.burst}
}

// Peek returns the state of the rule's key for keyValue (an address, a
// phone number: what the rule's KeyFunc would return) without consuming
// anything: Remaining, ResetAfter and Limit as the next request would find
// them. It is for operators and support tooling. Like every backend call
// it is bounded by the limiter's timeout, and while the backend is
// degraded it fails at once with an error wrapping [ErrDegraded].
func (l *Limiter) Peek(ctx context.Context, rule, keyValue string) (backend.Result, error) {
	rl, err := l.rule(rule)
	if err != nil {
		return backend.Result{}, err
	}
	out := make([]backend.Result, 1)
	if err := l.callOutside(ctx, op{reqs: []backend.Request{l.request(rl, keyValue)}, out: out}); err != nil {
		return backend.Result{}, fmt.Errorf("ceiling: rule %q: peek: %w", rule, err)
	}
	return out[0], nil
}

// Reset forgets the rule's state for keyValue, restoring its full budget
// (and forgiving any debt). It is for operators and support tooling: a
// customer locked out by a bug, a test account. It is bounded and fails
// while degraded like [Limiter.Peek]. A stamped refund of an admission
// from before the Reset ([Input].Stamp, or a settlement) can then give back
// units taken since on [FixedWindow], [RollingWindow] and [GCRA], whose
// stamps name a window, a bucket or an instant, not the units.
func (l *Limiter) Reset(ctx context.Context, rule, keyValue string) error {
	rl, err := l.rule(rule)
	if err != nil {
		return err
	}
	if err := l.callOutside(ctx, op{reset: true, keys: []string{l.request(rl, keyValue).Key}}); err != nil {
		return fmt.Errorf("ceiling: rule %q: reset: %w", rule, err)
	}
	return nil
}

// Charge applies costs known only after the work (the tokens a model
// reply used, the bytes an export sent) to rules' keys, in one backend
// call: a positive Cost is taken even past the limit, so the key goes into
// debt and the next decisions wait it out; a negative Cost gives units back
// (never below empty). It is the non-HTTP counterpart of [Settle]. Each
// input names its rule and key value as for [Limiter.Decide] (a Limit or
// Burst in an input applies as there); a zero Cost is an error. A refund
// of units an admission reserved passes that admission's Stamp
// ([Input].Stamp), so that it gives back those units and not another
// caller's, and its Ticket ([Input].Ticket, from a Decide whose input set
// Reserve), so that it is applied at most once.
//
// What a refund does depends on its ticket. With one, it gives back units
// only while the ticket stands, and consumes it; one that finds it gone
// (already applied, older than twice the Period, or lost in a restart of
// the backend with the admission's units) gives back nothing, since
// nothing of the admission is left to give. Without one (Ticket 0) it is
// applied as sent, on every delivery: a failure after it may have been
// applied is never sent again (the error says so), since a second
// delivery would give back another caller's units.
//
// A [Concurrency] rule cannot be charged: its units are slots held by
// lease, taken by a decision and given back by [Decision.Release], and a
// charge would take a slot nothing could give back.
//
// Like every backend call, Charge is bounded by the limiter's timeout and
// ignores ctx's cancellation. To a remote backend its positive charges and
// ticketed refunds go named by a [backend.Request.Once] (the ticket's, or
// a fresh one), as a settlement's do, and a failed call is handled as
// [Settle]'s: the limiter sends them again in the background (while the
// backend is degraded, once it answers), and they take effect once, even
// when a reply was lost after the backend applied them. What an error
// means:
//   - one wrapping [ErrResent]: the charge may have been applied, and the
//     limiter sends it again within the bounds [Settle] gives (given up,
//     it is counted in [Health].DroppedWrites). Do not repeat it: a
//     repeat is another charge.
//   - one wrapping [ErrDegraded] or [backend.ErrNotSent] but not
//     ErrResent: it was not applied (never sent, and not sent again: too
//     many pending, or its Period too short beside the timeout); repeating
//     it is safe.
//   - any other error from the backend call: it may have been applied and
//     is not sent again (a refund without a ticket, or a rule whose
//     Period is too short beside the timeout to resend it safely);
//     repeating it may apply it twice.
//   - an invalid input (an undeclared rule, a zero cost): nothing was sent.
func (l *Limiter) Charge(ctx context.Context, inputs ...Input) error {
	if len(inputs) == 0 {
		return nil
	}
	st := l.states.Get().(*state)
	defer l.states.Put(st)
	st.reset()
	reqs := make([]backend.Request, 0, len(inputs))
	for _, in := range inputs {
		rule, err := l.rule(in.Rule)
		if err != nil {
			return err
		}
		if rule.Algorithm == Concurrency {
			return fmt.Errorf("ceiling: rule %q: charge: %w", rule.Name, errChargeConcurrency)
		}
		if in.Cost == 0 || in.Cost > backend.MaxLimit || in.Cost < -backend.MaxLimit {
			return fmt.Errorf("ceiling: rule %q: charge: cost %d outside ±1..%d", rule.Name, in.Cost, backend.MaxLimit)
		}
		if err := l.add(st, rule, in.Key, in.Cost, in.Limit, in.Burst, false); err != nil {
			return err
		}
		q := st.reqs[len(st.reqs)-1]
		q.Force, q.Shadow = in.Cost > 0, false
		if in.Cost < 0 {
			q.Stamp = in.Stamp
		}
		if l.remote {
			switch {
			case in.Ticket != 0:
				q.Once = in.Ticket
			case in.Cost > 0:
				q.Once = newOnce()
			}
		}
		reqs = append(reqs, q)
	}
	err := l.callOutside(ctx, op{reqs: reqs, out: make([]backend.Result, len(reqs))})
	if err == nil {
		return nil
	}
	if !l.remote {
		return fmt.Errorf("ceiling: charge: %w", err)
	}
	if unsent(err) && !l.resendsAll(reqs) {
		// Never applied: send none of it again rather than part, so that
		// the caller may repeat it all, as the error says.
		return fmt.Errorf("ceiling: charge: not applied, and not sent again: %w", err)
	}
	lost := l.resendLater(reqs, err, "charge")
	switch {
	case lost == 0:
		return fmt.Errorf("ceiling: charge: %w: %w", ErrResent, err)
	case unsent(err):
		return fmt.Errorf("ceiling: charge: not applied, and not sent again: %w", err)
	}
	return fmt.Errorf("ceiling: charge: %d of its requests may have been applied and are not sent again: %w", lost, err)
}

// ErrResent is wrapped by the error of a [Limiter.Charge] whose backend
// call failed and which the limiter sends again in the background, as it
// does a failed settlement: it may already have been applied, and takes
// effect once however often it is delivered. Its caller must not repeat
// it: a repeat is a second charge, applied as well.
var ErrResent = errors.New("sent again by the limiter; do not repeat it")

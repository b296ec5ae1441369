package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/ceiling-go/ceiling/backend"
)

// An Input is one rule's part of a decision made with [Limiter.Decide]: the
// key value the rule limits by, and optionally this call's cost and limits.
type Input struct {
	// Rule names one of the limiter's rules.
	Rule string
	// Key is the value the rule limits by (an address, an account, a phone
	// number): what the rule's KeyFunc would return. It is stored as a
	// digest, never raw. Required: an empty key is an error, never a budget
	// shared by every caller without one.
	Key string
	// Cost is the number of units this call takes; zero means the rule's
	// Cost. Negative costs are refused (refund with [Limiter.Charge]). A
	// cost the limit can never hold is a rejection with RetryAfter
	// [backend.Never], decided without a backend call, so a client that
	// picks its cost cannot make the backend fail or a fail mode admit.
	Cost int64
	// Limit and Burst, when positive, replace the rule's for this call (a
	// limit per plan or tenant). The key's state is shared whatever limit a
	// call brings: each call is judged by its own limit against every unit
	// the key holds (backend/ALGORITHMS.md, "A limit that changes"). Values
	// out of range are a [*LimitError] for this call.
	Limit, Burst int64
	// Stamp, for a refund with [Limiter.Charge], is the Stamp of the
	// admission's [RuleResult]: the refund gives back only units that
	// admission placed and that still count, never another caller's. Zero
	// gives back the newest units; pass zero for an admission a fail mode
	// decided (its Fallback is set). Decide and positive charges ignore it.
	Stamp int64
	// Reserve, for [Limiter.Decide], asks the backend to write a ticket
	// with the admission, named by its [RuleResult].Ticket, so that a
	// later [Limiter.Charge] of what the work really cost (a refund, or a
	// charge past the reservation) is applied at most once however often
	// it is sent, even after the backend restarted and lost its data. It
	// costs the admission a write, so ask for it only on inputs whose
	// cost is settled later. Charge ignores it, as does a [Concurrency]
	// rule, whose lease names its units.
	Reserve bool
	// Ticket, for [Limiter.Charge], is the Ticket of the admission
	// ([RuleResult].Ticket, from a Decide that set Reserve) whose cost
	// this charge settles. A refund with it gives back units only while
	// the ticket stands, and consumes it: the limiter can send it again
	// after a failure, and it takes effect once. A ticket lasts twice
	// the rule's Period, and a backend that lost its data lost it with
	// the admission's units, so a refund that finds none gives back
	// nothing and returns no error: there is nothing of the admission's
	// left to give back. Decide ignores it.
	Ticket int64
}

// errEmptyKey is wrapped by the error of a decision whose key value is
// empty, which would otherwise put every such caller into one shared
// budget; a rule that does not apply returns [ErrNoKey] instead.
var errEmptyKey = errors.New(`empty key value; return ErrNoKey when the rule does not apply`)

// Decide decides inputs, one per rule that applies, as one request: in one
// backend call, all or nothing, with the fail modes, observer and shadow
// rules, exactly as the middleware decides an HTTP request. It is how gRPC
// services, queue workers and websocket messages are limited.
//
// Results follow the rules' declaration order, whatever the order of
// inputs. A rule may appear at most once; rules without a KeyFunc may be
// decided only here. ctx's values reach the backend, but its cancellation
// does not cut the decision short: it runs under [WithTimeout], since a
// caller that gives up is not a failing backend.
//
// When a rule fails closed, Decide returns a Decision that admits nothing
// and an [*UnavailableError]. Any other error means the inputs are wrong
// (an unknown or repeated rule, an empty key, a limit out of range) and
// nothing was consumed. An admitted [Concurrency] rule holds its slot until
// [Decision.Release].
func (l *Limiter) Decide(ctx context.Context, inputs ...Input) (Decision, error) {
	st := l.states.Get().(*state)
	defer l.states.Put(st)
	st.reset()
	if err := l.decideInputs(ctx, st, inputs); err != nil {
		return Decision{}, err
	}
	d := st.decision
	d.Results = nil
	if len(st.decision.Results) > 0 {
		d.Results = slices.Clone(st.decision.Results)
	}
	for i := range d.Results {
		if rr := &d.Results[i]; rr.Ticket != 0 && (!d.Allowed || !rr.Allowed || rr.Fallback != inherit || rr.Stamp == 0) {
			rr.Ticket = 0 // nothing reserved on the backend: no ticket was written
		}
	}
	st.decision.leases = nil // d holds them now, not the pooled state
	return d, nil
}

// decideInputs adds inputs to st, in the rules' declaration order, and
// decides them.
func (l *Limiter) decideInputs(ctx context.Context, st *state, inputs []Input) error {
	matched := 0
	for i := range l.rules {
		rule := &l.rules[i]
		var in *Input
		for j := range inputs {
			if inputs[j].Rule != rule.Name {
				continue
			}
			if in != nil {
				return fmt.Errorf("ceiling: rule %q: decided twice in one call", rule.Name)
			}
			in = &inputs[j]
		}
		if in == nil {
			continue
		}
		matched++
		cost := in.Cost
		switch {
		case cost < 0:
			return fmt.Errorf("ceiling: rule %q: negative cost %d; refund with Charge", rule.Name, cost)
		case cost == 0:
			cost = rule.Cost
		}
		if err := l.add(st, rule, in.Key, cost, in.Limit, in.Burst, in.Reserve); err != nil {
			if le, ok := err.(*LimitError); ok {
				l.limitFailed(ctx, le)
			}
			return err
		}
	}
	if matched != len(inputs) {
		for _, in := range inputs {
			if _, err := l.rule(in.Rule); err != nil {
				return err
			}
		}
	}
	return l.decideAll(ctx, st)
}

// reset empties st for a new decision.
func (st *state) reset() {
	st.reqs = st.reqs[:0]
	if cap(st.keys) > maxPooledKeys {
		st.keys = nil // a request with huge keys does not pin them in the pool
	}
	st.keys = st.keys[:0]
	// Field by field: a whole-struct assignment goes through the garbage
	// collector's bulk write barrier (TestResetClearsEveryDecisionField
	// counts the fields).
	d := &st.decision
	d.Allowed, d.RetryAfter, d.Results = false, 0, d.Results[:0]
	if d.leases != nil {
		d.leases = nil
	}
}

// maxPooledKeys bounds the key arena a pooled state keeps between
// requests.
const maxPooledKeys = 4 << 10

// add appends rule's request for key value v, costing cost units, to st.
// A positive limit or burst replaces the rule's for this decision. With
// ticket, a reservation (a positive cost of a rate rule) to a remote
// backend is named by a fresh [backend.Request.Once], which its settlement
// carries: the backend writes a ticket with the admission, and a refund
// applies only while it stands (see settle). A Store in process, which
// cannot lose a reply, needs none; nor does a call without a ticket pay
// anything for it.
func (l *Limiter) add(st *state, rule *Rule, v string, cost, limit, burst int64, ticket bool) error {
	if v == "" {
		l.emptyKey(rule)
		return fmt.Errorf("ceiling: rule %q: %w", rule.Name, errEmptyKey)
	}
	pl := planOf(rule)
	req := backend.Request{
		Algorithm: rule.Algorithm,
		Limit:     pl.limit,
		Period:    rule.Period,
		Burst:     pl.burst,
		Cost:      cost,
		Shadow:    rule.Shadow,
	}
	if req.Algorithm == Concurrency {
		req.Lease = newLease() // before Validate, which wants one for a cost
	}
	if limit != 0 || burst != 0 {
		if limit != 0 {
			req.Limit = limit
		}
		if burst != 0 {
			if rule.Algorithm != GCRA {
				return &LimitError{Rule: rule.Name, Limit: limit, Burst: burst,
					Err: fmt.Errorf("a burst for this call, but Burst is GCRA's and the rule is %v", rule.Algorithm)}
			}
			req.Burst = burst
		}
		req.Key = rule.Name // Validate names the key; the digest is not needed to judge
		if err := req.Validate(); err != nil {
			return &LimitError{Rule: rule.Name, Limit: limit, Burst: burst, Err: err}
		}
		if err := slidingLogBound(req.Algorithm, req.Limit); err != nil {
			return &LimitError{Rule: rule.Name, Limit: limit, Burst: burst, Err: err}
		}
	}
	// Field by field into the pooled arrays, which avoids a store-forwarding
	// stall; TestAddOverwritesEveryField pins that no field is left stale.
	st.reqs = grow(st.reqs)
	r := &st.reqs[len(st.reqs)-1]
	r.Key = l.storedKey(st, rule.Name, v)
	r.Algorithm, r.Limit, r.Period, r.Burst, r.Cost = req.Algorithm, req.Limit, req.Period, req.Burst, req.Cost
	r.Force, r.Lease, r.Stamp, r.Once, r.Shadow = req.Force, req.Lease, 0, 0, req.Shadow
	if ticket && l.remote && cost > 0 && rule.Algorithm != Concurrency {
		r.Once = newOnce()
	}
	st.decision.Results = grow(st.decision.Results)
	rr := &st.decision.Results[len(st.decision.Results)-1]
	rr.Rule, rr.Fallback, rr.limit, rr.Ticket = rule, inherit, req.Limit, r.Once
	res := &rr.Result
	res.Allowed, res.Unread, res.Cached = false, false, false
	res.Limit, res.Remaining, res.ResetAfter, res.RetryAfter, res.NextAfter, res.Stamp = 0, 0, 0, 0, 0, 0
	return nil
}

// neverFits finds the requests of st whose cost their limit can never hold:
// rejections no wait cures, decided before any backend call, so that a
// client's cost never reaches the backend as an invalid request, moves the
// breaker or is admitted by a fail mode. An enforced one refuses the whole
// call (decided; the other results are Unread). Shadow ones are sent as
// peeks and refused after the call (unfit; st.unfit marks them).
func (l *Limiter) neverFits(st *state, results []backend.Result) (decided, unfit bool) {
	st.unfit = st.unfit[:0]
	blocked := false
	for i := range st.reqs {
		q := &st.reqs[i]
		if q.Cost <= capacityOf(*q) {
			continue
		}
		if !unfit {
			st.unfit = append(st.unfit, make([]bool, len(st.reqs))...)
			unfit = true
		}
		st.unfit[i] = true
		blocked = blocked || !q.Shadow
	}
	if !unfit {
		return false, false
	}
	if blocked {
		for i := range st.reqs {
			results[i] = backend.Result{Allowed: true, Limit: st.reqs[i].Limit, Unread: true}
		}
		refuseUnfit(st.reqs, st.unfit, results)
		return true, false
	}
	for i := range st.reqs {
		if st.unfit[i] {
			st.reqs[i].Cost, st.reqs[i].Once = 0, 0 // a peek: the state, for the shadow report
		}
	}
	return false, true
}

// refuseUnfit writes the rejection of every request marked in unfit,
// Unread: no backend read the key, so the headers advertise nothing for it.
func refuseUnfit(reqs []backend.Request, unfit []bool, results []backend.Result) {
	for i := range reqs {
		if unfit[i] {
			results[i] = backend.Result{Limit: reqs[i].Limit, RetryAfter: backend.Never, Unread: true}
		}
	}
}

// grow extends s by one element, which holds whatever it held before when
// s's array has room.
func grow[T any](s []T) []T {
	if len(s) < cap(s) {
		return s[:len(s)+1]
	}
	var zero T
	return append(s, zero)
}

// emptyKey logs, once per rule, that its key function returned "": a bug
// that the 400 answers would otherwise show only to clients.
func (l *Limiter) emptyKey(rule *Rule) {
	i := l.ruleIndex(rule)
	if l.firstEmptyKey(i) {
		l.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"ceiling: a key value was empty; such requests are refused as bad input (logged once per rule)",
			slog.String("rule", rule.Name))
	}
}

// decideAll decides st's requests (filled by add, in declaration order) with
// one backend call, applying the fail modes when the backend cannot, and
// reports the decision to the observer. Every decision, from the middleware
// or from [Limiter.Decide], goes through here.
func (l *Limiter) decideAll(ctx context.Context, st *state) error {
	d := &st.decision
	d.Allowed, d.RetryAfter = true, 0
	if len(st.reqs) == 0 {
		return nil
	}
	results := st.results[:len(st.reqs)]
	decided, unfit := l.neverFits(st, results)
	if !decided {
		var err error
		if results, err = l.decideBackend(ctx, st); err != nil {
			d.Allowed = false
			if errors.Is(err, backend.ErrInvalidRequest) {
				// The backend refused what it was sent: no fail mode can
				// make that right, and admitting it open would let a
				// client choose.
				return &LimitError{Rule: d.Results[0].Rule.Name, Err: err}
			}
			if obs := l.cfg.observer; obs != nil {
				obs.ObserveRequest(ctx, d, err)
			}
			return err
		}
	}
	if unfit {
		refuseUnfit(st.reqs, st.unfit, results)
	}
	for i := range results {
		rr := &d.Results[i]
		rr.Result = results[i]
		if rr.Rule.Algorithm == Concurrency {
			concurrencyHint(&rr.Result)
		}
		if rr.Allowed || rr.Rule.Shadow {
			continue
		}
		d.Allowed = false
		d.RetryAfter = laterWait(d.RetryAfter, rr.RetryAfter)
	}
	if d.Allowed && l.concurrent {
		d.leases = l.hold(st)
	}
	l.record(ctx, d)
	return nil
}

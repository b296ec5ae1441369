package ceiling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// The failure engine: everything the limiter does when the backend cannot
// decide, behind the one field l.fo, which no other file touches. Its
// machinery is internal/failover (the bounded call and its judgement, the
// breaker, the probes, FailLocal's store and hand-over, the resends); this
// file holds what needs the rules: the fail modes, a request's way through
// the engine (decideBackend, then fallback), the wiring, and what the rest
// of the package asks of it (the end of the file).

// FailMode says what the middleware does for a rule when the backend cannot
// decide (unreachable, timed out, broken, or skipped by the open circuit
// breaker).
//
// When the rules of one request have different modes, each rule falls back
// by its own mode and the request is admitted only if every rule's fallback
// admits it, exactly as when the backend answers:
//
//   - if any enforced rule fails closed, the request is answered 503 and
//     nothing is counted anywhere (closed wins);
//   - otherwise the rules failing local are decided together, all or
//     nothing, on the in-process store: a rejection there is a 429;
//   - the rules failing open admit without enforcement, counted per rule.
//
// Shadow rules never reject, so their fail mode never refuses a request.
type FailMode uint8

const (
	// inherit is the zero value: a rule uses its limiter's mode.
	inherit FailMode = iota
	// FailOpen admits the request without enforcement. Each admission is
	// counted per rule and the degradation is logged and reported, never
	// silent, but nothing limits anybody while it lasts: choose it for
	// limits whose breach costs less than an outage (a chat endpoint's
	// fairness limit).
	FailOpen
	// FailClosed answers 503 with Retry-After: nothing is admitted that was
	// not counted, at the price of an outage of the limited routes while the
	// backend is down. Choose it where a breach costs money or safety (OTP
	// messages, payments).
	FailClosed
	// FailLocal decides on an in-process memory store with the same rules,
	// each limited to its share of the limit (1/n with [WithInstances](n)): the limit
	// stays enforced per instance, so the risk while the backend is down is
	// bounded (at most instances × share × limit) instead of unlimited, and
	// the service stays up. It is the default.
	FailLocal
)

// String names the mode for logs and metrics.
func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailLocal:
		return "local"
	}
	return "inherit"
}

// modeOf is the mode a rule falls back by.
func (l *Limiter) modeOf(r *Rule) FailMode {
	if r.FailMode != inherit {
		return r.FailMode
	}
	return l.cfg.failMode
}

// failover holds what the limiter needs when the backend fails: the circuit
// breaker, the in-process store of FailLocal, and the event reporting.
type failState struct {
	caller  failover.Caller   // every backend call
	breaker *failover.Breaker // nil for in-process backends
	// cached answers from the backend's cache in process (the Redis deny
	// cache) when the backend cannot decide; nil if it keeps none.
	cached backend.CachedDecider
	// spread spreads the probe's canary over every server of a backend
	// made of several (Redis Cluster); nil for one server.
	spread backend.Spread
	// local is FailLocal's store, made on the first fallback that needs
	// it, and its view of the backend across an outage's edges.
	local     failover.Local
	usesLocal bool      // some rule may fail local and the backend is remote
	scratch   sync.Pool // *localScratch
	errLog    sampler   // isolated backend errors while healthy
	shadow    []sampler // per rule: "would have rejected" log lines
	limitLog  []sampler // per rule: requests refused for want of a limit (limits.go)
	leaseLog  sampler   // failed releases and renewals of concurrency slots (concurrency.go)
	counts    []ruleCounts
	warning   string // configuration weaker than it reads (health warning)
	closers   []io.Closer
	once      sync.Once
	observed  *observedHealth        // what the observer reads (observer.go); nil without one
	final     atomic.Pointer[Health] // the last report, Status "closed", once Close began

	emptyKeyLogged []atomic.Bool // per rule: an empty key value was logged
	overloadLog    sampler       // calls this process was too busy to send
	resendLog      sampler       // writes given up after their call failed

	charging      atomic.Bool  // chargeSoon runs
	handoverUntil atomic.Int64 // Unix ns: FailLocal rules are decided locally too until then

	// The background: the prober, the probe that confirms a timeout, the
	// charge after it and the resends, stopped together by Close.
	canary backend.Request
	group  *failover.Group
	prober failover.Prober

	unenforcedAtDegrade counter
	shed                counter // requests refused because this process could not send their call

	resend failover.Resends // writes to send again after their call failed
	slots  heldSlots        // decisions holding concurrency slots (concurrency.go)
}

// ruleCounts are a rule's totals, reported by the health handler.
type ruleCounts struct {
	failOpen  counter
	failLocal counter
	shadow    counter
	slots     counter // units of Concurrency slots held now (concurrency.go)
}

// initFailover prepares the breaker, the local store and the start-up
// warnings; New calls it once the options are applied.
func (l *Limiter) initFailover() error {
	f := &failState{
		shadow:         make([]sampler, len(l.rules)),
		limitLog:       make([]sampler, len(l.rules)),
		counts:         make([]ruleCounts, len(l.rules)),
		emptyKeyLogged: make([]atomic.Bool, len(l.rules)),
	}
	l.fo = f
	if c, ok := l.backend.(io.Closer); ok && l.cfg.backend == nil {
		f.closers = append(f.closers, c) // the default store New made
	}
	now := l.cfg.clock
	l.cfg.localShare = 1 / float64(l.cfg.instances)
	f.errLog.every = time.Minute
	f.overloadLog.every = time.Minute
	f.group = failover.NewGroup()
	f.canary = failover.NewCanary()
	f.leaseLog.every = time.Minute
	f.resendLog.every = time.Minute
	f.resend = failover.Resends{
		Group: f.group,
		Send: func(reqs []backend.Request) error {
			return l.callOutside(context.Background(), op{reqs: reqs, out: make([]backend.Result, len(reqs))})
		},
		Ready:   l.breakerClosed,
		Unsent:  unsent,
		Keep:    l.kept,
		Dropped: l.droppedWrites,
		Timeout: l.cfg.timeout,
	}
	for i := range f.shadow {
		f.shadow[i].every = l.cfg.shadowLogEvery
		f.limitLog[i].every = limitLogEvery
	}
	f.caller = failover.Caller{Backend: l.backend, Into: l.into, Timeout: l.cfg.timeout}
	if o := l.cfg.observer; o != nil {
		f.caller.Observe = func(d time.Duration, out []backend.Result, err error) { observeCall(o, d, out, err) }
	}
	if l.remote {
		f.caller.Answered = l.answered
		f.caller.Overloaded = func(err error) {
			f.overloadLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn,
				"ceiling: this process was too busy to send backend calls in time; requests shed with 503, the backend is not blamed",
				slog.Any("err", err))
		}
		f.caller.Failed = func(err error) {
			f.errLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, "ceiling: backend call failed; fail modes applied to this request",
				slog.String("kind", string(KindOf(err))), slog.Any("err", err))
		}
		f.cached, _ = l.backend.(backend.CachedDecider)
		f.spread, _ = l.backend.(backend.Spread)
		c := l.cfg.breaker.withDefaults()
		f.breaker = failover.New(failover.Config(c), now, l.emitTransition, f.prober.Start, isTimeout, l.startConfirm)
		f.caller.Breaker = f.breaker
		p := &f.prober
		p.Breaker, p.Group, p.CoolDown, p.MaxCoolDown = f.breaker, f.group, c.CoolDown, c.MaxCoolDown
		p.Probe = l.probe
		p.Recovered = func() { l.handOverFrom(l.cfg.clock()) }
		p.Closed = f.resend.Poke // writes that waited for the recovery
	}
	usesLocal := l.cfg.failMode == FailLocal
	for i := range l.rules {
		switch m := l.rules[i].FailMode; {
		case m == FailLocal:
			usesLocal = true
		case m > FailLocal:
			// An unknown mode must not quietly behave as open.
			l.Close()
			return fmt.Errorf("ceiling: rule %q: unknown fail mode %d", l.rules[i].Name, m)
		}
	}
	if usesLocal && l.remote {
		f.usesLocal = true
		f.local.Share, f.local.Store, f.local.Logger = l.cfg.localShare, l.cfg.localStore, l.cfg.logger
		f.local.HandOver = l.cfg.breaker.MaxCoolDown + l.cfg.timeout
		f.local.Seen.Init()
		n := len(l.rules)
		f.scratch.New = func() any {
			return &localScratch{reqs: make([]backend.Request, 0, n), out: make([]backend.Result, n), idx: make([]int, 0, n), wait: make([]time.Duration, 0, n)}
		}
	}
	if !l.remote && l.cfg.instances > 1 {
		f.warning = fmt.Sprintf("in-process backend with %d instances declared: every instance enforces the full limit, "+
			"so the effective limit is up to %d times the configured one; share a backend (package backend/redis) to enforce it exactly",
			l.cfg.instances, l.cfg.instances)
		l.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling: limits are per instance",
			slog.Int("instances", l.cfg.instances), slog.String("reason", f.warning))
	}
	return nil
}

// Close releases what the limiter started: the background prober (waiting
// for a probe in flight, at most about the timeout), the default memory
// store (its janitor goroutine) and FailLocal's store. It does not close a
// backend passed with [WithBackend]: its owner does. Close is idempotent;
// the limiter must not be used after it. From Close on, [Limiter.Health]
// reports Status "closed", and the observer's health function no longer
// holds the limiter: an exporter drops it at its next collection.
func (l *Limiter) Close() error {
	var err error
	l.fo.once.Do(func() {
		l.fo.group.Stop()
		l.closeHealth()
		for _, c := range l.fo.closers {
			err = errors.Join(err, c.Close())
		}
		err = errors.Join(err, l.fo.local.Close())
	})
	return err
}

// UnavailableError is the error behind a 503 (and [Limiter.Decide]'s
// refusal): the backend could not decide and a rule of the request fails
// closed, or this process was too busy to ask it in time (Err wraps
// [backend.ErrNotSent]: the request was shed, whatever the fail modes), or
// a FailOpen rule's call timed out before a probe confirmed that the
// backend is at fault (shed too).
type UnavailableError struct {
	// Rule is the first enforced rule, in declaration order, that fails
	// closed (or, for a shed request, the first enforced rule).
	Rule string
	// Err is why the backend could not decide.
	Err error
	// RetryAfter is when to try again: until the backend will next be
	// asked, at least a second.
	RetryAfter time.Duration
	// Shed is true when the request was shed whatever its rules' fail
	// modes: this process could not get the backend's verdict in time and
	// no probe has yet found the backend at fault. False: a rule fails
	// closed.
	Shed bool
}

// unavailable is the refusal of a request whose rule fails closed.
func (l *Limiter) unavailable(rule string, cause error) *UnavailableError {
	retry := time.Second
	if b := l.fo.breaker; b != nil {
		retry = max(retry, b.RetryIn())
	}
	return &UnavailableError{Rule: rule, Err: cause, RetryAfter: retry}
}

// Error names the rule that failed closed, or the shed request's first
// rule, and why.
func (e *UnavailableError) Error() string {
	if overloaded(e.Err) {
		return fmt.Sprintf("ceiling: request shed (rule %q): %v", e.Rule, e.Err)
	}
	return fmt.Sprintf("ceiling: rule %q fails closed: %v", e.Rule, e.Err)
}

// Unwrap returns why the backend could not decide.
func (e *UnavailableError) Unwrap() error { return e.Err }

// decideBackend is the failure engine's entry for a request: it decides
// st on the backend (during the hand-over after a recovery, on the local
// store too), and when the backend cannot, by the rules' fail modes
// (fallback). It returns the results, or the backend's own refusal of
// what it was sent ([backend.ErrInvalidRequest], no fail mode applies), or
// why the request is refused (an *UnavailableError).
func (l *Limiter) decideBackend(ctx context.Context, st *state) ([]backend.Result, error) {
	results := st.results[:len(st.reqs)]
	decided, err := false, error(nil)
	if l.handOverLocal() {
		decided, err = l.handover(ctx, st)
	}
	if !decided {
		err = l.call(ctx, st.reqs, results)
	}
	switch {
	case err == nil:
		return results, nil
	case errors.Is(err, backend.ErrInvalidRequest):
		return nil, err
	}
	if l.concurrent {
		l.releaseUnknown(st, err)
	}
	return l.fallback(ctx, st, err)
}

// fallback decides the request by its rules' fail modes after the backend
// failed with cause. It fills out like the backend would have, marking each
// result's Fallback, or returns an *UnavailableError when a rule fails
// closed. A request that the backend's cache in process rejects (a key the
// Redis deny cache holds as spent) is rejected from it instead, by no fail
// mode: a 429 until the key's RetryAfter, during an outage as before it.
func (l *Limiter) fallback(ctx context.Context, st *state, cause error) ([]backend.Result, error) {
	d := &st.decision
	if c := l.fo.cached; c != nil && c.DecideCached(st.reqs, st.results[:len(st.reqs)]) {
		// A key the backend refused until a time still to come: refused
		// from its cache, whatever the fail modes, and no evidence either
		// way about the backend.
		if o := l.cfg.observer; o != nil {
			o.ObserveCached()
		}
		return st.results[:len(st.reqs)], nil
	}
	if overloaded(cause) {
		if err := l.shed(d, cause); err != nil {
			return nil, err
		}
	}
	unconfirmed := l.unconfirmed(cause)
	local, open := 0, false
	for i := range d.Results {
		rule := d.Results[i].Rule
		switch m := l.modeOf(rule); {
		case m == FailClosed && !rule.Shadow:
			return nil, l.unavailable(rule.Name, cause)
		case m == FailLocal:
			local++
		case m == FailOpen && !rule.Shadow:
			open = true
		}
	}
	if open && unconfirmed {
		return nil, l.shed(d, fmt.Errorf("%w: %w", errUnconfirmed, cause))
	}
	out := st.results[:len(st.reqs)]
	var sc *localScratch
	if local > 0 {
		if !l.fo.usesLocal {
			// An in-process backend failed: there is nothing more local.
			return nil, l.unavailable(d.Results[0].Rule.Name, cause)
		}
		sc = l.fo.scratch.Get().(*localScratch)
		defer l.fo.scratch.Put(sc)
		sc.reqs, sc.idx = sc.reqs[:0], sc.idx[:0]
	}
	for i := range d.Results {
		rr := &d.Results[i]
		rr.Fallback = l.modeOf(rr.Rule)
		if rr.Fallback == FailLocal {
			sc.reqs = append(sc.reqs, localRequest(st.reqs[i], l.cfg.localShare))
			sc.idx = append(sc.idx, i)
			continue
		}
		// Open, or a shadow rule failing closed: admitted, unenforced.
		rr.Fallback = FailOpen
		out[i] = backend.Result{Allowed: true, Limit: st.reqs[i].Limit}
	}
	if local > 0 {
		if err := l.decideLocal(ctx, st, sc, out); err != nil {
			return nil, l.unavailable(d.Results[sc.idx[0]].Rule.Name, fmt.Errorf("%w; local store: %w", cause, err))
		}
	}
	return out, nil
}

// shed refuses a request whose backend call this process never got to
// send ([backend.ErrNotSent]), or whose reply it never got to read
// ([backend.ErrUnread]): it was too busy (every CPU, or every connection,
// taken) to ask the backend within the timeout. That is not
// the backend's failure, so no fail mode applies: admitting the request
// unmetered (FailOpen) or on a share of the limit (FailLocal) would let a
// flood that saturates the instance buy a weaker limit, exactly when it
// matters most. The request gets 503 with Retry-After instead, which also
// takes load off the saturated process; a request whose rules are all
// shadow rules is not refused (shed returns nil), since shadow rules never
// refuse.
func (l *Limiter) shed(d *Decision, cause error) error {
	for i := range d.Results {
		if r := d.Results[i].Rule; !r.Shadow {
			l.fo.shed.Add(1)
			return &UnavailableError{Rule: r.Name, Err: cause, RetryAfter: time.Second, Shed: true}
		}
	}
	return nil
}

// errUnconfirmed is the cause of a request shed because its call timed
// out before a probe confirmed that the backend is at fault. It wraps
// [backend.ErrUnread], as the request is shed like one whose reply this
// process was too busy to read, so that observers (metrics/prometheus,
// metrics/otel) and [KindOf] count it shed, as Health does, not failed
// closed.
var errUnconfirmed = fmt.Errorf("%w (a timeout no probe has confirmed yet)", backend.ErrUnread)

// unconfirmed reports a timeout while the breaker is closed: no probe has
// confirmed yet that the backend is at fault, and this process may as well
// have been too busy to read a reply that came (the backend could not say
// which). FailOpen does not apply then, since a flood that saturates the
// instance would buy unmetered admissions: the request is shed instead,
// and FailLocal, already bounded, decides locally. Once a probe confirms
// the timeouts, every fail mode applies, whether or not the breaker opens
// (on Redis Cluster one frozen master's timeouts come between the other
// masters' answers, which keep the breaker closed).
func (l *Limiter) unconfirmed(cause error) bool {
	b := l.fo.breaker
	return b != nil && b.Closed() && isTimeout(cause) && b.Unconfirmed()
}

// failed answers a request that its rules' fail modes cannot admit (a rule
// fails closed): 503 with Retry-After set to when the backend will next be
// tried. The cause is reported by the degradation events, never sent to the
// client.
func (l *Limiter) failed(w http.ResponseWriter, r *http.Request, err error) {
	retry := time.Second
	var ue *UnavailableError
	if errors.As(err, &ue) {
		retry = ue.RetryAfter
	}
	if l.cfg.logger.Enabled(r.Context(), slog.LevelDebug) {
		l.cfg.logger.LogAttrs(r.Context(), slog.LevelDebug, "ceiling: request refused failing closed", slog.Any("err", err))
	}
	writeUnavailable(w, retry)
}

// FailLocal's store, and how its bound holds across the edges of an
// outage, live in failover.Local (see there); this file hands it the
// rules that fail local.

// localStore is FailLocal's store.
type localStore = failover.LocalStore

// localRequest is req scaled to its share of the limit.
var localRequest = failover.Scaled

// localStore returns FailLocal's store, creating it on first use.
func (l *Limiter) localStore() *localStore { return l.fo.local.Get() }

type localScratch struct {
	reqs []backend.Request
	out  []backend.Result
	idx  []int           // the decision's index of each local request
	wait []time.Duration // > 0: refused by its seed for that long
}

// decideLocal decides sc.reqs (already scaled to the local share) on the
// local store, all or nothing, into out at sc.idx, starting each key from
// what the backend last said of it, and journals what it admits.
func (l *Limiter) decideLocal(ctx context.Context, st *state, sc *localScratch, out []backend.Result) error {
	lo := sc.out[:len(sc.reqs)]
	sc.wait = append(sc.wait[:0], make([]time.Duration, len(sc.reqs))...)
	if err := l.fo.local.Decide(ctx, l.cfg.clock(), sc.reqs, sc.wait, lo, st.reqs, sc.idx); err != nil {
		return err
	}
	for j, i := range sc.idx {
		out[i] = lo[j]
	}
	return nil
}

// chargeLocal charges the backend with what the local store still counts
// for every key it admitted while degraded, forced, then takes every
// concurrency slot this instance holds again on the backend (retakeSlots).
// The prober calls it once the backend answers, before closing the
// breaker; on error the journal keeps what was not charged, and the slots
// not moved stay local.
func (l *Limiter) chargeLocal() error {
	if err := l.chargeJournal(); err != nil {
		return err
	}
	return l.retakeSlots(context.Background())
}

// chargeJournal charges the backend with the rate rules' units the local
// store admitted (chargeLocal).
func (l *Limiter) chargeJournal() error {
	ctx := context.Background()
	keys, units, err := l.fo.local.Charge(ctx, func(reqs []backend.Request) error {
		return l.bounded(ctx, op{reqs: reqs, out: make([]backend.Result, len(reqs))})
	})
	if keys > 0 {
		l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: charged the backend with what FailLocal admitted while it was down",
			slog.Int("keys", keys), slog.Int64("units", units))
	}
	return err
}

// handover decides st's FailLocal rules on the local store first, at the
// instance's share, then the whole request on the backend, while the
// hand-over after a recovery lasts (failover.Local.HandOverDecide). It
// reports whether it decided (the results are in st.results); an error is
// the backend's, for the fail modes. When no rule fails local it does
// nothing.
func (l *Limiter) handover(ctx context.Context, st *state) (bool, error) {
	d := &st.decision
	f := l.fo
	sc := f.scratch.Get().(*localScratch)
	defer f.scratch.Put(sc)
	sc.reqs, sc.idx = sc.reqs[:0], sc.idx[:0]
	for i := range d.Results {
		if l.modeOf(d.Results[i].Rule) == FailLocal {
			sc.reqs = append(sc.reqs, localRequest(st.reqs[i], l.cfg.localShare))
			sc.idx = append(sc.idx, i)
		}
	}
	if len(sc.reqs) == 0 {
		return false, nil
	}
	lo := sc.out[:len(sc.reqs)]
	out := st.results[:len(st.reqs)]
	ok, refused, err := f.local.HandOverDecide(ctx, sc.reqs, lo, func() (bool, error) {
		err := l.call(ctx, st.reqs, out)
		admitted := err == nil
		for i := range out {
			admitted = admitted && (out[i].Allowed || st.reqs[i].Shadow)
		}
		return admitted, err
	})
	if !ok {
		return false, nil // the backend alone, then
	}
	if refused {
		for i := range out {
			out[i] = backend.Result{Allowed: true, Limit: st.reqs[i].Limit, Unread: true}
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
			d.Results[i].Fallback = FailLocal
		}
		return true, nil
	}
	return true, err
}

// chargeBatch is how many keys one recovery charge call carries.
const chargeBatch = failover.ChargeBatch

// Every backend call goes through the engine's failover.Caller (see
// there): bounded, through the breaker, observed and judged.

// ErrTimeout is wrapped by the error of a backend call that took longer
// than the limiter's timeout ([WithTimeout]).
var ErrTimeout = failover.ErrTimeout

// ErrDegraded is wrapped by the error of a call that was not made because
// the circuit breaker is open: the backend is failing and the limiter is
// probing it in the background ([Limiter.Health] says why).
var ErrDegraded = failover.ErrDegraded

// errBreakerOpen is the cause of a fallback decided without calling the
// backend because the circuit breaker is open.
var errBreakerOpen = failover.ErrBreakerOpen

// notSent reports a call that never reached the backend because this
// process did not get to write it.
func notSent(err error) bool { return err != nil && errors.Is(err, backend.ErrNotSent) }

// overloaded reports a call that failed by this process's fault, not the
// backend's ([backend.ErrNotSent], [backend.ErrUnread]).
var overloaded = failover.Overloaded

// op is one backend operation: a decision of reqs into out, or, with
// reset set, a Reset of keys.
type op struct {
	reqs    []backend.Request
	out     []backend.Result
	keys    []string
	reset   bool
	timeout time.Duration // zero: the limiter's
}

func (o op) fo() failover.Op {
	return failover.Op{Reqs: o.reqs, Out: o.out, Keys: o.keys, Reset: o.reset, Timeout: o.timeout}
}

// call decides reqs into out with one backend call, through the breaker.
func (l *Limiter) call(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	return l.fo.caller.Decide(ctx, reqs, out)
}

// callOutside is a backend call outside a request's decision (a
// settlement, a charge, a peek, a reset), through the breaker.
func (l *Limiter) callOutside(ctx context.Context, o op) error {
	return l.fo.caller.Outside(ctx, o.fo())
}

// bounded is a call bounded by the timeout, neither through the breaker
// nor judged: the probes and the check.
func (l *Limiter) bounded(ctx context.Context, o op) error {
	return l.fo.caller.Bounded(ctx, o.fo())
}

// decideInto is the bare call, neither bounded nor judged.
func (l *Limiter) decideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	return l.fo.caller.Do(ctx, failover.Op{Reqs: reqs, Out: out})
}

// answered takes an answer of the backend's own: it wakes the resends,
// and, for FailLocal, learns what the backend said of each key and
// charges it with what the local store admitted while the timeouts were
// unconfirmed.
func (l *Limiter) answered(reqs []backend.Request, out []backend.Result) {
	f := l.fo
	if f.resend.Pending() > 0 {
		f.resend.Poke()
	}
	if f.usesLocal && len(reqs) > 0 {
		f.local.Seen.Learn(reqs, out, l.cfg.clock())
		if f.local.Journal.Len() > 0 && f.breaker.Closed() {
			l.chargeSoon()
		}
	}
}

// errProbeCached is a probe answered from a cache in process: no evidence.
var errProbeCached = errors.New("ceiling: probe answered from a cache, not by the backend")

// probe asks the backend for a canary decision and, when it answers,
// charges it with what FailLocal admitted meanwhile. It reports why the
// backend cannot be trusted yet, or nil. On a backend of several servers
// ([backend.Spread]: Redis Cluster) there is one canary on each, decided in
// one call: every server must answer, or a cluster with a master down
// would look healthy whenever the canary's own master answers.
func (l *Limiter) probe() error {
	if err := l.canary(l.cfg.timeout); err != nil {
		return err
	}
	return l.chargeLocal()
}

// handOverFrom starts the hand-over after a recovery at now (failover.Local),
// if some rule fails local.
func (l *Limiter) handOverFrom(now time.Time) {
	if l.fo.usesLocal {
		l.fo.local.StartHandOver(now)
	}
}

// canary decides the probe's canaries within timeout and reports why the
// backend cannot be trusted yet, or nil.
func (l *Limiter) canary(timeout time.Duration) error {
	reqs, err := l.canaries(timeout)
	if err != nil {
		return err
	}
	out := make([]backend.Result, len(reqs))
	start := time.Now()
	err = l.bounded(context.Background(), op{reqs: reqs, out: out, timeout: timeout})
	if obs := l.cfg.observer; obs != nil {
		observeCall(obs, time.Since(start), out, err)
	}
	if err != nil {
		return err
	}
	for i := range out {
		switch {
		case out[i].Cached:
			return errProbeCached
		case !out[i].Allowed:
			return fmt.Errorf("ceiling: probe: the backend rejected a canary far under its limit (retry after %v)", out[i].RetryAfter)
		}
	}
	return nil
}

// confirmBudget is the least time the probe that confirms a run of
// timeouts gives the backend: a healthy Redis answers a canary in well
// under a millisecond, so one that sends nothing for a second is at fault,
// while a process too busy to read replies within the request timeout
// usually reads this one.
const confirmBudget = time.Second

// startConfirm starts the probe that confirms a run of timeouts (the
// breaker calls it, see failover.Breaker.Failure), off every request's
// path: requests meanwhile keep calling the backend, and a timeout sheds
// their FailOpen rules (unconfirmed).
func (l *Limiter) startConfirm() {
	b := l.fo.breaker
	if !l.fo.group.Go(func() {
		if err := l.confirm(); overloaded(err) {
			b.NoVerdict()
		} else {
			b.Confirmed(err)
		}
	}) {
		b.Confirmed(nil) // closed: nothing more to confirm
	}
}

// chargeSoon charges the backend, in the background, with what FailLocal
// admitted while the breaker was closed (timeouts no probe had confirmed
// yet), once the backend answers again: the recovery's charge, without a
// recovery. One charge runs at a time.
func (l *Limiter) chargeSoon() {
	f := l.fo
	if !f.charging.CompareAndSwap(false, true) {
		return
	}
	if !f.group.Go(func() {
		defer f.charging.Store(false)
		_ = l.chargeJournal() // on error the journal keeps it for the next answer
	}) {
		f.charging.Store(false)
	}
}

// confirm decides the canaries with their own budget and reports whether
// the backend is at fault: nil when it answered in time, an overloaded
// error when this process was too busy to ask it (no verdict), or the
// failure. A canary answered within its budget but later than the
// timeout says the backend may be too slow for the timeout, or this
// process too slow to read it: the canaries then go again at the timeout,
// and the backend's own judgement of that call decides (a backend that
// stays silent past the timeout is at fault; a reply that waits to be read
// is this process's delay, no verdict).
func (l *Limiter) confirm() error {
	start := time.Now()
	err := l.canary(max(l.cfg.timeout, confirmBudget))
	if err == nil && time.Since(start) > l.cfg.timeout {
		err = l.canary(l.cfg.timeout)
	}
	if err == nil {
		// The edge of what may have been an outage that other instances
		// saw confirmed: hand over as after a recovery, and charge what
		// FailLocal admitted meanwhile.
		l.handOverFrom(l.cfg.clock())
		if l.fo.local.Journal.Len() > 0 {
			l.chargeSoon()
		}
	}
	return err
}

// canaries are the probe's requests: the canary, or one variant of it on
// each server of a backend of several.
func (l *Limiter) canaries(timeout time.Duration) ([]backend.Request, error) {
	c := l.fo.canary
	if l.fo.spread == nil {
		return []backend.Request{c}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	keys, err := l.fo.spread.SpreadKeys(ctx, c.Key)
	if err != nil {
		return nil, fmt.Errorf("ceiling: probe: %w", err)
	}
	reqs := make([]backend.Request, len(keys))
	for i, k := range keys {
		reqs[i] = c
		reqs[i].Key = k
	}
	return reqs, nil
}

// trip opens the breaker at once, without waiting for consecutive
// failures: the start-up check found the backend unable to decide.
func (l *Limiter) trip(err error) {
	if b := l.fo.breaker; b != nil {
		b.Open(err, 1)
	}
}

// unsent reports whether a failed call surely never reached the backend,
// so that a settlement may be resent (failover.Resendable).
func unsent(err error) bool {
	return errors.Is(err, ErrDegraded) || notSent(err)
}

// resendLater queues what of reqs (whose call failed with err) may be sent
// again (failover.Resends). It reports how many requests were dropped
// instead.
func (l *Limiter) resendLater(reqs []backend.Request, err error, what string) int {
	if !l.remote {
		return 0
	}
	return l.fo.resend.Later(reqs, err, what)
}

// droppedWrites logs, sampled, n requests of a write given up for good.
func (l *Limiter) droppedWrites(n int, what, why string, total int64) {
	l.fo.resendLog.log(l.cfg.logger, time.Now(), slog.LevelError,
		"ceiling: a "+what+" was given up after its call failed; its units stay counted until they expire",
		slog.Int("requests", n), slog.String("why", why), slog.Int64("dropped_total", total))
}

// What the rest of the package asks of the engine. No file but this one
// reads or writes l.fo: each of these is one question or one report.

// countFallback counts an admission that rr's fail mode made.
func (l *Limiter) countFallback(rr *RuleResult) {
	c := &l.fo.counts[l.ruleIndex(rr.Rule)]
	if rr.Fallback == FailOpen {
		c.failOpen.Add(1)
	} else {
		c.failLocal.Add(1)
	}
}

// countShadow counts a would-be rejection of rule i and reports whether to
// log it now, and how many requests the line stands for.
func (l *Limiter) countShadow(i int) (bool, int64) {
	l.fo.counts[i].shadow.Add(1)
	return l.fo.shadow[i].allow(l.cfg.clock())
}

// limitLogAllow reports whether to log now that rule i had no valid limit,
// and how many requests the line stands for.
func (l *Limiter) limitLogAllow(i int) (bool, int64) {
	return l.fo.limitLog[i].allow(l.cfg.clock())
}

// firstEmptyKey reports whether rule i's key function returned "" for the
// first time.
func (l *Limiter) firstEmptyKey(i int) bool {
	return l.fo.emptyKeyLogged[i].CompareAndSwap(false, true)
}

// logLease logs, sampled, a failed release or renewal of slots.
func (l *Limiter) logLease(msg string, err error) {
	l.fo.leaseLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, msg, slog.Any("err", err))
}

// slotsInUse adds n units to rule i's slots in use.
func (l *Limiter) slotsInUse(i int, n int64) { l.fo.counts[i].slots.Add(n) }

// pendingWrites, backendFailures and canaryKey are what tests read of the
// engine: the writes waiting for a resend, the breaker's run of failures,
// and the probe's key.
func (l *Limiter) pendingWrites() int64   { return l.fo.resend.Pending() }
func (l *Limiter) backendFailures() int64 { return l.fo.breaker.Fails() }
func (l *Limiter) canaryKey() string      { return l.fo.canary.Key }

// holdSlots, liveSlots and dropSlots track the decisions holding
// concurrency slots, which a recovery takes again on the backend.
func (l *Limiter) holdSlots(p weak.Pointer[held]) { l.fo.slots.add(p) }
func (l *Limiter) liveSlots() []*held             { return l.fo.slots.live() }
func (l *Limiter) dropSlots(h *held)              { l.fo.slots.remove(h) }

// breakerClosed reports whether the backend is called (no breaker: an
// in-process backend, always).
func (l *Limiter) breakerClosed() bool {
	b := l.fo.breaker
	return b == nil || b.Closed()
}

// inHandOver reports whether the hand-over after a recovery runs, and
// handOverLocal whether FailLocal rules are then decided locally too.
func (l *Limiter) inHandOver() bool    { return l.fo.local.HandingOver(l.cfg.clock()) }
func (l *Limiter) handOverLocal() bool { return l.fo.usesLocal && l.inHandOver() }

// loadedLocal is FailLocal's store if a fallback created it, else nil.
func (l *Limiter) loadedLocal() *localStore { return l.fo.local.Loaded() }

// engineWarnings is the configuration warning the engine holds, if any.
func (l *Limiter) engineWarnings() []string {
	if l.fo.warning == "" {
		return nil
	}
	return []string{l.fo.warning}
}

// reportEngine fills in what the engine knows of h: the breaker's state,
// the writes dropped, the requests shed, and each rule's fail-mode
// admissions, shadow rejections and concurrency slots in use (h.Rules is one per rule, in order).
func (l *Limiter) reportEngine(h *Health) {
	h.DroppedWrites = l.fo.resend.DroppedTotal()
	h.Shed = l.fo.shed.Load()
	if b := l.fo.breaker; b != nil {
		h.Backend = "remote"
		s := b.Status()
		h.DegradedTotal = s.Opened
		if s.Degraded {
			h.Status, h.Since, h.NextProbeSeconds = "degraded", s.Since, s.RetryIn.Seconds()
			if s.Cause != nil {
				h.Reason = KindOf(s.Cause)
			}
		}
	}
	for i := range h.Rules {
		c := &l.fo.counts[i]
		h.Rules[i].FailOpenAdmissions = c.failOpen.Load()
		h.Rules[i].FailLocalAdmissions = c.failLocal.Load()
		h.Rules[i].ShadowRejections = c.shadow.Load()
		h.Rules[i].SlotsInUse = c.slots.Load()
	}
}

// emitTransition reports a transition of the breaker.
func (l *Limiter) emitTransition(t failover.Transition) {
	l.emitDegraded(DegradedEvent{Degraded: t.Degraded, Cause: t.Cause, At: t.At, Failures: t.Failures, Duration: t.Duration})
}

// emitDegraded logs, counts and reports a transition: loud, and once.
func (l *Limiter) emitDegraded(ev DegradedEvent) {
	unenforced := l.unenforced()
	ctx := context.Background()
	if ev.Degraded {
		l.fo.unenforcedAtDegrade.Store(unenforced)
		l.cfg.logger.LogAttrs(ctx, slog.LevelError, "ceiling: backend degraded; rules fall back to their fail modes until it answers again",
			slog.Any("cause", ev.Cause), slog.Int("consecutive_failures", ev.Failures), slog.String("fail_mode", l.cfg.failMode.String()))
	} else {
		ev.Unenforced = unenforced - l.fo.unenforcedAtDegrade.Load()
		l.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "ceiling: backend healthy again; limits enforced by the backend",
			slog.Duration("degraded_for", ev.Duration), slog.Int64("unenforced_admissions", ev.Unenforced))
	}
	if o := l.cfg.observer; o != nil {
		o.ObserveDegraded(ev)
	}
}

// unenforced is the number of rule admissions made by fail modes so far.
func (l *Limiter) unenforced() int64 {
	var n int64
	for i := range l.fo.counts {
		n += l.fo.counts[i].failOpen.Load() + l.fo.counts[i].failLocal.Load()
	}
	return n
}

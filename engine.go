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
// decide, behind the one field l.fo, which no other file touches. The
// engine is internal/failover (failover.Engine decides a request's calls
// and fail modes; the bounded call and its judgement, the breaker, the
// probes, FailLocal's store and hand-over, the resends); this file holds
// the fail modes as users name them, the wiring, the probes' canaries,
// and what the rest of the package asks of it (the end of the file).

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
func (m FailMode) String() string { return failover.Mode(m).String() }

// modeOf is the mode a rule falls back by.
func (l *Limiter) modeOf(r *Rule) FailMode {
	if r.FailMode != inherit {
		return r.FailMode
	}
	return l.cfg.failMode
}

// failState is the failure engine (failover.Engine) and what the
// limiter reports beside it: sampled log lines, per-rule counts, the
// health report's last word.
type failState struct {
	eng      failover.Engine
	errLog   sampler   // isolated backend errors while healthy
	shadow   []sampler // per rule: "would have rejected" log lines
	limitLog []sampler // per rule: requests refused for want of a limit (limits.go)
	leaseLog sampler   // failed releases and renewals of concurrency slots (concurrency.go)
	counts   []ruleCounts
	warning  string // configuration weaker than it reads (health warning)
	closers  []io.Closer
	once     sync.Once
	reported reported // the health report's last word (health.go)

	emptyKeyLogged []atomic.Bool // per rule: an empty key value was logged
	overloadLog    sampler       // calls this process was too busy to send
	resendLog      sampler       // writes given up after their call failed

	// The engine's background (the prober, the probe that confirms a
	// timeout, the charge after it, the resends), stopped by Close.
	group *failover.Group

	slots heldSlots // decisions holding concurrency slots (concurrency.go)
}

// ruleCounts are a rule's totals beside its fail-mode admissions
// (failover.Counts), reported by the health handler.
type ruleCounts struct {
	shadow counter
	slots  counter // units of Concurrency slots held now (concurrency.go)
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
	e := &f.eng
	e.Counts, e.Now, e.IsTimeout, e.Logger = make([]failover.Counts, len(l.rules)), l.cfg.clock, isTimeout, l.cfg.logger
	e.Default, e.Concurrent = failover.Mode(l.cfg.failMode), l.concurrent
	if c, ok := l.backend.(io.Closer); ok && l.cfg.backend == nil {
		f.closers = append(f.closers, c) // the default store New made
	}
	l.cfg.localShare = 1 / float64(l.cfg.instances)
	f.errLog.every = time.Minute
	f.overloadLog.every = time.Minute
	f.group = failover.NewGroup()
	f.leaseLog.every = time.Minute
	f.resendLog.every = time.Minute
	e.Resends.Keep, e.Resends.Dropped = l.kept, l.droppedWrites
	for i := range f.shadow {
		f.shadow[i].every = l.cfg.shadowLogEvery
		f.limitLog[i].every = limitLogEvery
	}
	e.Caller = failover.Caller{Backend: l.backend, Into: l.into, Timeout: l.cfg.timeout}
	if o := l.cfg.observer; o != nil {
		e.Caller.Observe = func(d time.Duration, out []backend.Result, err error) { observeCall(o, d, out, err) }
		e.OnCached = o.ObserveCached
		e.Degraded = func(t failover.Transition) { o.ObserveDegraded(DegradedEvent(t)) }
	}
	if l.remote {
		e.Caller.Overloaded = func(err error) {
			f.overloadLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn,
				"ceiling: this process was too busy to send backend calls in time; requests shed with 503, the backend is not blamed",
				slog.Any("err", err))
		}
		e.Caller.Failed = func(err error) {
			f.errLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, "ceiling: backend call failed; fail modes applied to this request",
				slog.String("kind", string(KindOf(err))), slog.Any("err", err))
		}
		e.Cached, _ = l.backend.(backend.CachedDecider)
		e.Spread, _ = l.backend.(backend.Spread)
		e.Retake = l.retakeSlots
		e.Start(failover.Config(l.cfg.breaker.withDefaults()), f.group)
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
		e.UsesLocal = true
		e.Local.Share, e.Local.Store, e.Local.Logger = l.cfg.localShare, l.cfg.localStore, l.cfg.logger
		e.Local.HandOver = l.cfg.breaker.MaxCoolDown + l.cfg.timeout
		e.Local.Seen.Init()
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
		err = errors.Join(err, l.fo.eng.Local.Close())
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
// st on the backend, and when the backend cannot, by the rules' fail modes
// (failover.Engine.Decide). It returns the results, or the backend's own
// refusal of what it was sent ([backend.ErrInvalidRequest], no fail mode
// applies), or why the request is refused (an *UnavailableError).
func (l *Limiter) decideBackend(ctx context.Context, st *state) ([]backend.Result, error) {
	results := st.results[:len(st.reqs)]
	err := l.fo.eng.Decide(ctx, st.reqs, results, st)
	if err == nil {
		return results, nil
	}
	if r, ok := err.(*failover.Refused); ok {
		return nil, &UnavailableError{Rule: st.decision.Results[r.Index].Rule.Name, Err: r.Err, RetryAfter: r.RetryAfter, Shed: r.Shed}
	}
	return nil, err
}

// Mode and Fell are what the engine asks of a request (failover.Rules):
// rule i's own fail mode, and the mode that decided it.
func (st *state) Mode(i int) failover.Mode {
	return failover.Mode(st.decision.Results[i].Rule.FailMode)
}
func (st *state) Fell(i int, m failover.Mode) { st.decision.Results[i].Fallback = FailMode(m) }

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

// localStore returns FailLocal's store, creating it on first use.
func (l *Limiter) localStore() *localStore { return l.fo.eng.Local.Get() }

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

// unsent reports whether a failed call surely never reached the backend.
var unsent = failover.Unsent

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

// callOutside is a backend call outside a request's decision (a
// settlement, a charge, a peek, a reset), through the breaker.
func (l *Limiter) callOutside(ctx context.Context, o op) error {
	return l.fo.eng.Caller.Outside(ctx, o.fo())
}

// bounded is a call bounded by the timeout, neither through the breaker
// nor judged: the probes and the check.
func (l *Limiter) bounded(ctx context.Context, o op) error {
	return l.fo.eng.Caller.Bounded(ctx, o.fo())
}

// decideInto is the bare call, neither bounded nor judged.
func (l *Limiter) decideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	return l.fo.eng.Caller.Do(ctx, failover.Op{Reqs: reqs, Out: out})
}

// confirmBudget is the least time the probe that confirms a run of
// timeouts gives the backend (failover.ConfirmBudget).
const confirmBudget = failover.ConfirmBudget

// trip opens the breaker at once, without waiting for consecutive
// failures: the start-up check found the backend unable to decide.
func (l *Limiter) trip(err error) {
	if b := l.fo.eng.Breaker; b != nil {
		b.Open(err, 1)
	}
}

// resendsAll reports whether every one of reqs could still be sent again
// after a failed call (a Period long enough beside the timeout).
func (l *Limiter) resendsAll(reqs []backend.Request) bool {
	for _, q := range reqs {
		if l.fo.eng.Resends.Window(q) <= 0 {
			return false
		}
	}
	return true
}

// resendLater queues what of reqs (whose call failed with err) may be sent
// again (failover.Resends). It reports how many requests were dropped
// instead.
func (l *Limiter) resendLater(reqs []backend.Request, err error, what string) int {
	if !l.remote {
		return 0
	}
	return l.fo.eng.Resends.Later(reqs, err, what)
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
	l.fo.eng.Count(l.ruleIndex(rr.Rule), failover.Mode(rr.Fallback))
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
func (l *Limiter) pendingWrites() int64   { return l.fo.eng.Resends.Pending() }
func (l *Limiter) backendFailures() int64 { return l.fo.eng.Breaker.Fails() }
func (l *Limiter) canaryKey() string      { return l.fo.eng.CanaryKey() }

// holdSlots, liveSlots and dropSlots track the decisions holding
// concurrency slots, which a recovery takes again on the backend.
func (l *Limiter) holdSlots(p weak.Pointer[held]) { l.fo.slots.add(p) }
func (l *Limiter) liveSlots() []*held             { return l.fo.slots.live() }
func (l *Limiter) dropSlots(h *held)              { l.fo.slots.remove(h) }

// breakerClosed reports whether the backend is called (no breaker: an
// in-process backend, always).
func (l *Limiter) breakerClosed() bool {
	b := l.fo.eng.Breaker
	return b == nil || b.Closed()
}

// inHandOver reports whether the hand-over after a recovery runs.
func (l *Limiter) inHandOver() bool { return l.fo.eng.Local.HandingOver(l.cfg.clock()) }

// reports is the health report's last word and the observer's way to it.
func (l *Limiter) reports() *reported { return &l.fo.reported }

// loadedLocal is FailLocal's store if a fallback created it, else nil.
func (l *Limiter) loadedLocal() *localStore { return l.fo.eng.Local.Loaded() }

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
	h.DroppedWrites = l.fo.eng.Resends.DroppedTotal()
	h.Shed = l.fo.eng.Shed()
	if b := l.fo.eng.Breaker; b != nil {
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
		c, e := &l.fo.counts[i], &l.fo.eng.Counts[i]
		h.Rules[i].FailOpenAdmissions = e.FailOpen.Load()
		h.Rules[i].FailLocalAdmissions = e.FailLocal.Load()
		h.Rules[i].ShadowRejections = c.shadow.Load()
		h.Rules[i].SlotsInUse = c.slots.Load()
	}
}

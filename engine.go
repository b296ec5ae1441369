package ceiling

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// The failure engine: everything the limiter does when the backend cannot
// decide, behind the one field l.fo, which no other file touches. In the
// order a request meets it: the fail modes and their fallback (shed, open,
// local, closed), every bounded backend call and its judgement (call,
// judge), the probe that closes the breaker without traffic, the resends of
// writes that failed, and what the rest of the package asks of it (the
// end of the file). The breaker and FailLocal's seeds and journal live in
// internal/failover; FailLocal's store and its hand-over in local.go.

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
	breaker *failover.Breaker // nil for in-process backends
	// cached answers from the backend's cache in process (the Redis deny
	// cache) when the backend cannot decide; nil if it keeps none.
	cached backend.CachedDecider
	// spread spreads the probe's canary over every server of a backend
	// made of several (Redis Cluster); nil for one server.
	spread backend.Spread
	// local is FailLocal's store, created on the first fallback that
	// needs it, so that a healthy limiter runs no second store.
	local     atomic.Pointer[localStore]
	usesLocal bool // some rule may fail local and the backend is remote
	localMu   sync.Mutex
	scratch   sync.Pool // *localScratch
	errLog    sampler   // isolated backend errors while healthy
	shadow    []sampler // per rule: "would have rejected" log lines
	limitLog  []sampler // per rule: requests refused for want of a limit (limits.go)
	leaseLog  sampler   // failed releases and renewals of concurrency slots (concurrency.go)
	counts    []ruleCounts
	warning   string // configuration weaker than it reads (health warning)
	closers   []io.Closer
	once      sync.Once

	emptyKeyLogged []atomic.Bool // per rule: an empty key value was logged
	overloadLog    sampler       // calls this process was too busy to send

	// FailLocal across the outage's edges (local.go).
	seen          failover.Seen    // what the backend last said of each key
	journal       failover.Journal // keys the local store admitted while degraded
	handoverUntil atomic.Int64     // Unix ns: FailLocal rules are decided locally too until then

	// The prober.
	canary  backend.Request
	probeMu sync.Mutex
	probing bool          // a probe loop runs
	stopped bool          // Close was called: start no more
	stop    chan struct{} // closed by Close
	probeWG sync.WaitGroup

	unenforcedAtDegrade counter
	shed                counter // requests refused because this process could not send their call

	resend resends   // writes to send again after their call failed
	slots  heldSlots // decisions holding concurrency slots (concurrency.go)
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
	f.stop = make(chan struct{})
	f.canary = newCanary()
	f.leaseLog.every = time.Minute
	f.resend.wake = make(chan struct{}, 1)
	f.resend.log.every = time.Minute
	for i := range f.shadow {
		f.shadow[i].every = l.cfg.shadowLogEvery
		f.limitLog[i].every = limitLogEvery
	}
	if l.remote {
		f.cached, _ = l.backend.(backend.CachedDecider)
		f.spread, _ = l.backend.(backend.Spread)
		c := l.cfg.breaker.withDefaults()
		f.breaker = failover.New(failover.Config(c), now, l.emitTransition, l.startProber, isTimeout)
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
		f.seen.Init()
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
// the limiter must not be used after it.
func (l *Limiter) Close() error {
	var err error
	l.fo.once.Do(func() {
		l.stopProber()
		l.fo.localMu.Lock()
		defer l.fo.localMu.Unlock()
		for _, c := range l.fo.closers {
			err = errors.Join(err, c.Close())
		}
	})
	return err
}

// UnavailableError is the error behind a 503 (and [Limiter.Decide]'s
// refusal): the backend could not decide and a rule of the request fails
// closed, or this process was too busy to ask it in time (Err wraps
// [backend.ErrNotSent]: the request was shed, whatever the fail modes).
type UnavailableError struct {
	// Rule is the first enforced rule, in declaration order, that fails
	// closed (or, for a shed request, the first enforced rule).
	Rule string
	// Err is why the backend could not decide.
	Err error
	// RetryAfter is when to try again: until the backend will next be
	// asked, at least a second.
	RetryAfter time.Duration
}

// unavailable is the refusal of a request whose rule fails closed.
func (l *Limiter) unavailable(rule string, cause error) *UnavailableError {
	retry := time.Second
	if b := l.fo.breaker; b != nil {
		retry = max(retry, b.RetryIn())
	}
	return &UnavailableError{Rule: rule, Err: cause, RetryAfter: retry}
}

// Error names the rule that failed closed and why.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("ceiling: rule %q fails closed: %v", e.Rule, e.Err)
}

// Unwrap returns why the backend could not decide.
func (e *UnavailableError) Unwrap() error { return e.Err }

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
	local := 0
	for i := range d.Results {
		rule := d.Results[i].Rule
		switch m := l.modeOf(rule); {
		case m == FailClosed && !rule.Shadow:
			return nil, l.unavailable(rule.Name, cause)
		case m == FailLocal:
			local++
		}
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
			return &UnavailableError{Rule: r.Name, Err: cause, RetryAfter: time.Second}
		}
	}
	return nil
}

// localRequest is req scaled to its share of the limit (the rule's, or the
// call's own), never so small that the request's cost could not fit.
func localRequest(req backend.Request, share float64) backend.Request {
	req.Limit = scaled(req.Limit, share, req.Cost)
	if req.Burst > 0 {
		req.Burst = scaled(req.Burst, share, req.Cost)
	}
	return req
}

func scaled(n int64, share float64, cost int64) int64 {
	v := int64(float64(n) * share)
	if v < cost {
		v = cost
	}
	if v < 1 {
		v = 1
	}
	if v > n {
		v = n
	}
	return v
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

// Every call the limiter makes to a backend that does I/O goes through here:
// decisions, settlements, charges, peeks, resets, probes and the start-up
// check. Each is bounded by the limiter's own timeout whatever the caller's
// context does, skipped while the circuit breaker is open (except the
// probes and the check, whose job is to call), and judged by one rule:
// only the backend's own answers and failures move the breaker. A call the
// backend never wrote ([backend.ErrNotSent]: this process was too busy, or
// every connection was taken) says nothing about the backend; it is this
// process that is overloaded, and the request is shed (see shed).

// errResultCount is returned when a backend breaks the contract by
// answering the wrong number of results.
var errResultCount = errors.New("ceiling: backend answered the wrong number of results")

// ErrTimeout is wrapped by the error of a backend call that took longer
// than the limiter's timeout ([WithTimeout]).
var ErrTimeout = errors.New("ceiling: backend timed out")

// ErrDegraded is wrapped by the error of a call that was not made because
// the circuit breaker is open: the backend is failing and the limiter is
// probing it in the background ([Limiter.Health] says why).
var ErrDegraded = errors.New("ceiling: backend degraded; not called until a probe answers")

// errBreakerOpen is the cause of a fallback decided without calling the
// backend because the circuit breaker is open.
var errBreakerOpen = fmt.Errorf("%w (circuit breaker open)", ErrDegraded)

// notSent reports a call that never reached the backend because this
// process did not get to write it.
func notSent(err error) bool { return err != nil && errors.Is(err, backend.ErrNotSent) }

// overloaded reports a call that failed by this process's fault, not the
// backend's: it was never written ([backend.ErrNotSent]), or its reply
// came too late to be read by a process too busy to run the goroutine
// that reads it ([backend.ErrUnread]; the call may have been applied).
func overloaded(err error) bool {
	return notSent(err) || (err != nil && errors.Is(err, backend.ErrUnread))
}

// call decides reqs into out with one backend call. For a backend that does
// I/O it goes through the circuit breaker (failing at once while it is
// open) and is bounded by the timeout.
func (l *Limiter) call(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	obs := l.cfg.observer
	b := l.fo.breaker
	if b == nil {
		var start time.Time
		if obs != nil {
			start = time.Now()
		}
		err := l.decideInto(ctx, reqs, out)
		if obs != nil {
			observeCall(obs, time.Since(start), out, err)
		}
		return err
	}
	if !b.Closed() {
		return errBreakerOpen
	}
	start := time.Now()
	err := l.bounded(ctx, op{reqs: reqs, out: out})
	if obs != nil {
		observeCall(obs, time.Since(start), out, err)
	}
	l.judge(reqs, out, err)
	return err
}

// judge moves the breaker by a call's outcome: an answer of the backend's
// own resets the failure count, a cached answer or a call never sent says
// nothing, and any other failure counts towards opening.
func (l *Limiter) judge(reqs []backend.Request, out []backend.Result, err error) {
	b := l.fo.breaker
	switch {
	case err != nil && errors.Is(err, backend.ErrInvalidRequest):
		// What the caller sent, not the backend's health.
		return
	case err == nil:
		if len(out) > 0 && out[0].Cached {
			return // the deny cache answered: no evidence either way
		}
		b.Success()
		if l.fo.resend.pending.Load() > 0 {
			l.fo.resend.poke() // the backend answers: send what waits
		}
		if l.fo.usesLocal && len(reqs) > 0 {
			l.fo.seen.Learn(reqs, out, l.cfg.clock())
		}
	case overloaded(err):
		l.fo.overloadLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn,
			"ceiling: this process was too busy to send backend calls in time; requests shed with 503, the backend is not blamed",
			slog.Any("err", err))
	default:
		if b.Failure(err) {
			l.fo.errLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, "ceiling: backend call failed; fail modes applied to this request",
				slog.String("kind", string(KindOf(err))), slog.Any("err", err))
		}
	}
}

// decideInto calls the backend, preferring the allocation-free path, and
// checks the answer's shape.
func (l *Limiter) decideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if l.into != nil {
		return l.into.DecideInto(ctx, reqs, out)
	}
	res, err := l.backend.Decide(ctx, reqs)
	if err != nil {
		return err
	}
	if len(res) != len(reqs) {
		return fmt.Errorf("%w: %d for %d requests", errResultCount, len(res), len(reqs))
	}
	copy(out, res)
	return nil
}

// op is one backend operation: a decision of reqs into out, or, with
// reset set, a Reset of keys.
type op struct {
	reqs    []backend.Request
	out     []backend.Result
	keys    []string
	reset   bool
	timeout time.Duration // zero: the limiter's
}

func (l *Limiter) do(ctx context.Context, o op) error {
	if o.reset {
		return l.backend.Reset(ctx, o.keys...)
	}
	return l.decideInto(ctx, o.reqs, o.out)
}

// bounded runs o on the caller's goroutine under the limiter's own
// deadline: the caller's cancellation does not reach the backend (a client
// that goes away is not a backend failure, and its decision counts like any
// other). The backend returns by the deadline (the [backend.Backend]
// contract), or, once it wrote the call, when the reply comes or the
// timeout has passed since the write; a call it never wrote fails with
// [backend.ErrNotSent]. A call that comes back failed after the deadline
// is a timeout, whatever error the backend gave.
func (l *Limiter) bounded(ctx context.Context, o op) error {
	timeout := o.timeout
	if timeout <= 0 {
		timeout = l.cfg.timeout
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	err := l.do(ctx, o)
	cancel()
	if err == nil || errors.Is(err, ErrTimeout) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || time.Since(start) >= timeout {
		return fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
	}
	return err
}

// callOutside is a backend call outside a request's decision (a settlement,
// a charge, a peek, a reset): bounded like every call, skipped while the
// circuit breaker is open (it could only wait and fail), and judged like a
// decision.
func (l *Limiter) callOutside(ctx context.Context, o op) error {
	if !l.remote {
		return l.do(ctx, o)
	}
	b := l.fo.breaker
	if !b.Closed() {
		return errBreakerOpen
	}
	start := time.Now()
	err := l.bounded(ctx, o)
	if obs := l.cfg.observer; obs != nil && !o.reset {
		observeCall(obs, time.Since(start), o.out, err)
	}
	l.judge(o.reqs, o.out, err)
	return err
}

// While the circuit breaker is open, one goroutine per limiter probes the
// backend, so that recovery needs no traffic: an idle instance whose health
// check is a readiness probe would otherwise stay out of rotation forever.

// newCanary is the probe's request: a real decision (so a backend that
// answers but cannot write, read-only or out of memory, fails it) on a key
// of its own that no rule's stored key can equal (those end in a 22-byte
// digest), limited so high that it is never rejected, with a one-second
// period so that the backend forgets it at once.
func newCanary() backend.Request {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return backend.Request{
		Key:       "ceiling-probe:" + hex.EncodeToString(id[:]),
		Algorithm: backend.FixedWindow,
		Limit:     backend.MaxLimit,
		Period:    time.Second,
		Cost:      1,
	}
}

// errProbeCached is a probe answered from a cache in process: no evidence.
var errProbeCached = errors.New("ceiling: probe answered from a cache, not by the backend")

// startProber starts the probe loop; the breaker calls it when it opens.
func (l *Limiter) startProber() {
	f := l.fo
	f.probeMu.Lock()
	defer f.probeMu.Unlock()
	if f.stopped || f.probing {
		return
	}
	f.probing = true
	f.probeWG.Add(1)
	go l.probeLoop()
}

// stopProber stops the probe loop and waits for it.
func (l *Limiter) stopProber() {
	f := l.fo
	f.probeMu.Lock()
	if !f.stopped {
		f.stopped = true
		close(f.stop)
	}
	f.probeMu.Unlock()
	f.probeWG.Wait()
}

// probeLoop probes the backend until it answers (and closes the breaker)
// or the limiter is closed. The first probe goes a cool-down after the
// opening; the interval doubles while probes fail, up to the maximum, and
// every wait is jittered.
func (l *Limiter) probeLoop() {
	f, b := l.fo, l.fo.breaker
	defer f.probeWG.Done()
	interval := l.cfg.breaker.CoolDown
	// The opening set when the first probe goes (jittered), before this
	// goroutine ran: the 503s' Retry-After already says so.
	t := time.NewTimer(b.FirstProbe())
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		err := l.probe()
		if err == nil {
			if f.usesLocal {
				h := l.cfg.breaker.MaxCoolDown + l.cfg.timeout
				f.handoverUntil.Store(l.cfg.clock().Add(h).UnixNano())
			}
			f.probeMu.Lock()
			f.probing = false
			f.probeMu.Unlock()
			b.Close()
			f.resend.poke() // writes that waited for the recovery
			return
		}
		interval = min(2*interval, l.cfg.breaker.MaxCoolDown)
		wait := failover.Jittered(interval)
		b.Probed(err, wait)
		t.Reset(wait)
	}
}

// probe asks the backend for a canary decision and, when it answers,
// charges it with what FailLocal admitted meanwhile. It reports why the
// backend cannot be trusted yet, or nil. On a backend of several servers
// ([backend.Spread]: Redis Cluster) there is one canary on each, decided in
// one call: every server must answer, or a cluster with a master down
// would look healthy whenever the canary's own master answers.
func (l *Limiter) probe() error {
	reqs, err := l.canaries()
	if err != nil {
		return err
	}
	out := make([]backend.Result, len(reqs))
	start := time.Now()
	err = l.bounded(context.Background(), op{reqs: reqs, out: out})
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
	return l.chargeLocal()
}

// canaries are the probe's requests: the canary, or one variant of it on
// each server of a backend of several.
func (l *Limiter) canaries() ([]backend.Request, error) {
	c := l.fo.canary
	if l.fo.spread == nil {
		return []backend.Request{c}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.timeout)
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

// Writes that must reach the backend after their call failed: settlements
// and slot releases that timed out or met an open breaker, and the release
// of a slot whose acquisition's outcome is unknown (its reply was lost).
// One goroutine per limiter resends them while any are pending, as soon as
// the backend answers again (a recovery or any answered call wakes it),
// then every so often, until each is applied or no longer matters: a
// lease ends and a unit stops counting at most a Period after the call
// that failed, so a write pending longer is dropped, counted and logged.
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
//     for twice Period after the first applied it, and this loop gives it
//     up a Period after its call failed (sooner when the Period is under
//     twice the timeout: see resendLater);
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

// maxResends bounds the requests pending a resend, those a round is
// sending included; past it a write is dropped at once (counted and
// logged).
const maxResends = 4096

// resendEvery is the longest wait between two rounds of resends while the
// backend does not answer; a recovery wakes the loop at once.
const resendEvery = time.Second

// resendGap is the shortest wait between two rounds of resends.
const resendGap = 100 * time.Millisecond

// resends is the limiter's pending writes and its resend loop's state.
type resends struct {
	mu      sync.Mutex
	items   []resendItem
	n       int  // requests in items and in the round that runs
	running bool // a resend loop runs
	wake    chan struct{}
	pending atomic.Int64 // requests in items, read on the hot path
	dropped atomic.Int64 // requests dropped for good
	log     sampler
}

// resendItem is the requests of one failed call still to apply, and when
// they stop mattering.
type resendItem struct {
	reqs  []backend.Request
	until time.Time
	what  string
}

// unsent reports whether a failed call surely never reached the backend.
func unsent(err error) bool {
	return errors.Is(err, ErrDegraded) || notSent(err)
}

// resendable returns what of reqs, whose call failed with err, may be sent
// again (see the top of this file): releases and settlements named by a
// Once always, other refunds and forced charges only when the call was
// never sent. The acquisition of a slot becomes its release; renewals and
// peeks are not resent.
func resendable(reqs []backend.Request, err error) []backend.Request {
	var out []backend.Request
	never := unsent(err)
	for _, q := range reqs {
		switch {
		case q.Cost == 0:
			continue
		case q.Algorithm == Concurrency && q.Cost > 0 && !q.Force:
			if never {
				continue // not taken: nothing to give back
			}
			q.Cost = -q.Cost // an acquisition whose outcome is unknown
		case q.Algorithm == Concurrency && q.Cost > 0:
			continue // a renewal: its timer tries again
		case q.Algorithm != Concurrency && !never && q.Once == 0:
			continue // a settlement that may have been applied, and would be again
		}
		q.Shadow = false
		out = append(out, q)
	}
	return out
}

// resendLater queues what of reqs (whose call failed with err) may be sent
// again, and starts the resend loop. It reports how many requests were
// dropped instead.
func (l *Limiter) resendLater(reqs []backend.Request, err error, what string) int {
	if !l.remote {
		return 0
	}
	again := resendable(reqs, err)
	lost := settlements(reqs) - settlements(again)
	l.dropResends(lost, what, "its outcome is unknown, and applying it twice would be wrong")
	reqs = again
	if len(reqs) == 0 {
		return lost
	}
	// One item per deadline. A write is given up a Period after its call
	// failed; a settlement named by a Once sooner when its Period is short:
	// its record lasts twice the Period from when the failed call applied
	// it, up to a timeout before it failed, and a resend may be applied up
	// to a timeout after it is sent, so it is sent at most 2P - 2×timeout
	// after the failure (never, when that is not positive). Kept longer, as
	// long as a longer rule's, it would find its record lapsed and be
	// applied again.
	var items []resendItem
	now := time.Now()
	late := 0
	for i := range reqs {
		q := reqs[i]
		q.Key = l.kept(q.Key) // the caller's arena is reused
		window := q.Period
		if q.Once != 0 {
			window = min(window, 2*q.Period-2*l.cfg.timeout)
		}
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
	l.dropResends(late, what, "its Period is too short, beside the timeout, to send it again safely")
	lost += late
	n := len(reqs) - late
	if n == 0 {
		return lost
	}
	r := &l.fo.resend
	r.mu.Lock()
	if r.n+n > maxResends {
		r.mu.Unlock()
		l.dropResends(n, what, "too many pending")
		return lost + n
	}
	r.items = append(r.items, items...)
	r.n += n
	r.pending.Store(int64(r.n))
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start && !l.startResender() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
		l.dropPending("the limiter is closed")
		return lost + n
	}
	r.poke()
	return lost
}

// settlements counts the refunds and charges of rate rules in reqs.
func settlements(reqs []backend.Request) int {
	n := 0
	for _, q := range reqs {
		if q.Cost != 0 && q.Algorithm != Concurrency {
			n++
		}
	}
	return n
}

// poke wakes the resend loop, if it waits.
func (r *resends) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// startResender starts the resend loop unless the limiter is closed.
func (l *Limiter) startResender() bool {
	f := l.fo
	f.probeMu.Lock()
	defer f.probeMu.Unlock()
	if f.stopped {
		return false
	}
	f.probeWG.Add(1)
	go l.resendLoop()
	return true
}

// resendLoop resends pending writes while there are any: at once when
// woken (a recovery, an answered call, a new write), else every
// resendEvery. It returns when nothing is pending, or on Close, dropping
// what is left.
func (l *Limiter) resendLoop() {
	f, r := l.fo, &l.fo.resend
	defer f.probeWG.Done()
	t := time.NewTimer(resendEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			l.stopResends()
			return
		case <-r.wake:
		case <-t.C:
		}
		if !l.resendRound() {
			return
		}
		// At most one round per resendGap, however often the backend
		// answers: a write that keeps failing costs it little.
		gap := time.NewTimer(resendGap)
		select {
		case <-f.stop:
			gap.Stop()
			l.stopResends()
			return
		case <-gap.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(resendEvery)
	}
}

// resendBatch is how many requests one call of a resend round carries at
// most (an item larger than that goes alone).
const resendBatch = 256

// resendRound sends every pending write the backend may take now, the
// items together in as few calls as resendBatch allows, and keeps what
// failed. It stops early on Close, between calls. It reports whether any
// write is left; when none is, the loop is marked stopped before it
// returns.
func (l *Limiter) resendRound() bool {
	f, r := l.fo, &l.fo.resend
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
			l.dropResends(len(items[lo].reqs), items[lo].what, "pending for longer than its units count")
			lo++
			continue
		}
		stopped := false
		select {
		case <-f.stop:
			stopped = true
		default:
		}
		if b := f.breaker; stopped || b != nil && !b.Closed() {
			keep = append(keep, items[lo:]...) // wait for the recovery, or for Close to drop them
			break
		}
		var reqs []backend.Request
		hi := lo
		for hi < len(items) && !now.After(items[hi].until) && (hi == lo || len(reqs)+len(items[hi].reqs) <= resendBatch) {
			reqs = append(reqs, items[hi].reqs...)
			hi++
		}
		err := l.callOutside(context.Background(), op{reqs: reqs, out: make([]backend.Result, len(reqs))})
		for _, it := range items[lo:hi] {
			if err == nil {
				continue
			}
			again := resendable(it.reqs, err)
			l.dropResends(len(it.reqs)-len(again), it.what, "its outcome is unknown, and applying it twice would be wrong")
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

// stopResends ends the resend loop on Close, dropping what is pending.
func (l *Limiter) stopResends() {
	r := &l.fo.resend
	r.mu.Lock()
	r.running = false
	r.mu.Unlock()
	l.dropPending("the limiter was closed")
}

// dropPending drops every pending write: the limiter is closing.
func (l *Limiter) dropPending(why string) {
	r := &l.fo.resend
	r.mu.Lock()
	items := r.items
	r.items, r.n = nil, 0
	r.pending.Store(0)
	r.mu.Unlock()
	for _, it := range items {
		l.dropResends(len(it.reqs), it.what, why)
	}
}

// dropResends counts and logs n requests of a write given up for good.
func (l *Limiter) dropResends(n int, what, why string) {
	if n == 0 {
		return
	}
	r := &l.fo.resend
	r.dropped.Add(int64(n))
	r.log.log(l.cfg.logger, time.Now(), slog.LevelError,
		"ceiling: a "+what+" was given up after its call failed; a refund or release leaves its units counted until they expire, a charge leaves its units uncounted",
		slog.Int("requests", n), slog.String("why", why), slog.Int64("dropped_total", r.dropped.Load()))
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
func (l *Limiter) inHandOver() bool    { return l.fo.handingOver(l.cfg.clock()) }
func (l *Limiter) handOverLocal() bool { return l.fo.usesLocal && l.inHandOver() }

// loadedLocal is FailLocal's store if a fallback created it, else nil.
func (l *Limiter) loadedLocal() *localStore { return l.fo.local.Load() }

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
	h.DroppedWrites = l.fo.resend.dropped.Load()
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

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

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

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

	// The prober (probe.go).
	canary  backend.Request
	probeMu sync.Mutex
	probing bool          // a probe loop runs
	stopped bool          // Close was called: start no more
	stop    chan struct{} // closed by Close
	probeWG sync.WaitGroup

	unenforcedAtDegrade counter
	shed                counter // requests refused because this process could not send their call

	resend resends   // writes to send again after their call failed (resend.go)
	slots  heldSlots // decisions holding concurrency slots (concurrency.go)
}

// ruleCounts are a rule's totals, reported by the health handler.
type ruleCounts struct {
	failOpen  counter
	failLocal counter
	shadow    counter
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

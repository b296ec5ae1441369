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
	"github.com/ceiling-go/ceiling/backend/memory"
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
	// each limited to its share of the limit ([WithLocalShare]): the limit
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
type failover struct {
	breaker *breaker // nil for in-process backends
	// local is FailLocal's store, created on the first fallback that
	// needs it, so that a healthy limiter runs no second store.
	local     atomic.Pointer[localStore]
	usesLocal bool // some rule may fail local and the backend is remote
	localMu   sync.Mutex
	scratch   sync.Pool // *localScratch
	errLog    sampler   // isolated backend errors while healthy
	shadow    []sampler // per rule: "would have rejected" log lines
	limitLog  []sampler // per rule: requests refused for want of a limit (limits.go)
	counts    []ruleCounts
	warning   string // configuration weaker than it reads (health warning)
	closers   []io.Closer
	once      sync.Once

	emptyKeyLogged []atomic.Bool // per rule: an empty key value was logged

	unenforcedAtDegrade counter
}

// ruleCounts are a rule's totals, reported by the health handler.
type ruleCounts struct {
	failOpen  counter
	failLocal counter
	shadow    counter
}

type localScratch struct {
	reqs []backend.Request
	out  []backend.Result
	idx  []int
}

// initFailover prepares the breaker, the local store and the start-up
// warnings; New calls it once the options are applied.
func (l *Limiter) initFailover() error {
	f := &failover{
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
	if l.cfg.localShare == 0 {
		l.cfg.localShare = 1 / float64(l.cfg.instances)
	}
	f.errLog.every = time.Minute
	for i := range f.shadow {
		f.shadow[i].every = l.cfg.shadowLogEvery
		f.limitLog[i].every = limitLogEvery
	}
	if l.remote {
		f.breaker = newBreaker(l.cfg.breaker, now, l.emitDegraded)
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
		n := len(l.rules)
		f.scratch.New = func() any {
			return &localScratch{reqs: make([]backend.Request, 0, n), out: make([]backend.Result, n), idx: make([]int, 0, n)}
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

// localMaxKeys bounds FailLocal's store: it holds only an outage's keys.
const localMaxKeys = 1 << 18

type localStore struct {
	b    backend.Backend
	into backend.DecideInto
}

// localStore returns FailLocal's store, creating it on first use.
func (l *Limiter) localStore() *localStore {
	f := l.fo
	if ls := f.local.Load(); ls != nil {
		return ls
	}
	f.localMu.Lock()
	defer f.localMu.Unlock()
	if ls := f.local.Load(); ls != nil {
		return ls
	}
	b := l.cfg.localStore
	if b == nil {
		// No janitor: nothing to stop, and the key bound (which sweeps
		// under pressure) keeps an outage's keys in check.
		m := memory.New(memory.WithSweepInterval(0), memory.WithMaxKeys(localMaxKeys))
		f.closers = append(f.closers, m)
		b = m
	}
	ls := &localStore{b: b}
	ls.into, _ = b.(backend.DecideInto)
	f.local.Store(ls)
	return ls
}

// Close releases what the limiter started: the default memory store (its
// janitor goroutine) and FailLocal's store. It does not close a backend
// passed with [WithBackend]: its owner does. Close is idempotent; the limiter must not be used after it.
func (l *Limiter) Close() error {
	var err error
	l.fo.once.Do(func() {
		l.fo.localMu.Lock()
		defer l.fo.localMu.Unlock()
		for _, c := range l.fo.closers {
			err = errors.Join(err, c.Close())
		}
	})
	return err
}

// errResultCount is returned when a backend breaks the contract by
// answering the wrong number of results.
var errResultCount = errors.New("ceiling: backend answered the wrong number of results")

// call asks the backend. For a backend that does I/O it goes through the
// circuit breaker (failing at once while it is open) and is bounded by the
// timeout even when the backend ignores its context.
func (l *Limiter) call(ctx context.Context, st *state) ([]backend.Result, error) {
	out := st.results[:len(st.reqs)]
	obs := l.cfg.observer
	b := l.fo.breaker
	if b == nil {
		var start time.Time
		if obs != nil {
			start = time.Now()
		}
		err := l.decideInto(ctx, st.reqs, out)
		if obs != nil {
			obs.ObserveBackend(time.Since(start), err)
		}
		return out, err
	}
	probe, ok := b.allow()
	if !ok {
		return nil, errBreakerOpen
	}
	start := time.Now()
	err := l.timed(ctx, st.reqs, out)
	if obs != nil {
		obs.ObserveBackend(time.Since(start), err)
	}
	if err == nil {
		b.success(probe)
		return out, nil
	}
	if ctx.Err() != nil && !errors.Is(err, ErrTimeout) {
		// The client went away: no evidence about the backend either way.
		b.neutral(probe)
		return nil, err
	}
	if b.failure(probe, err) {
		l.fo.errLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, "ceiling: backend call failed; fail modes applied to this request", slog.Any("err", err))
	}
	return nil, err
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

// ErrTimeout is wrapped by the error of a backend decision that took
// longer than the limiter's timeout ([WithTimeout]).
var ErrTimeout = errors.New("ceiling: backend timed out")

// errBreakerOpen is the cause of a fallback decided without calling the
// backend because the circuit breaker is open.
var errBreakerOpen = errors.New("ceiling: circuit breaker open; backend not called")

// timedCall is one backend decision running on its own goroutine, so that a
// backend that ignores its context cannot hold the request past the
// timeout. An abandoned call is never reused.
type timedCall struct {
	reqs []backend.Request
	out  []backend.Result
	err  error
	done chan struct{}
}

var timedCalls = sync.Pool{New: func() any { return &timedCall{done: make(chan struct{}, 1)} }}

// timed runs the decision bounded by the limiter's timeout. The caller's
// cancellation does not reach the backend: a client that goes away is not a
// backend failure, and its decision counts like any other.
func (l *Limiter) timed(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.timeout)
	defer cancel()
	c := timedCalls.Get().(*timedCall)
	c.reqs = append(c.reqs[:0], reqs...)
	if cap(c.out) < len(out) {
		c.out = make([]backend.Result, len(out))
	}
	c.out = c.out[:len(out)]
	go l.run(ctx, c)
	select {
	case <-c.done:
		err := c.err
		copy(out, c.out)
		timedCalls.Put(c)
		if err != nil && ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("%w after %v: %w", ErrTimeout, l.cfg.timeout, err)
		}
		return err
	case <-ctx.Done():
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("%w after %v", ErrTimeout, l.cfg.timeout)
		}
		return ctx.Err()
	}
}

func (l *Limiter) run(ctx context.Context, c *timedCall) {
	c.err = l.decideInto(ctx, c.reqs, c.out)
	c.done <- struct{}{}
}

// decideBounded is a backend decision outside a request's own decision (a
// settlement after the handler): bounded by the timeout like every call,
// even when the backend ignores its context, and skipped while the circuit
// breaker is open, when it could only wait and fail.
func (l *Limiter) decideBounded(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	if !l.remote {
		return out, l.decideInto(ctx, reqs, out)
	}
	if b := l.fo.breaker; b.state.Load() != breakerClosed {
		return nil, errBreakerOpen
	}
	return out, l.timed(ctx, reqs, out)
}

// UnavailableError is the error behind a 503 (and [Limiter.Decide]'s
// refusal): the backend could not decide and a rule of the request fails
// closed.
type UnavailableError struct {
	// Rule is the first enforced rule, in declaration order, that fails
	// closed.
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
		retry = max(retry, b.retryIn())
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
// closed.
func (l *Limiter) fallback(ctx context.Context, st *state, cause error) ([]backend.Result, error) {
	d := &st.decision
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
		lo := sc.out[:len(sc.reqs)]
		var err error
		if ls := l.localStore(); ls.into != nil {
			err = ls.into.DecideInto(ctx, sc.reqs, lo)
		} else {
			var res []backend.Result
			if res, err = ls.b.Decide(ctx, sc.reqs); err == nil && len(res) != len(lo) {
				err = errResultCount
			}
			copy(lo, res)
		}
		if err != nil {
			return nil, l.unavailable(d.Results[sc.idx[0]].Rule.Name, fmt.Errorf("%w; local store: %w", cause, err))
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
		}
	}
	return out, nil
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

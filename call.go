package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Every call the limiter makes to a backend that does I/O goes through here:
// decisions, settlements, charges, peeks, resets, probes and the start-up
// check. Each is bounded by the limiter's own timeout whatever the caller's
// context does, skipped while the circuit breaker is open (except the
// probes and the check, whose job is to call), and judged: only the
// backend's own answers and failures move the breaker.

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

// verdict is what a failed call says about the backend.
type verdict uint8

const (
	// against: the backend failed or was too slow.
	against verdict = iota
	// overloaded: this process was too slow to hear the answer in time (a
	// starved CPU), which says nothing about the backend.
	overloaded
)

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
	if !b.closed() {
		return errBreakerOpen
	}
	start := time.Now()
	v, err := l.bounded(ctx, op{reqs: reqs, out: out})
	if obs != nil {
		observeCall(obs, time.Since(start), out, err)
	}
	l.judge(reqs, out, v, err)
	return err
}

// judge moves the breaker by a call's outcome: an answer of the backend's
// own resets the failure count, a cached answer or a starved process's
// timeout says nothing, and a failure counts towards opening.
func (l *Limiter) judge(reqs []backend.Request, out []backend.Result, v verdict, err error) {
	b := l.fo.breaker
	switch {
	case err != nil && errors.Is(err, backend.ErrInvalidRequest):
		// What the caller sent, not the backend's health.
		return
	case err == nil:
		if len(out) > 0 && out[0].Cached {
			return // the deny cache answered: no evidence either way
		}
		b.success()
		if l.fo.resend.pending.Load() > 0 {
			l.fo.resend.poke() // the backend answers: send what waits
		}
		l.fo.lag.tick(time.Now())
		if l.fo.usesLocal && len(reqs) > 0 {
			l.fo.seen.learn(reqs, out, l.cfg.clock())
		}
	case v == overloaded || FailureKind(err) == kindTimeout && l.fo.lag.starved(l.cfg.timeout):
		l.fo.overloadLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn,
			"ceiling: this process was too busy to read the backend's answer in time; fail modes applied, and the backend is asked again before it is blamed",
			slog.Any("err", err))
		if b.suspect() {
			l.confirm(err)
		}
	default:
		if b.failure(err) {
			l.fo.errLog.log(l.cfg.logger, l.cfg.clock(), slog.LevelWarn, "ceiling: backend call failed; fail modes applied to this request",
				slog.String("kind", FailureKind(err)), slog.Any("err", err))
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

// timeoutOf is how long o may take.
func (l *Limiter) timeoutOf(o op) time.Duration {
	if o.timeout > 0 {
		return o.timeout
	}
	return l.cfg.timeout
}

func (l *Limiter) do(ctx context.Context, o op) error {
	if o.reset {
		return l.backend.Reset(ctx, o.keys...)
	}
	return l.decideInto(ctx, o.reqs, o.out)
}

// bounded runs o under the limiter's own deadline: the caller's
// cancellation does not reach the backend (a client that goes away is not
// a backend failure, and its decision counts like any other), and the
// call returns within about the timeout whatever the backend does.
//
// A [backend.DeadlineBound] backend is called inline: it returns by the
// deadline itself, or, told the timeout as a budget ([backend.WithBudget]),
// measures its wait from when the command was written, so a busy CPU (this
// goroutine waiting to run before it could send) does not make it time
// out. Any other backend runs on a guard goroutine that the caller stops
// waiting for; see guard.
func (l *Limiter) bounded(ctx context.Context, o op) (verdict, error) {
	base := context.WithoutCancel(ctx)
	if !l.inline {
		return l.guard(base, o)
	}
	timeout := l.timeoutOf(o)
	start := time.Now()
	ctx, cancel := context.WithTimeout(backend.WithBudget(base, timeout), timeout)
	err := l.do(ctx, o)
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return against, err
	}
	if !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
	}
	// The backend returns by its deadline, counted from when it wrote the
	// command: a call that came back much later than that spent the time
	// waiting for this process, not for the backend.
	if time.Since(start) > timeout+timeout/2 {
		return overloaded, err
	}
	return against, err
}

// guardedCall is one backend operation running on a guard goroutine, so
// that a backend that ignores its context cannot hold the caller past the
// timeout. An abandoned call is never reused.
type guardedCall struct {
	o       op
	err     error
	timeout time.Duration
	base    context.Context
	started atomic.Int64  // Unix ns when the backend call began; 0 before
	state   atomic.Uint32 // callRunning, callDone or callAbandoned
	done    chan struct{}
}

const (
	callRunning uint32 = iota
	callDone
	callAbandoned
)

var guardedCalls = sync.Pool{New: func() any { return &guardedCall{done: make(chan struct{}, 1)} }}

// maxExtensions bounds how many times the guard waits longer for a process
// too busy to run the backend call: the caller waits at most
// timeout × (1.5 + maxExtensions/2).
const maxExtensions = 3

// guard runs o on its own goroutine under a deadline of the timeout,
// counted from when the goroutine actually starts calling, and waits for it
// half the timeout longer: a reply that arrives after the deadline but
// before the guard gives up is used (the backend decided, and the decision
// counts). Before giving up the guard yields its CPU once, so that a backend
// goroutine that is merely waiting to run gets to; when the process is
// visibly starved (the guard's own wake-ups are late, or the call has not
// even started) it waits up to maxExtensions more half-timeouts. A call
// that never started is this process's fault, not the backend's (verdict
// overloaded); one that started and is still unanswered counts against the
// backend. An error the abandoned call returns later is handed to the
// breaker, so that the reason names the root cause rather than the timeout.
func (l *Limiter) guard(base context.Context, o op) (verdict, error) {
	c := guardedCalls.Get().(*guardedCall)
	c.o.reset, c.o.keys = o.reset, o.keys
	c.o.reqs = append(c.o.reqs[:0], o.reqs...)
	if cap(c.o.out) < len(o.out) {
		c.o.out = make([]backend.Result, len(o.out))
	}
	c.o.out = c.o.out[:len(o.out)]
	c.base, c.err, c.timeout = base, nil, l.timeoutOf(o)
	c.started.Store(0)
	c.state.Store(callRunning)
	go l.runGuarded(c)

	timeout := l.timeoutOf(o)
	grace := timeout / 2
	due := time.Now().Add(timeout + grace)
	t := time.NewTimer(timeout + grace)
	defer t.Stop()
	for ext := 0; ; ext++ {
		select {
		case <-c.done:
			return l.finishGuarded(c, o)
		case <-t.C:
		}
		woke := time.Now()
		runtime.Gosched() // let a backend goroutine that only waits for a CPU run
		after := time.Now()
		if c.state.Load() == callDone {
			<-c.done
			return l.finishGuarded(c, o)
		}
		started := c.started.Load()
		starved := started == 0 || woke.Sub(due) > grace/2 || after.Sub(woke) > grace/2
		if starved && ext < maxExtensions {
			// Wait until the call has had its full budget from its start,
			// and at least another half-timeout.
			next := grace
			if started != 0 {
				next = max(grace, time.Duration(started+int64(timeout+grace)-after.UnixNano()))
			}
			due = after.Add(next)
			t.Reset(next)
			continue
		}
		if !c.state.CompareAndSwap(callRunning, callAbandoned) {
			<-c.done // it finished just now
			return l.finishGuarded(c, o)
		}
		if c.started.Load() == 0 {
			return overloaded, fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, errNeverSent)
		}
		return against, fmt.Errorf("%w after %v", ErrTimeout, timeout)
	}
}

// runGuarded is the guard goroutine.
func (l *Limiter) runGuarded(c *guardedCall) {
	ctx, cancel := context.WithTimeout(c.base, c.timeout)
	c.started.Store(time.Now().UnixNano())
	if c.state.Load() == callAbandoned {
		// The guard gave up before this started, and told its caller that
		// the call was never sent (errNeverSent): keep it true.
		cancel()
		return
	}
	err := l.do(ctx, c.o)
	cancel()
	c.err = err
	if c.state.CompareAndSwap(callRunning, callDone) {
		c.done <- struct{}{}
		return
	}
	// Abandoned: nobody reads the results, but the error may name what
	// the timeout hid.
	if err != nil && l.fo.breaker != nil {
		l.fo.breaker.lateCause(err)
	}
}

// finishGuarded copies a finished call's answer to the caller and recycles
// the call.
func (l *Limiter) finishGuarded(c *guardedCall, o op) (verdict, error) {
	err, timeout := c.err, c.timeout
	copy(o.out, c.o.out)
	c.o.keys, c.base = nil, nil
	guardedCalls.Put(c)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
	}
	return against, err
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
	if !b.closed() {
		return errBreakerOpen
	}
	start := time.Now()
	v, err := l.bounded(ctx, o)
	if obs := l.cfg.observer; obs != nil && !o.reset {
		observeCall(obs, time.Since(start), o.out, err)
	}
	l.judge(o.reqs, o.out, v, err)
	return err
}

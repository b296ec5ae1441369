package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

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

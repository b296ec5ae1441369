package failover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Every call the limiter makes to a backend goes through a Caller:
// decisions, settlements, charges, peeks, resets, probes and the start-up
// check. Each is bounded by the limiter's own timeout whatever the
// caller's context does, skipped while the circuit breaker is open (except
// the probes and the check, whose job is to call), and judged by one rule:
// only the backend's own answers and failures move the breaker. A call the
// backend never wrote ([backend.ErrNotSent]: this process was too busy, or
// every connection was taken), or whose reply this process was too busy to
// read ([backend.ErrUnread]), says nothing about the backend: it is this
// process that is overloaded.

// The errors of a call the engine made or refused to make; ceiling exports
// the first two as its own.
var (
	ErrTimeout     = errors.New("ceiling: backend timed out")
	ErrDegraded    = errors.New("ceiling: backend degraded; not called until a probe answers")
	ErrBreakerOpen = fmt.Errorf("%w (circuit breaker open)", ErrDegraded)
	ErrResultCount = errors.New("ceiling: backend answered the wrong number of results")
)

// Overloaded reports a call that failed by this process's fault, not the
// backend's: it was never written ([backend.ErrNotSent]), or its reply
// came too late to be read by a process too busy to run the goroutine
// that reads it ([backend.ErrUnread]; the call may have been applied).
func Overloaded(err error) bool {
	return err != nil && (errors.Is(err, backend.ErrNotSent) || errors.Is(err, backend.ErrUnread))
}

// Op is one backend operation: a decision of Reqs into Out, or, with Reset
// set, a Reset of Keys.
type Op struct {
	Reqs    []backend.Request
	Out     []backend.Result
	Keys    []string
	Reset   bool
	Timeout time.Duration // zero: the Caller's
}

// Caller makes the limiter's backend calls. Set its fields before the
// first call; it is safe for simultaneous use after that.
type Caller struct {
	Backend backend.Backend
	Into    backend.DecideInto // Backend's allocation-free path, if it has one
	Timeout time.Duration
	Breaker *Breaker // nil for an in-process backend: no bound, no breaker
	// Observe, if set, is told of each decision call: its latency, its
	// results and its error.
	Observe func(time.Duration, []backend.Result, error)
	// Answered is told of each answer of the backend's own (not a cached
	// one); Overloaded of each call this process was too busy to make;
	// Failed of each other failure that did not open the breaker.
	Answered   func(reqs []backend.Request, out []backend.Result)
	Overloaded func(err error)
	Failed     func(err error)
}

// Decide decides reqs into out with one backend call: through the
// breaker (failing at once while it is open), bounded by the timeout, and
// observed, for a backend that does I/O; observed only, for one in
// process.
func (c *Caller) Decide(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if c.Breaker == nil {
		var start time.Time
		if c.Observe != nil {
			start = time.Now()
		}
		err := c.decideInto(ctx, reqs, out)
		if c.Observe != nil {
			c.Observe(time.Since(start), out, err)
		}
		return err
	}
	return c.Outside(ctx, Op{Reqs: reqs, Out: out})
}

// Outside is a backend call outside a request's decision (a settlement, a
// charge, a peek, a reset), or a decision's own: bounded like every call,
// skipped while the breaker is open (it could only wait and fail),
// observed unless it is a reset, and judged. On an in-process backend it
// is the bare call.
func (c *Caller) Outside(ctx context.Context, o Op) error {
	b := c.Breaker
	if b == nil {
		return c.Do(ctx, o)
	}
	if !b.Closed() {
		return ErrBreakerOpen
	}
	start := time.Now()
	err := c.Bounded(ctx, o)
	if c.Observe != nil && !o.Reset {
		c.Observe(time.Since(start), o.Out, err)
	}
	c.judge(o.Reqs, o.Out, err)
	return err
}

// judge moves the breaker by a call's outcome: an answer of the backend's
// own resets the failure count, a cached answer or a call this process
// was too busy to make says nothing, and any other failure counts towards
// opening (a timeout once a probe confirms it: Breaker.Failure).
func (c *Caller) judge(reqs []backend.Request, out []backend.Result, err error) {
	b := c.Breaker
	switch {
	case err != nil && errors.Is(err, backend.ErrInvalidRequest):
		// What the caller sent, not the backend's health.
	case err == nil:
		if len(out) > 0 && out[0].Cached {
			return // the deny cache answered: no evidence either way
		}
		b.Success()
		c.Answered(reqs, out)
	case Overloaded(err):
		c.Overloaded(err)
	default:
		if b.Failure(err) {
			c.Failed(err)
		}
	}
}

// decideInto calls the backend, preferring the allocation-free path, and
// checks the answer's shape.
func (c *Caller) decideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if c.Into != nil {
		return c.Into.DecideInto(ctx, reqs, out)
	}
	res, err := c.Backend.Decide(ctx, reqs)
	if err != nil {
		return err
	}
	if len(res) != len(reqs) {
		return fmt.Errorf("%w: %d for %d requests", ErrResultCount, len(res), len(reqs))
	}
	copy(out, res)
	return nil
}

// Do is the bare call, neither bounded nor judged.
func (c *Caller) Do(ctx context.Context, o Op) error {
	if o.Reset {
		return c.Backend.Reset(ctx, o.Keys...)
	}
	return c.decideInto(ctx, o.Reqs, o.Out)
}

// Bounded runs o on the caller's goroutine under the limiter's own
// deadline, neither through the breaker nor judged (the probes and the
// check): the caller's cancellation does not reach the backend (a client
// that goes away is not a backend failure, and its decision counts like
// any other). The backend returns by the deadline (the [backend.Backend]
// contract), or, once it wrote the call, when the reply comes or the
// timeout has passed since the write; a call it never wrote fails with
// [backend.ErrNotSent]. A call that comes back failed after the deadline
// is a timeout, whatever error the backend gave.
func (c *Caller) Bounded(ctx context.Context, o Op) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = c.Timeout
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	err := c.Do(ctx, o)
	cancel()
	if err == nil || errors.Is(err, ErrTimeout) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || time.Since(start) >= timeout {
		return fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
	}
	return err
}

package ceiling

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Wait decides inputs as [Limiter.Decide] does and, while they are
// rejected, sleeps until RetryAfter plus a jitter and decides again: for
// queue workers, crawlers and batch jobs. A wait consumes nothing, and a
// [Limiter.SetLimit] wakes every sleeper. It returns ctx's error once ctx is
// done, an error wrapping [context.DeadlineExceeded] when the next retry
// would pass ctx's deadline (each with the last rejected Decision, if any),
// an error when the inputs can never be admitted, and any error of Decide
// at once (never a loop of backend calls).
func (l *Limiter) Wait(ctx context.Context, inputs ...Input) (Decision, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		// Read before deciding, so that a SetLimit during the decision
		// still wakes the sleep below.
		var changed chan struct{}
		if len(l.plans) > 0 {
			changed = l.plans[0].Load().changed
		}
		d, err := l.Decide(ctx, inputs...)
		if err != nil || d.Allowed {
			return d, err
		}
		wait := d.RetryAfter
		if wait == backend.Never {
			return d, errNeverAdmitted
		}
		wait = max(wait, minWait)
		if dl, ok := ctx.Deadline(); ok {
			// A retry at the deadline itself would find ctx done.
			left := time.Until(dl)
			if wait >= left {
				return d, fmt.Errorf("ceiling: the rejected request would be retried in %v, at or past the context's deadline in %v: %w", wait, left, context.DeadlineExceeded)
			}
			wait += jitter(wait, (left-wait)/2)
		} else {
			wait += jitter(wait, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return d, ctx.Err()
		case <-t.C:
		case <-changed:
			// The limits changed: the wait may be shorter now. Every
			// waiter wakes at once, so each retries within a random
			// spread rather than all in the same instant.
			room := wait
			if dl, ok := ctx.Deadline(); ok {
				room = min(room, time.Until(dl)/2) // never sleep to the deadline
			}
			t.Reset(jitter(4*min(wait, maxWakeSpread), room))
			select {
			case <-ctx.Done():
				t.Stop()
				return d, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// maxWakeSpread bounds how long after a SetLimit a waiter retries.
const maxWakeSpread = 100 * time.Millisecond

// minWait keeps a rejection that names no wait from becoming a busy loop
// of backend calls.
const minWait = time.Millisecond

// jitter is a random extra wait of up to a quarter of wait, and at most
// room.
func jitter(wait, room time.Duration) time.Duration {
	j := min(wait/4, room)
	if j <= 0 {
		return 0
	}
	return rand.N(j + 1)
}

// errNeverAdmitted is Wait's error for inputs no wait can admit.
var errNeverAdmitted = errors.New("ceiling: the request can never be admitted (a cost past its limit); not waiting")

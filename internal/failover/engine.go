package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Mode is a rule's fail mode, numbered as ceiling's FailMode.
type Mode uint8

// The fail modes; Inherit is a rule's that takes the Engine's Default.
const (
	Inherit Mode = iota
	Open
	Closed
	LocalMode
)

// String names the mode for logs and metrics.
func (m Mode) String() string {
	switch m {
	case Open:
		return "open"
	case Closed:
		return "closed"
	case LocalMode:
		return "local"
	}
	return "inherit"
}

// Rules is what the engine asks of a request being decided: request i's
// rule's own fail mode, and, once a fail mode decided it, which.
type Rules interface {
	Mode(i int) Mode
	Fell(i int, m Mode)
}

// Refused is the engine's refusal of a request: request Index's rule fails
// closed, or the request is shed whatever its fail modes (Shed: this
// process could not get the backend's verdict in time, and no probe has
// yet found the backend at fault).
type Refused struct {
	Index      int
	Err        error
	RetryAfter time.Duration
	Shed       bool
}

func (r *Refused) Error() string { return fmt.Sprintf("request %d refused: %v", r.Index, r.Err) }

// Counts are one rule's admissions by a fail mode.
type Counts struct {
	FailOpen, FailLocal atomic.Int64
}

// Engine decides a limiter's requests: on the backend through Caller, and
// when it cannot, by their rules' fail modes; it reports the breaker's
// transitions. Set the exported fields (and Counts, one per rule) before
// the first decision; it is safe for simultaneous use after that.
type Engine struct {
	Caller  Caller
	Breaker *Breaker // nil for an in-process backend
	Local   Local
	Resends Resends
	// Cached answers from the backend's cache in process (the Redis deny
	// cache) when the backend cannot decide; nil if it keeps none.
	// OnCached is told of each such answer.
	Cached    backend.CachedDecider
	OnCached  func()
	Default   Mode // the mode of a rule that inherits
	UsesLocal bool // some rule may fail local and the backend is remote
	// Concurrent: some rule holds concurrency slots, whose release a
	// failed call queues (releaseUnknown).
	Concurrent bool
	Now        func() time.Time
	IsTimeout  func(error) bool
	Logger     *slog.Logger
	// Degraded is told of each transition of the breaker, Unenforced
	// filled in, after it was logged.
	Degraded func(Transition)
	Counts   []Counts
	// Spread spreads the probe's canary over every server of a backend
	// made of several (Redis Cluster); nil for one server. Retake, once
	// a probe answered and the journal is charged, takes the concurrency
	// slots the local store holds again on the backend.
	Spread backend.Spread
	Retake func(context.Context) error

	group    *Group
	canary   backend.Request
	probing  atomic.Bool // the probe loop runs
	charging atomic.Bool // chargeSoon runs

	shed      atomic.Int64 // requests refused because this process could not send their call
	atDegrade atomic.Int64 // unenforced admissions when the breaker last opened
	scratch   sync.Pool    // *scratch
}

type scratch struct {
	reqs []backend.Request
	out  []backend.Result
	idx  []int           // the decision's index of each local request
	wait []time.Duration // > 0: refused by its seed for that long
}

// Shed is how many requests were shed so far.
func (e *Engine) Shed() int64 { return e.shed.Load() }

func (e *Engine) mode(r Rules, i int) Mode {
	if m := r.Mode(i); m != Inherit {
		return m
	}
	return e.Default
}

// locals is a scratch holding the requests of reqs whose rules fail
// local, scaled to the share, and their indexes.
func (e *Engine) locals(reqs []backend.Request, r Rules) *scratch {
	sc, _ := e.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	if len(sc.out) < len(reqs) { // pooled: sized by an earlier request
		sc.out = make([]backend.Result, len(reqs))
	}
	sc.reqs, sc.idx = sc.reqs[:0], sc.idx[:0]
	for i := range reqs {
		if e.mode(r, i) == LocalMode {
			sc.reqs = append(sc.reqs, Scaled(reqs[i], e.Local.Share))
			sc.idx = append(sc.idx, i)
		}
	}
	return sc
}

// Decide decides reqs into out: on the backend (during the hand-over after
// a recovery, on the local store too), and when the backend cannot, by the
// rules' fail modes, marking each result a fail mode decided (Rules.Fell).
// It returns the backend's own refusal of what it was sent
// ([backend.ErrInvalidRequest]: no fail mode applies), or a *Refused.
func (e *Engine) Decide(ctx context.Context, reqs []backend.Request, out []backend.Result, r Rules) error {
	decided, err := false, error(nil)
	if e.UsesLocal && e.Local.HandingOver(e.Now()) {
		decided, err = e.handover(ctx, reqs, out, r)
	}
	if !decided {
		err = e.Caller.Decide(ctx, reqs, out)
	}
	if err == nil || errors.Is(err, backend.ErrInvalidRequest) {
		return err
	}
	if e.Concurrent {
		e.releaseUnknown(reqs, err)
	}
	return e.fallback(ctx, reqs, out, r, err)
}

// fallback decides the request by its rules' fail modes after the backend
// failed with cause. A request that the backend's cache in process rejects
// (a key the Redis deny cache holds as spent) is rejected from it instead,
// by no fail mode: a 429 until the key's RetryAfter, during an outage as
// before it.
func (e *Engine) fallback(ctx context.Context, reqs []backend.Request, out []backend.Result, r Rules, cause error) error {
	if e.Cached != nil && e.Cached.DecideCached(reqs, out) {
		// No evidence either way about the backend.
		if e.OnCached != nil {
			e.OnCached()
		}
		return nil
	}
	if Overloaded(cause) {
		if err := e.shedding(reqs, cause); err != nil {
			return err
		}
	}
	local, open := false, false
	for i := range reqs {
		switch m := e.mode(r, i); {
		case m == Closed && !reqs[i].Shadow:
			return e.unavailable(i, cause)
		case m == LocalMode:
			local = true
		case m == Open && !reqs[i].Shadow:
			open = true
		}
	}
	if open && e.unconfirmed(cause) {
		return e.shedding(reqs, fmt.Errorf("%w: %w", ErrUnconfirmed, cause))
	}
	if local && !e.UsesLocal {
		return e.unavailable(0, cause) // an in-process backend failed: nothing more local
	}
	for i := range reqs {
		m := e.mode(r, i)
		if m != LocalMode {
			// Open, or a shadow rule failing closed: admitted, unenforced.
			m, out[i] = Open, backend.Result{Allowed: true, Limit: reqs[i].Limit}
		}
		r.Fell(i, m)
	}
	if local {
		sc := e.locals(reqs, r)
		defer e.scratch.Put(sc)
		lo := sc.out[:len(sc.reqs)]
		sc.wait = append(sc.wait[:0], make([]time.Duration, len(sc.reqs))...)
		if err := e.Local.Decide(ctx, e.Now(), sc.reqs, sc.wait, lo, reqs, sc.idx); err != nil {
			return e.unavailable(sc.idx[0], fmt.Errorf("%w; local store: %w", cause, err))
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
		}
	}
	return nil
}

// unavailable is the refusal of a request whose rule i fails closed: try
// again when the backend will next be asked, at least a second.
func (e *Engine) unavailable(i int, cause error) *Refused {
	retry := time.Second
	if b := e.Breaker; b != nil {
		retry = max(retry, b.RetryIn())
	}
	return &Refused{Index: i, Err: cause, RetryAfter: retry}
}

// shedding refuses a request that this process was too busy to ask the
// backend about in time (its call never sent, or its reply unread), or
// whose timeout no probe confirmed: no fail mode applies, since a flood
// that saturates the instance would otherwise buy a weaker limit
// (docs/failure.md, "Why shed rather than wait"). A request of shadow
// rules only is not refused (nil): shadow rules never refuse.
func (e *Engine) shedding(reqs []backend.Request, cause error) error {
	for i := range reqs {
		if !reqs[i].Shadow {
			e.shed.Add(1)
			return &Refused{Index: i, Err: cause, RetryAfter: time.Second, Shed: true}
		}
	}
	return nil
}

// ErrUnconfirmed is the cause of a request shed because its call timed
// out before a probe confirmed that the backend is at fault. It wraps
// [backend.ErrUnread], as the request is shed like one whose reply this
// process was too busy to read, so that observers and ceiling's KindOf
// count it shed, as Health does, not failed closed.
var ErrUnconfirmed = fmt.Errorf("%w (a timeout no probe has confirmed yet)", backend.ErrUnread)

// unconfirmed reports a timeout while the breaker is closed and no probe
// has confirmed yet that the backend is at fault: FailOpen does not apply
// then (the request is shed), while FailLocal, already bounded, decides
// locally. Once a probe confirms the timeouts every fail mode applies,
// whether or not the breaker opens (on Redis Cluster one frozen master's
// timeouts come between the other masters' answers).
func (e *Engine) unconfirmed(cause error) bool {
	b := e.Breaker
	return b != nil && b.Closed() && e.IsTimeout(cause) && b.Unconfirmed()
}

// handover decides the FailLocal rules of reqs on the local store first,
// at the instance's share, then the whole request on the backend, while
// the hand-over after a recovery lasts (Local.HandOverDecide). It reports
// whether it decided; an error is the backend's, for the fail modes. When
// no rule fails local it does nothing.
func (e *Engine) handover(ctx context.Context, reqs []backend.Request, out []backend.Result, r Rules) (bool, error) {
	sc := e.locals(reqs, r)
	defer e.scratch.Put(sc)
	if len(sc.reqs) == 0 {
		return false, nil
	}
	lo := sc.out[:len(sc.reqs)]
	ok, refused, err := e.Local.HandOverDecide(ctx, sc.reqs, lo, func() (bool, error) {
		err := e.Caller.Decide(ctx, reqs, out)
		admitted := err == nil
		for i := range out {
			admitted = admitted && (out[i].Allowed || reqs[i].Shadow)
		}
		return admitted, err
	})
	if !ok {
		return false, nil // the backend alone, then
	}
	if refused {
		for i := range out {
			out[i] = backend.Result{Allowed: true, Limit: reqs[i].Limit, Unread: true}
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
			r.Fell(i, LocalMode)
		}
		return true, nil
	}
	return true, err
}

// NewLease draws a lease id: 52 random bits, so that the leases of every
// instance sharing a key never collide in practice.
func NewLease() int64 { return rand.Int64N(backend.MaxLease) + 1 }

// releaseUnknown queues the release of every slot reqs' failed call may
// have taken (its reply lost, or late past the timeout): the instance that
// asked gives it back, by its lease, as soon as the backend answers again,
// rather than leaving it held for the whole lease. A slot the fail mode
// then takes (FailLocal) gets a fresh lease, which that release cannot
// touch.
func (e *Engine) releaseUnknown(reqs []backend.Request, err error) {
	if Unsent(err) {
		return
	}
	var taken []backend.Request
	for i := range reqs {
		if q := &reqs[i]; q.Algorithm == backend.Concurrency && q.Cost > 0 {
			taken = append(taken, *q)
			q.Lease = NewLease()
		}
	}
	if len(taken) > 0 && e.Breaker != nil {
		e.Resends.Later(taken, err, "concurrency release after a lost reply")
	}
}

// Unsent reports whether a failed call surely never reached the backend,
// so that a settlement may be resent (Resendable).
func Unsent(err error) bool {
	return errors.Is(err, ErrDegraded) || errors.Is(err, backend.ErrNotSent)
}

// Count counts an admission that rule i's fail mode m made.
func (e *Engine) Count(i int, m Mode) {
	if m == Open {
		e.Counts[i].FailOpen.Add(1)
	} else {
		e.Counts[i].FailLocal.Add(1)
	}
}

// Unenforced is the number of rule admissions made by fail modes so far.
func (e *Engine) Unenforced() int64 {
	var n int64
	for i := range e.Counts {
		n += e.Counts[i].FailOpen.Load() + e.Counts[i].FailLocal.Load()
	}
	return n
}

// Transition logs a transition of the breaker (loud, and once), fills in
// how many admissions the fail modes made while it lasted, and tells
// Degraded. The Breaker calls it.
func (e *Engine) Transition(t Transition) {
	unenforced := e.Unenforced()
	ctx := context.Background()
	if t.Degraded {
		e.atDegrade.Store(unenforced)
		e.Logger.LogAttrs(ctx, slog.LevelError, "ceiling: backend degraded; rules fall back to their fail modes until it answers again",
			slog.Any("cause", t.Cause), slog.Int("consecutive_failures", t.Failures), slog.String("fail_mode", e.Default.String()))
	} else {
		t.Unenforced = unenforced - e.atDegrade.Load()
		e.Logger.LogAttrs(ctx, slog.LevelWarn, "ceiling: backend healthy again; limits enforced by the backend",
			slog.Duration("degraded_for", t.Duration), slog.Int64("unenforced_admissions", t.Unenforced))
	}
	if e.Degraded != nil {
		e.Degraded(t)
	}
}

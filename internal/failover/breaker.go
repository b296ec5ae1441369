// Package failover is ceiling's failure engine. An Engine decides a
// request's backend call and, when the backend cannot, its fail modes
// (Decide), and reports the breaker's transitions; beneath it are every
// backend call and the judgement of its outcome (Caller), the circuit
// breaker (Breaker), the probes that confirm a timeout and close the
// breaker, FailLocal's store and its bound across an outage's edges
// (Local), and the resends of writes whose call failed (Resends), all
// stopped by one Group. ceiling's engine.go hands it the rules.
package failover

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Config tunes a Breaker; zero fields are not defaults here (ceiling's
// BreakerConfig fills them).
type Config struct {
	// Failures is how many consecutive failures open the breaker.
	Failures int
	// CoolDown is how long after the opening the first probe goes.
	CoolDown time.Duration
	// MaxCoolDown caps the probe interval's growth while probes fail.
	MaxCoolDown time.Duration
}

// Transition is one change between healthy (closed) and degraded (open).
type Transition struct {
	Degraded bool
	Cause    error         // the failure that opened it; nil on closing
	At       time.Time     // when it happened
	Failures int           // consecutive failures that opened it
	Duration time.Duration // on closing, how long it was open
	// Unenforced is, on closing, how many rule admissions the fail modes
	// made while it was open (Engine.Transition fills it in).
	Unenforced int64
}

// Breaker states. Healthy is closed; open is degraded.
const (
	breakerClosed uint32 = iota
	breakerOpen
)

// Breaker is the circuit breaker. The healthy path reads one atomic and
// writes nothing; transitions take mu and are reported through emit, one
// event per transition. While open, only the limiter's prober calls the
// backend. It is safe for simultaneous use.
type Breaker struct {
	cfg       Config
	now       func() time.Time
	emit      func(Transition)
	opened    func()           // starts the prober; called after each opening
	isTimeout func(error) bool // a cause that a later error may name better
	suspect   func()           // starts a confirming probe (see Failure)

	confirming  atomic.Bool  // a probe started by a timeout runs
	confirmed   atomic.Bool  // it failed, and no probe answered since
	confirmedAt atomic.Int64 // Unix ns of that verdict (see Success)
	lastTimeout atomic.Int64 // Unix ns of the latest timeout (see lapse)

	state atomic.Uint32
	fails atomic.Int64 // consecutive failures while closed
	until atomic.Int64 // Unix ns when the next probe goes

	mu        sync.Mutex
	since     time.Time     // when it opened
	firstWait time.Duration // from the opening to the first probe (jittered)
	cause     error         // the latest failure while degraded
	count     int64         // number of healthy → degraded transitions
	emitMu    sync.Mutex    // serialises events, in transition order
	pending   []Transition
}

// New returns a closed Breaker: now is its clock, emit is told of each
// transition (in order, one at a time, outside its locks), opened is
// called after each opening, isTimeout tells a timeout (which opens the
// breaker only once a probe confirms it, and which a later error may name
// better, see LateCause), and suspect starts that probe, off the caller's
// path, which reports its verdict to Confirmed.
func New(c Config, now func() time.Time, emit func(Transition), opened func(), isTimeout func(error) bool, suspect func()) *Breaker {
	return &Breaker{cfg: c, now: now, emit: emit, opened: opened, isTimeout: isTimeout, suspect: suspect}
}

// Closed reports whether requests may call the backend.
func (b *Breaker) Closed() bool { return b.state.Load() == breakerClosed }

// Success records an answer of the backend's own. It clears a failed
// probe's verdict only once that verdict is older than MaxCoolDown: on a
// backend of several servers (Redis Cluster) one frozen server's timeouts
// come between answers of the others, which say nothing about it, so the
// verdict stands while the timeouts keep coming (each one past the
// verdict's age starts a new probe, see Failure, and the old verdict
// stands until the new one's).
func (b *Breaker) Success() {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.confirmed.Load() && b.stale() && !b.confirming.Load() {
		b.confirmed.Store(false)
	}
}

// stale reports whether the latest failed probe's verdict is older than
// MaxCoolDown.
func (b *Breaker) stale() bool {
	return b.now().UnixNano()-b.confirmedAt.Load() > int64(b.cfg.MaxCoolDown)
}

// Unconfirmed reports whether no failed probe stands behind timeouts: a
// timeout then may be this process's, and FailOpen does not apply.
func (b *Breaker) Unconfirmed() bool { return !b.confirmed.Load() }

// Failure records a failed call. It reports whether the failure is an
// isolated one while healthy (the breaker did not open and was not open),
// which the caller logs sampled.
//
// A timeout does not open the breaker by itself: a process too busy to
// read a reply that came looks the same as a backend that sent none. The
// first one starts a probe (suspect) with a budget of its own, off the
// caller's path, and timeouts open the breaker only once that probe failed
// too (Confirmed) and Failures calls in a row failed.
func (b *Breaker) Failure(err error) bool {
	n := b.fails.Add(1)
	if b.state.Load() != breakerClosed {
		b.LateCause(err) // a call that started before the breaker opened
		return false
	}
	if b.isTimeout(err) {
		b.lapse()
		confirmed := b.confirmed.Load()
		if (!confirmed || b.stale()) && b.confirming.CompareAndSwap(false, true) {
			b.suspect() // a stale verdict stands until this one's
		}
		if !confirmed {
			return n < int64(b.cfg.Failures)
		}
	}
	if n < int64(b.cfg.Failures) {
		return true
	}
	b.Open(err, int(n))
	return false
}

// lapse records a timeout, first dropping a stale verdict that no timeout
// came to uphold for MaxCoolDown: the verdict stands while timeouts keep
// coming (a frozen master of a Cluster), but one from a moment long past,
// with nothing since, says nothing about the backend now, and a CPU flood
// on a healthy backend must not fail open on it. The verdict is dropped
// before the timeout is recorded, so a simultaneous timeout that sees this
// one's time also sees the verdict gone.
func (b *Breaker) lapse() {
	now := b.now().UnixNano()
	if b.confirmed.Load() && b.stale() && now-b.lastTimeout.Load() > int64(b.cfg.MaxCoolDown) {
		b.confirmed.Store(false)
	}
	b.lastTimeout.Store(now)
}

// NoVerdict ends the probe that Failure started without a verdict (this
// process was too busy to ask): the next timeout starts another.
func (b *Breaker) NoVerdict() { b.confirming.Store(false) }

// Confirmed takes the verdict of the probe that Failure started: nil (the
// backend answered it, so the timeouts were this process's) clears the
// run of failures; an error confirms them, and opens the breaker if
// Failures calls in a row have failed by then (or when they have).
func (b *Breaker) Confirmed(err error) {
	defer b.confirming.Store(false)
	if err == nil {
		b.fails.Store(0)
		b.confirmed.Store(false)
		return
	}
	b.confirmedAt.Store(b.now().UnixNano())
	b.confirmed.Store(true)
	if n := b.fails.Load(); n >= int64(b.cfg.Failures) {
		b.Open(err, int(n))
	}
}

// Open opens a closed breaker after failures consecutive failures (err the
// last), reports the transition, and starts the prober.
func (b *Breaker) Open(err error, failures int) {
	b.mu.Lock()
	if b.state.Load() != breakerClosed {
		b.mu.Unlock()
		return
	}
	now := b.now()
	b.since, b.cause = now, err
	b.count++
	b.firstWait = Jittered(b.cfg.CoolDown)
	b.until.Store(now.Add(b.firstWait).UnixNano())
	b.state.Store(breakerOpen)
	b.queue(Transition{Degraded: true, Cause: err, At: now, Failures: failures})
	b.mu.Unlock()
	b.flush()
	b.opened()
}

// FirstProbe is how long after the latest opening the first probe goes,
// as the opening announced it (Retry-After, Health).
func (b *Breaker) FirstProbe() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firstWait
}

// Probed records a failed probe: the latest cause, and when the next probe
// goes.
func (b *Breaker) Probed(err error, next time.Duration) {
	b.mu.Lock()
	b.cause = err
	b.until.Store(b.now().Add(next).UnixNano())
	b.mu.Unlock()
}

// LateCause replaces a timeout as the cause of an open breaker with the
// error the backend call finally returned after the limiter stopped waiting
// for it (a refused connection that go-redis kept retrying), so that the
// reason names the root cause.
func (b *Breaker) LateCause(err error) {
	if err == nil || b.isTimeout(err) {
		return
	}
	b.mu.Lock()
	if b.state.Load() != breakerClosed && (b.cause == nil || b.isTimeout(b.cause)) {
		b.cause = err
	}
	b.mu.Unlock()
}

// Close closes an open breaker: the backend answered a probe.
func (b *Breaker) Close() {
	b.mu.Lock()
	if b.state.Load() == breakerClosed {
		b.mu.Unlock()
		return
	}
	now := b.now()
	b.fails.Store(0)
	b.confirmed.Store(false)
	b.cause = nil
	b.state.Store(breakerClosed)
	b.queue(Transition{At: now, Duration: now.Sub(b.since)})
	b.mu.Unlock()
	b.flush()
}

// RetryIn is how long until the backend will be tried again; zero when the
// breaker is closed.
func (b *Breaker) RetryIn() time.Duration {
	if b.state.Load() == breakerClosed {
		return 0
	}
	return max(0, time.Duration(b.until.Load()-b.now().UnixNano()))
}

// Status is a snapshot for the health report.
type Status struct {
	Degraded bool
	Since    time.Time     // when it opened
	Cause    error         // the latest failure while open
	RetryIn  time.Duration // until the next probe
	Opened   int64         // healthy → degraded transitions so far
}

// Status reports the breaker's state.
func (b *Breaker) Status() Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Status{Opened: b.count}
	if b.state.Load() != breakerClosed {
		s.Degraded = true
		s.Since, s.Cause = b.since, b.cause
		s.RetryIn = max(0, time.Duration(b.until.Load()-b.now().UnixNano()))
	}
	return s
}

// queue records an event under mu; flush delivers queued events outside
// mu, in order, one delivery at a time, so a hook may read the limiter's
// health without deadlocking.
func (b *Breaker) queue(ev Transition) { b.pending = append(b.pending, ev) }

func (b *Breaker) flush() {
	b.emitMu.Lock()
	defer b.emitMu.Unlock()
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.mu.Unlock()
			return
		}
		ev := b.pending[0]
		b.pending = b.pending[1:]
		b.mu.Unlock()
		b.emit(ev)
	}
}

// Fails is the count of consecutive failures while closed.
func (b *Breaker) Fails() int64 { return b.fails.Load() }

// Jittered is d shortened by up to a quarter, at random, so that instances
// that lost the backend together do not probe in step.
func Jittered(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

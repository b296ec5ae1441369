package ceiling

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig tunes the circuit breaker that stands between the limiter
// and a backend that does I/O. After Failures consecutive failed decisions
// the breaker opens: the backend is not called by requests at all, and every
// request is decided by its rules' fail modes at once, paying no timeout.
//
// While it is open, one goroutine of the limiter probes the backend in the
// background with a real decision on a throwaway canary key (so a backend
// that answers PING but cannot write, read-only or out of memory, does not
// pass), first CoolDown after the opening, then at an interval that doubles
// while probes fail, up to MaxCoolDown; each wait is jittered down by up to
// a quarter so that instances do not probe in step. The first answered probe
// closes the breaker, with or without traffic. Only the backend's own
// answers and failures move the breaker: an answer from a cache in process
// ([backend.Result.Cached]), a decision made by a fail mode, a client that
// went away or a process too busy to read the reply in time do not.
//
// The zero value means the defaults: 5 failures, 500ms, 1s. A probe costs
// one small decision per interval per instance, so there is little reason
// to back off further: a longer MaxCoolDown only delays recovery.
type BreakerConfig struct {
	// Failures is how many consecutive failures open the breaker.
	Failures int
	// CoolDown is how long after the opening the first probe goes.
	CoolDown time.Duration
	// MaxCoolDown caps the probe interval's growth while probes fail.
	MaxCoolDown time.Duration
}

// Breaker defaults; see [BreakerConfig].
const (
	DefaultBreakerFailures    = 5
	DefaultBreakerCoolDown    = 500 * time.Millisecond
	DefaultBreakerMaxCoolDown = time.Second
)

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures == 0 {
		c.Failures = DefaultBreakerFailures
	}
	if c.CoolDown == 0 {
		c.CoolDown = DefaultBreakerCoolDown
	}
	if c.MaxCoolDown == 0 {
		c.MaxCoolDown = max(DefaultBreakerMaxCoolDown, c.CoolDown)
	}
	return c
}

// WithBreaker tunes the circuit breaker (see [BreakerConfig]); zero fields
// keep their defaults. In-process backends have no breaker.
func WithBreaker(c BreakerConfig) Option {
	return func(cfg *config) error {
		if c.Failures < 0 || c.CoolDown < 0 || c.MaxCoolDown < 0 {
			return fmt.Errorf("ceiling: WithBreaker(%+v): negative value", c)
		}
		c = c.withDefaults()
		if c.MaxCoolDown < c.CoolDown {
			return fmt.Errorf("ceiling: WithBreaker: MaxCoolDown %v below CoolDown %v", c.MaxCoolDown, c.CoolDown)
		}
		cfg.breaker = c
		return nil
	}
}

// Breaker states. Healthy is closed; open is degraded.
const (
	breakerClosed uint32 = iota
	breakerOpen
)

// breaker is the circuit breaker. The healthy path reads one atomic and
// writes nothing; transitions take mu and are reported through emit, one
// event per transition. While open, only the limiter's prober calls the
// backend (probe.go).
type breaker struct {
	cfg    BreakerConfig
	now    func() time.Time
	emit   func(DegradedEvent)
	opened func() // starts the prober; called after each opening

	state      atomic.Uint32
	fails      atomic.Int64 // consecutive failures while closed
	confirming atomic.Bool  // a confirmation of suspect failures runs
	until      atomic.Int64 // Unix ns when the next probe goes

	mu        sync.Mutex
	since     time.Time     // when it opened
	firstWait time.Duration // from the opening to the first probe (jittered)
	cause     error         // the latest failure while degraded
	count     int64         // number of healthy → degraded transitions
	emitMu    sync.Mutex    // serialises events, in transition order
	pending   []DegradedEvent
}

func newBreaker(c BreakerConfig, now func() time.Time, emit func(DegradedEvent), opened func()) *breaker {
	return &breaker{cfg: c.withDefaults(), now: now, emit: emit, opened: opened}
}

// closed reports whether requests may call the backend.
func (b *breaker) closed() bool { return b.state.Load() == breakerClosed }

// success records an answer of the backend's own.
func (b *breaker) success() {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
}

// failure records a failed call. It reports whether the failure is an
// isolated one while healthy (the breaker did not open and was not open),
// which the caller logs sampled.
func (b *breaker) failure(err error) bool {
	n := b.fails.Add(1)
	if b.state.Load() != breakerClosed {
		b.lateCause(err) // a call that started before the breaker opened
		return false
	}
	if n < int64(b.cfg.Failures) || b.confirming.Load() {
		return n < int64(b.cfg.Failures)
	}
	b.open(err, int(n))
	return false
}

// suspect records a timeout of a starved process: it counts like a
// failure, but instead of opening the breaker at the threshold it reports
// (once per spell) that the backend should be asked again, patiently,
// before it is blamed (Limiter.confirm).
func (b *breaker) suspect() bool {
	n := b.fails.Add(1)
	return n >= int64(b.cfg.Failures) && b.state.Load() == breakerClosed && b.confirming.CompareAndSwap(false, true)
}

// open opens a closed breaker after failures consecutive failures (err the
// last), reports the transition, and starts the prober.
func (b *breaker) open(err error, failures int) {
	b.mu.Lock()
	if b.state.Load() != breakerClosed {
		b.mu.Unlock()
		return
	}
	now := b.now()
	b.since, b.cause = now, err
	b.count++
	b.firstWait = jittered(b.cfg.CoolDown)
	b.until.Store(now.Add(b.firstWait).UnixNano())
	b.state.Store(breakerOpen)
	b.queue(DegradedEvent{Degraded: true, Cause: err, At: now, Failures: failures})
	b.mu.Unlock()
	b.flush()
	b.opened()
}

// firstProbe is how long after the latest opening the first probe goes,
// as the opening announced it (Retry-After, Health).
func (b *breaker) firstProbe() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firstWait
}

// probed records a failed probe: the latest cause, and when the next probe
// goes.
func (b *breaker) probed(err error, next time.Duration) {
	b.mu.Lock()
	b.cause = err
	b.until.Store(b.now().Add(next).UnixNano())
	b.mu.Unlock()
}

// lateCause replaces a timeout as the cause of an open breaker with the
// error the backend call finally returned after the limiter stopped waiting
// for it (a refused connection that go-redis kept retrying), so that the
// reason names the root cause.
func (b *breaker) lateCause(err error) {
	if err == nil || FailureKind(err) == kindTimeout {
		return
	}
	b.mu.Lock()
	if b.state.Load() != breakerClosed && (b.cause == nil || FailureKind(b.cause) == kindTimeout) {
		b.cause = err
	}
	b.mu.Unlock()
}

// close closes an open breaker: the backend answered a probe.
func (b *breaker) close() {
	b.mu.Lock()
	if b.state.Load() == breakerClosed {
		b.mu.Unlock()
		return
	}
	now := b.now()
	b.fails.Store(0)
	b.cause = nil
	b.state.Store(breakerClosed)
	b.queue(DegradedEvent{At: now, Duration: now.Sub(b.since)})
	b.mu.Unlock()
	b.flush()
}

// retryIn is how long until the backend will be tried again; zero when the
// breaker is closed.
func (b *breaker) retryIn() time.Duration {
	if b.state.Load() == breakerClosed {
		return 0
	}
	return max(0, time.Duration(b.until.Load()-b.now().UnixNano()))
}

// breakerStatus is a snapshot for the health report.
type breakerStatus struct {
	degraded bool
	since    time.Time
	cause    error
	retryIn  time.Duration
	opened   int64
}

func (b *breaker) status() breakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := breakerStatus{opened: b.count}
	if b.state.Load() != breakerClosed {
		s.degraded = true
		s.since, s.cause = b.since, b.cause
		s.retryIn = max(0, time.Duration(b.until.Load()-b.now().UnixNano()))
	}
	return s
}

// queue records an event under mu; flush delivers queued events outside
// mu, in order, one delivery at a time, so a hook may read the limiter's
// health without deadlocking.
func (b *breaker) queue(ev DegradedEvent) { b.pending = append(b.pending, ev) }

func (b *breaker) flush() {
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

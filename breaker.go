package ceiling

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig tunes the circuit breaker that stands between the middleware
// and a backend that does I/O. After Failures consecutive failed decisions
// the breaker opens: the backend is not called at all for CoolDown, and
// every request is decided by its rules' fail modes at once, paying no
// timeout. Then one request at a time probes the backend; the first that is
// answered closes the breaker, and every failed probe doubles the cool-down,
// up to MaxCoolDown.
//
// The zero value means the defaults: 5 failures, 500ms, 30s.
type BreakerConfig struct {
	// Failures is how many consecutive failures open the breaker.
	Failures int
	// CoolDown is how long the first opening lasts.
	CoolDown time.Duration
	// MaxCoolDown caps the cool-down's growth while failures continue.
	MaxCoolDown time.Duration
}

// Breaker defaults; see [BreakerConfig].
const (
	DefaultBreakerFailures    = 5
	DefaultBreakerCoolDown    = 500 * time.Millisecond
	DefaultBreakerMaxCoolDown = 30 * time.Second
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

// Breaker states. Healthy is closed; open and probing are degraded.
const (
	breakerClosed uint32 = iota
	breakerOpen
	breakerProbing
)

// breaker is the circuit breaker. The healthy path reads one atomic and
// writes nothing; transitions take mu and are reported through emit, one
// event per transition.
type breaker struct {
	cfg  BreakerConfig
	now  func() time.Time
	emit func(DegradedEvent)

	state atomic.Uint32
	fails atomic.Int64 // consecutive failures while closed
	until atomic.Int64 // Unix ns after which the next probe may go

	mu      sync.Mutex
	cool    time.Duration // the current opening's cool-down
	since   time.Time     // when it opened
	cause   error         // the latest failure while degraded
	opened  int64         // number of healthy → degraded transitions
	emitMu  sync.Mutex    // serialises events, in transition order
	pending []DegradedEvent
}

func newBreaker(c BreakerConfig, now func() time.Time, emit func(DegradedEvent)) *breaker {
	return &breaker{cfg: c.withDefaults(), now: now, emit: emit}
}

// allow says whether a request may call the backend, and whether that call
// is the probe of an open breaker.
func (b *breaker) allow() (probe, ok bool) {
	switch b.state.Load() {
	case breakerClosed:
		return false, true
	case breakerOpen:
		if b.now().UnixNano() < b.until.Load() {
			return false, false
		}
		if b.state.CompareAndSwap(breakerOpen, breakerProbing) {
			return true, true
		}
	}
	return false, false
}

// success records an answered call; a probe's answer closes the breaker.
func (b *breaker) success(probe bool) {
	if !probe {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	b.mu.Lock()
	now := b.now()
	ev := DegradedEvent{At: now, Duration: now.Sub(b.since)}
	b.fails.Store(0)
	b.cool, b.cause = 0, nil
	b.state.Store(breakerClosed)
	b.queue(ev)
	b.mu.Unlock()
	b.flush()
}

// failure records a failed call. It reports whether the failure is an
// isolated one while healthy (the breaker did not open and was not open),
// which the caller logs sampled.
func (b *breaker) failure(probe bool, err error) bool {
	if probe {
		b.mu.Lock()
		b.cool = min(2*b.cool, b.cfg.MaxCoolDown)
		b.cause = err
		b.until.Store(b.now().Add(b.cool).UnixNano())
		b.state.Store(breakerOpen)
		b.mu.Unlock()
		return false
	}
	n := b.fails.Add(1)
	if b.state.Load() != breakerClosed {
		return false // a call that started before the breaker opened
	}
	if n < int64(b.cfg.Failures) {
		return true
	}
	b.mu.Lock()
	if b.state.Load() == breakerClosed {
		now := b.now()
		b.cool, b.since, b.cause = b.cfg.CoolDown, now, err
		b.opened++
		b.until.Store(now.Add(b.cool).UnixNano())
		b.state.Store(breakerOpen)
		b.queue(DegradedEvent{Degraded: true, Cause: err, At: now, Failures: int(n)})
	}
	b.mu.Unlock()
	b.flush()
	return false
}

// neutral gives back a probe whose call said nothing about the backend (the
// client went away): the next request probes instead.
func (b *breaker) neutral(probe bool) {
	if probe {
		b.state.Store(breakerOpen)
	}
}

// retryIn is how long until the backend will be tried again; zero when the
// breaker is closed.
func (b *breaker) retryIn() time.Duration {
	if b.state.Load() == breakerClosed {
		return 0
	}
	return time.Duration(b.until.Load() - b.now().UnixNano())
}

// breakerStatus is a snapshot for the health report.
type breakerStatus struct {
	degraded bool
	probing  bool
	since    time.Time
	cause    error
	retryIn  time.Duration
	opened   int64
}

func (b *breaker) status() breakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := breakerStatus{opened: b.opened}
	if st := b.state.Load(); st != breakerClosed {
		s.degraded, s.probing = true, st == breakerProbing
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

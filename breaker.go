package ceiling

import (
	"fmt"
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
// went away or a call this process never got to send
// ([backend.ErrNotSent]) do not. Timeouts open it only once a probe with a
// budget of its own fails too, or answers later than the timeout and the
// backend blames itself for the canary sent again at the timeout: a
// process too busy to read a reply looks like a backend that sent none,
// and until then a FailOpen rule is shed.
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
	defaultBreakerFailures    = 5
	defaultBreakerCoolDown    = 500 * time.Millisecond
	defaultBreakerMaxCoolDown = time.Second
)

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures == 0 {
		c.Failures = defaultBreakerFailures
	}
	if c.CoolDown == 0 {
		c.CoolDown = defaultBreakerCoolDown
	}
	if c.MaxCoolDown == 0 {
		c.MaxCoolDown = max(defaultBreakerMaxCoolDown, c.CoolDown)
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

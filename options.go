package ceiling

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// An Option configures a [Limiter] at construction.
type Option func(*config) error

type config struct {
	backend  backend.Backend
	headers  HeaderStyle
	secret   []byte
	failMode FailMode
	timeout  time.Duration
	reject   RejectHandler
	logger   *slog.Logger

	prefetches []Prefetcher

	// Failure handling and observability (engine.go, breaker.go,
	// observer.go, health.go).
	localShare     float64
	instances      int
	instancesSet   bool // WithInstances was given
	breaker        BreakerConfig
	observer       Observer
	shadowHeader   bool
	shadowLogEvery time.Duration
	clock          func() time.Time
	localStore     backend.Backend // FailLocal's store; nil means a new memory store
}

// defaultTimeout bounds every decision by a backend that does I/O.
const defaultTimeout = 100 * time.Millisecond

func defaultConfig() config {
	return config{
		headers:  HeadersIETF,
		failMode: FailLocal,
		timeout:  defaultTimeout,
		reject:   WriteRejection,
		logger:   slog.Default(),

		instances:      1,
		breaker:        BreakerConfig{}.withDefaults(),
		shadowLogEvery: 10 * time.Second,
		clock:          time.Now,
	}
}

// WithBackend sets where limits are counted. The default is a fresh
// in-process memory store: exact for one process, per instance when several
// run.
func WithBackend(b backend.Backend) Option {
	return func(c *config) error {
		if b == nil {
			return errors.New("ceiling: WithBackend(nil)")
		}
		c.backend = b
		return nil
	}
}

// WithHeaders selects which rate-limit headers responses carry; the default
// is [HeadersIETF].
func WithHeaders(s HeaderStyle) Option {
	return func(c *config) error {
		if s > HeadersNone {
			return fmt.Errorf("ceiling: WithHeaders(%d): unknown style", s)
		}
		c.headers = s
		return nil
	}
}

// minKeySecret is the shortest secret [WithKeySecret] takes, in bytes.
const minKeySecret = 32

// WithKeySecret makes stored keys an HMAC-SHA256 of the key value under
// secret, so that nobody who reads the backend can recover an IP address or
// a phone number by hashing candidates. Without it keys are SHA-256
// digests, guessable for small key spaces, and a limiter with a remote
// backend warns. Use the same secret on every instance. A secret shorter
// than 32 bytes (RFC 2104's bound) is an error.
func WithKeySecret(secret []byte) Option {
	return func(c *config) error {
		if len(secret) < minKeySecret {
			return fmt.Errorf("ceiling: WithKeySecret: %d bytes is too short (want at least %d, e.g. from `openssl rand -hex 32`)", len(secret), minKeySecret)
		}
		c.secret = append([]byte(nil), secret...)
		return nil
	}
}

// WithFailMode sets what happens when the backend cannot decide; rules may
// override it. The default, [FailLocal], keeps enforcing the limits in each
// instance's memory, so the service neither goes down ([FailClosed]) nor
// stops limiting ([FailOpen]).
func WithFailMode(m FailMode) Option {
	return func(c *config) error {
		if m == inherit || m > FailLocal {
			return fmt.Errorf("ceiling: WithFailMode(%d): unknown mode", m)
		}
		c.failMode = m
		return nil
	}
}

// WithTimeout bounds each backend decision (default 100 ms); past
// it the fail mode applies. In-process backends are never timed out.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("ceiling: WithTimeout(%v): must be positive", d)
		}
		c.timeout = d
		return nil
	}
}

// A RejectHandler writes the response to a request that was not admitted.
// The rate-limit headers and Retry-After are already set; it writes the
// status and body. The Decision is valid only during the call.
type RejectHandler func(w http.ResponseWriter, r *http.Request, d *Decision)

// WithRejectHandler replaces the default 429 problem+json response
// ([WriteRejection]).
func WithRejectHandler(h RejectHandler) Option {
	return func(c *config) error {
		if h == nil {
			return errors.New("ceiling: WithRejectHandler(nil)")
		}
		c.reject = h
		return nil
	}
}

// WithLogger sets where degradation events are logged (default
// [slog.Default]), and a backend that logs ([backend.DefaultLogger]) logs
// there too unless given a logger of its own.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("ceiling: WithLogger(nil)")
		}
		c.logger = l
		return nil
	}
}

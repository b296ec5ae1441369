package ceiling

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// The algorithms a [Rule] can use; see package backend for what each promises.
const (
	RollingWindow = backend.RollingWindow
	SlidingLog    = backend.SlidingLog
	SlidingWindow = backend.SlidingWindow
	FixedWindow   = backend.FixedWindow
	GCRA          = backend.GCRA
)

// MaxSlidingLogLimit is the largest Limit of a [SlidingLog] rule, whose
// state grows with its limit. Past it a rule is a configuration error, and
// a limit a request brings ([Rule.Limits], [Input.Limit]) a [*LimitError];
// RollingWindow holds the same ceiling in bounded state.
const MaxSlidingLogLimit = 10_000

// A Rule is one limit on one dimension of a request: at most Limit units per
// Period for each distinct value of Key.
//
// The zero Algorithm is [RollingWindow]: never more than Limit in any rolling
// Period, a unit readmitted at most Period/16 later than exactly. For exactly
// "at most N in any rolling window" with small N use [SlidingLog]; for a
// smooth rate with a burst, [GCRA].
type Rule struct {
	// Name identifies the rule in headers, problem bodies, metrics and stored
	// keys. Required, unique within a limiter: letters, digits and ":_.-/".
	Name string
	// Key says what the rule limits by. There is no default: the middleware
	// refuses a rule without one. A rule decided only with [Limiter.Decide]
	// leaves it nil.
	Key KeyFunc
	// Limit is the number of units admitted per Period. Required; with
	// Limits set, it is the default limit.
	Limit int64
	// Period is the window, at least 1ms. Required.
	Period time.Duration
	// Burst is GCRA's bucket size; zero means Limit. It is an error on any
	// other algorithm.
	Burst int64
	// Algorithm selects how the rule counts; the zero value is
	// RollingWindow.
	Algorithm backend.Algorithm
	// Cost is the number of units one request takes; zero means 1.
	Cost int64
	// Unit names what the rule counts when that is not requests ("tokens"),
	// sent as RateLimit-Policy's qu parameter. Empty means requests; a
	// [Concurrency] rule's is "concurrent-requests". Lower-case letters,
	// digits and '-'.
	Unit string
	// Estimate, when set, is the units to reserve when the request is
	// decided, settled by the handler with [Settle] (zero: charge only after
	// the work; [ErrNoKey]: one unit; other errors as the Key's). Set Cost or
	// Estimate, not both.
	Estimate func(r *http.Request) (int64, error)
	// Limits, when set, gives the limit and burst that apply to r (a plan
	// read from a verified claim), called after Key. A zero value or
	// [ErrNoKey] means the rule's own: what the lookup does not know is
	// limited, never unlimited. Any other error, or a value out of range, is
	// the server's fault: a 500 and a log line ([LimitError]).
	// [Limiter.Decide] ignores it (callers pass [Input.Limit]).
	Limits func(r *http.Request) (limit, burst int64, err error)
	// FailMode overrides the limiter's fail mode for this rule.
	FailMode FailMode
	// Shadow evaluates and reports the rule but never rejects with it, so a
	// new limit can be rolled out safely.
	Shadow bool
	// Hidden keeps the rule's state out of every response header, for a
	// key that names a third party (the phone an OTP goes to). A 429 names a
	// hidden rule only when no other rule refuses too.
	Hidden bool

	plan *atomic.Pointer[plan] // the limit in force (setlimit.go); set by New
}

func (r *Rule) validate() error {
	if r.Name == "" {
		return errors.New("ceiling: a rule has no name")
	}
	for _, c := range r.Name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(":_.-/", c)) {
			return fmt.Errorf("ceiling: rule %q: name may hold only letters, digits and \":_.-/\"", r.Name)
		}
	}
	if r.Estimate != nil && r.Cost != 0 {
		return fmt.Errorf("ceiling: rule %q: set Cost or Estimate, not both", r.Name)
	}
	if r.Cost < 0 {
		return fmt.Errorf("ceiling: rule %q: negative cost %d", r.Name, r.Cost)
	}
	if err := validUnit(r.Unit); err != nil {
		return fmt.Errorf("ceiling: rule %q: %w", r.Name, err)
	}
	if r.Burst != 0 && r.Algorithm != GCRA {
		return fmt.Errorf("ceiling: rule %q: Burst is GCRA's, but the algorithm is %v; set Algorithm: ceiling.GCRA", r.Name, r.Algorithm)
	}
	if err := slidingLogBound(r.Algorithm, r.Limit); err != nil {
		return fmt.Errorf("ceiling: rule %q: %w", r.Name, err)
	}
	if r.Cost == 0 {
		r.Cost = 1
	}
	req := backend.Request{Key: r.Name, Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("ceiling: rule %q: %w", r.Name, err)
	}
	if err := r.validateConcurrency(); err != nil {
		return err
	}
	if capacity := capacityOf(req); r.Cost > capacity {
		return fmt.Errorf("ceiling: rule %q: cost %d can never fit in %d", r.Name, r.Cost, capacity)
	}
	return nil
}

// capacityOf is the most units one request can ever take under req's
// limit.
func capacityOf(req backend.Request) int64 {
	if req.Algorithm == GCRA && req.Burst > 0 {
		return req.Burst
	}
	return req.Limit
}

// A Limiter decides requests against its rules. Create one with [New]; it is
// safe for simultaneous use by multiple goroutines.
type Limiter struct {
	rules      []Rule
	backend    backend.Backend
	into       backend.DecideInto
	remote     bool // the backend does I/O: apply the timeout and fail modes
	cfg        config
	digest     digester
	plans      []atomic.Pointer[plan] // each rule's limit in force (setlimit.go)
	planMu     sync.Mutex             // serialises SetLimit
	dynamic    bool                   // a rule has Limits: RateLimit-Policy is per request
	concurrent bool                   // a rule is a Concurrency rule: admitted decisions hold slots
	states     sync.Pool
	extras     bool       // prefetches or estimates: requests carry an extras
	rawKeys    bool       // the backend keeps only its own hashes: skip the digest
	fo         *failState // the failure engine: fail modes, breaker, probe, resends (engine.go)
	notes      notes      // warnings about the configuration (health.go)
	routes     routeWatch // a Route key mounted before routing (route.go)
}

// New validates the rules and options and returns a Limiter; errors name the
// rule or option at fault. Close the limiter when done with it, to stop its
// goroutines. New warns, once and in [Limiter.Health], about a configuration
// weaker than it reads: an in-process backend on a platform that runs
// several instances, and a remote backend without [WithKeySecret].
func New(rules []Rule, opts ...Option) (*Limiter, error) {
	if len(rules) == 0 {
		return nil, errors.New("ceiling: no rules")
	}
	l := &Limiter{rules: append([]Rule(nil), rules...), cfg: defaultConfig()}
	seen := make(map[string]bool, len(rules))
	for i := range l.rules {
		r := &l.rules[i]
		if err := r.validate(); err != nil {
			return nil, err
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("ceiling: rule %q declared twice", r.Name)
		}
		seen[r.Name] = true
	}
	for _, o := range opts {
		if err := o(&l.cfg); err != nil {
			return nil, err
		}
	}
	l.backend = l.cfg.backend
	if l.backend == nil {
		l.backend = memory.New(memory.WithLogger(l.cfg.logger))
	}
	l.into, _ = l.backend.(backend.DecideInto)
	if kh, ok := l.backend.(keyHasher); ok && kh.HashesKeys() {
		l.rawKeys = true
	}
	if ip, ok := l.backend.(backend.InProcess); !ok || !ip.InProcess() {
		l.remote = true
	}
	l.digest = l.newDigester()
	processLogger.CompareAndSwap(nil, l.cfg.logger) // for key functions' warnings
	spoofable.flush()
	l.initPlans()
	for i := range l.rules {
		l.dynamic = l.dynamic || l.rules[i].Limits != nil
		l.concurrent = l.concurrent || l.rules[i].Algorithm == Concurrency
	}
	l.extras = l.hasExtras()
	n := len(l.rules)
	l.states.New = func() any { return newState(n) }
	if err := l.initFailover(); err != nil {
		return nil, err
	}
	l.warnPlatform()
	l.observeConfig()
	if dl, ok := l.backend.(backend.DefaultLogger); ok {
		dl.UseDefaultLogger(l.cfg.logger) // go-redis's lines, with the limiter's
	}
	return l, nil
}

// MustNew is like [New] but panics on a configuration error; use it for rules
// written as literals.
func MustNew(rules []Rule, opts ...Option) *Limiter {
	l, err := New(rules, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// Rules returns a copy of the limiter's rules, in declaration order, with
// the limits in force ([Limiter.SetLimit]).
func (l *Limiter) Rules() []Rule { return append([]Rule(nil), l.plans[0].Load().rules...) }

// Handler is the middleware: it decides every request before next sees it,
// sets the rate-limit headers, and answers 429 (or 503 when failing closed)
// without calling next when the request is not admitted.
//
// Handler panics, naming the rule, when a rule has no Key.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	for i := range l.rules {
		if l.rules[i].Key == nil {
			panic(fmt.Sprintf("ceiling: rule %q has no Key, so the middleware cannot decide it; give it one, or decide it with Limiter.Decide on a limiter of its own", l.rules[i].Name))
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := l.states.Get().(*state)
		defer l.states.Put(st)
		if l.extras {
			l.beginExtras(st)
			defer l.endExtras(r, st)
		}
		// The keys may see a copy of r that watches for a Route key
		// mounted before routing (route.go).
		rk := l.watching(r)
		err := l.decideGuarded(w, rk, st)
		if rk != r {
			r.Body = rk.Body
			if err == nil {
				l.watchRoute(rk)
			}
		}
		if err != nil {
			var in *inputError
			if errors.As(err, &in) {
				l.writeInputError(w, r, in)
				return
			}
			var le *LimitError
			if errors.As(err, &le) {
				l.limitFailed(r.Context(), le, slog.String("path", r.URL.Path))
				writeLimitError(w, le)
				return
			}
			l.failed(w, r, err)
			return
		}
		d := &st.decision
		if l.cfg.shadowHeader {
			writeShadowHeader(w.Header(), d)
		}
		pl := l.plans[0].Load()
		policy := pl.policy
		if l.dynamic {
			policy = requestPolicy(pl.rules, d)
		}
		l.cfg.headers.write(w.Header(), d, policy, st, l.cfg.clock)
		if !d.Allowed {
			if retry := refusal(d).retryAfter; retry > 0 {
				w.Header()[hRetryAfter] = []string{seconds(retry)}
			}
			l.cfg.reject(w, r, d)
			return
		}
		if h := d.leases; h != nil {
			// Concurrency slots: released when the handler returns, with
			// the settlements when the request has extras.
			d.leases = nil
			if st.x != nil {
				st.x.leases = h
			} else {
				defer h.release()
			}
		}
		next.ServeHTTP(w, l.admit(r, st))
	})
}

// A Decision is the outcome of one request against every rule that applied.
// A Decision handed to a hook is valid only during that call.
type Decision struct {
	// Allowed reports whether the request was admitted by every enforced rule.
	Allowed bool
	// Results holds one entry per rule that applied, in declaration order.
	Results []RuleResult
	// RetryAfter is, for a rejected request, the time after which every
	// rejecting rule would admit it (the largest of their waits), or
	// [backend.Never].
	RetryAfter time.Duration

	leases *held // the concurrency slots an admitted decision holds (concurrency.go)
}

// A RuleResult is one rule's part of a [Decision].
type RuleResult struct {
	Rule *Rule
	backend.Result
	// Fallback is the fail mode that decided the rule because the backend
	// could not ([FailOpen] or [FailLocal]); zero when the backend decided.
	Fallback FailMode
	// Ticket names the ticket the backend wrote with this admission, when
	// its [Input] set Reserve: pass it as [Input].Ticket to the
	// [Limiter.Charge] that settles it. Zero when none was written (the
	// decision was rejected or decided by a fail mode, or the backend is
	// in process, which cannot lose a reply and needs none).
	Ticket int64

	limit int64 // the limit that applied to the request (a FailLocal Result.Limit is a share of it)
}

// Rejected returns the first rule, in declaration order, that rejected the
// request, or nil. Shadow rules never reject.
func (d *Decision) Rejected() *RuleResult {
	for i := range d.Results {
		if rr := &d.Results[i]; !rr.Allowed && !rr.Rule.Shadow {
			return rr
		}
	}
	return nil
}

// state is the per-request scratch space, pooled so that a decision does not
// allocate beyond the stored keys and the header values.
type state struct {
	reqs     []backend.Request
	results  []backend.Result
	decision Decision
	buf      []byte
	keys     []byte    // an in-process store's stored keys, valid until reset (storedKey)
	lines    lineSlab  // header values handed to responses (headers.go)
	x        *extras   // nil unless the limiter has prefetches or estimates
	guard    bodyGuard // r.Body while the key functions run (body.go)
	unfit    []bool    // per request: its cost can never fit (decide.go)
}

func newState(n int) *state {
	return &state{
		reqs:     make([]backend.Request, 0, n),
		results:  make([]backend.Result, n),
		decision: Decision{Results: make([]RuleResult, 0, n)},
		buf:      make([]byte, 0, 128),
	}
}

// inputError is a key function's complaint about the request.
type inputError struct {
	rule   string
	status int
	err    error
}

func (e *inputError) Error() string {
	if e.rule == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("ceiling: rule %q: %v", e.rule, e.err)
}
func (e *inputError) Unwrap() error { return e.err }

// decide resolves r's keys and costs into st, starts the prefetches once
// the keys are known, and decides with the one decision path.
func (l *Limiter) decide(r *http.Request, st *state) error {
	st.reset()
	for i := range l.rules {
		rule := &l.rules[i]
		v, err := rule.Key(r)
		var limit, burst int64
		if err == nil && rule.Limits != nil {
			if limit, burst, err = rule.Limits(r); err != nil {
				if !errors.Is(err, ErrNoKey) {
					return &LimitError{Rule: rule.Name, Err: err}
				}
				limit, burst, err = 0, 0, nil // no plan: the rule's own limit
			}
		}
		if err == nil {
			var cost int64
			if cost, err = l.cost(r, st, rule); err == nil {
				if rule.Estimate != nil {
					st.x.est[len(st.x.est)-1].planned = limit == 0 && burst == 0
				}
				err = l.add(st, rule, v, cost, limit, burst, rule.Estimate != nil)
			}
		}
		if err != nil {
			if err == ErrNoKey || errors.Is(err, ErrNoKey) {
				continue
			}
			var le *LimitError
			if errors.As(err, &le) {
				return err
			}
			if errors.Is(err, errEmptyKey) {
				// add named the rule already.
				return &inputError{status: http.StatusBadRequest, err: err}
			}
			return &inputError{rule: rule.Name, status: inputStatus(err), err: err}
		}
	}
	if st.x != nil {
		st.x.startPrefetches(r)
	}
	return l.decideAll(r.Context(), st)
}

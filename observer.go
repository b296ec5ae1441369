package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Outcome is what one rule decided for one request: exactly one per rule
// that applied, so a rule's outcomes sum to the requests it decided.
type Outcome uint8

const (
	// OutcomeAllowed: the rule had room and the request was admitted, so
	// the rule was charged for it.
	OutcomeAllowed Outcome = iota
	// OutcomeRejected: the rule refused the request.
	OutcomeRejected
	// OutcomeShadowRejected: a shadow rule would have refused the request;
	// it was not refused for it.
	OutcomeShadowRejected
	// OutcomeNotCharged: the rule had room, but another rule refused the
	// request, so nothing was consumed from this one (all or nothing).
	OutcomeNotCharged
)

// String returns the outcome as used in metric labels: "allowed",
// "rejected", "shadow_rejected" or "not_charged".
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeRejected:
		return "rejected"
	case OutcomeShadowRejected:
		return "shadow_rejected"
	case OutcomeNotCharged:
		return "not_charged"
	}
	return "unknown"
}

// An Observer is told what the limiter does, for metrics and alerts. Its
// methods are called on the request path from many goroutines at once:
// they must be safe for simultaneous use and must not block. Embed
// [NopObserver] to implement only some; methods added later come with a
// no-op there.
type Observer interface {
	// ObserveConfig is called once, by [New], with the rules' names in
	// declaration order, the backend timeout (zero in process) and a
	// function returning [Limiter.Health], for what a scrape reads. Once
	// it reports Status "closed", the limiter is closed and the function
	// holds nothing of it: drop it, and if Since is set (it was degraded
	// when closed) expect no recovery from it.
	ObserveConfig(rules []string, timeout time.Duration, health func() Health)
	// ObserveDecision is called for every rule decided for a request, by
	// the backend or by [FailLocal]'s store, except the admissions a fail
	// mode made, which ObserveFailMode reports instead.
	ObserveDecision(rule string, outcome Outcome)
	// ObserveBackend is called after every backend call with its latency
	// and error. Label a failure by [KindOf], never by the error's text.
	ObserveBackend(latency time.Duration, err error)
	// ObserveCached is called for each decision a backend answered from a
	// cache in this process ([backend.Result.Cached]), whose near-zero
	// latency would hide a slow backend's quantiles as a call.
	ObserveCached()
	// ObserveDegraded is called once per transition between healthy and
	// degraded, one call at a time and in order; it may read
	// [Limiter.Health].
	ObserveDegraded(e DegradedEvent)
	// ObserveFailMode is called for every rule of an admitted request the
	// backend did not decide: mode is [FailOpen] or [FailLocal].
	ObserveFailMode(rule string, mode FailMode)
	// ObserveRequest is called once per decided request, after its rules,
	// with its context (where a tracer finds its span) and its decision,
	// valid only during the call. err is nil or an [*UnavailableError].
	ObserveRequest(ctx context.Context, d *Decision, err error)
	// ObserveLimit is called after [Limiter.SetLimit] changed a rule's
	// limit and burst.
	ObserveLimit(rule string, limit, burst int64)
}

// observeConfig tells the observer about the limiter; New calls it.
func (l *Limiter) observeConfig() {
	o := l.cfg.observer
	if o == nil {
		return
	}
	rules := make([]string, len(l.rules))
	for i := range l.rules {
		rules[i] = l.rules[i].Name
	}
	var timeout time.Duration
	if l.remote {
		timeout = l.cfg.timeout
	}
	oh := &observedHealth{}
	oh.l.Store(l)
	l.reports().observed = oh
	o.ObserveConfig(rules, timeout, oh.read)
}

// observedHealth is the observer's way to the limiter's [Health]: an
// exporter keeps the function for ever, so Close cuts it from the limiter
// (which becomes collectable with its store) and leaves the limiter's last
// report, with Status "closed", for the exporter to drop.
type observedHealth struct {
	l     atomic.Pointer[Limiter]
	final atomic.Pointer[Health]
}

func (o *observedHealth) read() Health {
	if l := o.l.Load(); l != nil {
		return l.Health()
	}
	return o.final.Load().clone()
}

// observeCall reports one backend call, or a cached answer, to obs.
func observeCall(obs Observer, latency time.Duration, out []backend.Result, err error) {
	if err == nil && len(out) > 0 && out[0].Cached {
		obs.ObserveCached()
		return
	}
	obs.ObserveBackend(latency, err)
}

// NopObserver ignores everything. Embed it in an [Observer] that cares about
// only some events.
type NopObserver struct{}

func (NopObserver) ObserveConfig([]string, time.Duration, func() Health) {}

func (NopObserver) ObserveDecision(string, Outcome) {}

func (NopObserver) ObserveBackend(time.Duration, error) {}

func (NopObserver) ObserveCached() {}

func (NopObserver) ObserveDegraded(DegradedEvent) {}

func (NopObserver) ObserveFailMode(string, FailMode) {}

func (NopObserver) ObserveRequest(context.Context, *Decision, error) {}

func (NopObserver) ObserveLimit(string, int64, int64) {}

// WithObserver reports the limiter's configuration, decisions, backend
// calls and degradation to o. Given more than once, every observer is told
// everything, in the order given.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("ceiling: WithObserver(nil)")
		}
		switch prev := c.observer.(type) {
		case nil:
			c.observer = o
		case observers:
			c.observer = append(prev[:len(prev):len(prev)], o)
		default:
			c.observer = observers{prev, o}
		}
		return nil
	}
}

// observers is the observer of a limiter given several: each is told
// everything, in order.
type observers []Observer

func (os observers) each(f func(Observer)) {
	for _, o := range os {
		f(o)
	}
}

func (os observers) ObserveConfig(rules []string, timeout time.Duration, health func() Health) {
	os.each(func(o Observer) { o.ObserveConfig(rules, timeout, health) })
}
func (os observers) ObserveDecision(rule string, outcome Outcome) {
	os.each(func(o Observer) { o.ObserveDecision(rule, outcome) })
}
func (os observers) ObserveBackend(latency time.Duration, err error) {
	os.each(func(o Observer) { o.ObserveBackend(latency, err) })
}
func (os observers) ObserveCached() { os.each(func(o Observer) { o.ObserveCached() }) }
func (os observers) ObserveDegraded(e DegradedEvent) {
	os.each(func(o Observer) { o.ObserveDegraded(e) })
}
func (os observers) ObserveFailMode(rule string, mode FailMode) {
	os.each(func(o Observer) { o.ObserveFailMode(rule, mode) })
}
func (os observers) ObserveRequest(ctx context.Context, d *Decision, err error) {
	os.each(func(o Observer) { o.ObserveRequest(ctx, d, err) })
}
func (os observers) ObserveLimit(rule string, limit, burst int64) {
	os.each(func(o Observer) { o.ObserveLimit(rule, limit, burst) })
}

// A DegradedEvent is one transition between healthy (the backend decides)
// and degraded (the circuit breaker is open and fail modes decide).
type DegradedEvent struct {
	// Degraded is true for healthy → degraded, false for the way back.
	Degraded bool
	// Cause is the failure that opened the breaker; nil on recovery.
	Cause error
	// At is when the transition happened.
	At time.Time
	// Failures is how many consecutive failures opened the breaker.
	Failures int
	// Duration is, on recovery, how long the limiter was degraded.
	Duration time.Duration
	// Unenforced is, on recovery, how many rule admissions were made
	// without the backend (failing open or local) while degraded.
	Unenforced int64
}

// WithShadowHeader makes responses name, in a RateLimit-Shadow header, the
// shadow rules that would have rejected the request (a Structured Field list
// of strings). Off by default: it tells clients about limits that are not
// enforced yet.
func WithShadowHeader() Option {
	return func(c *config) error {
		c.shadowHeader = true
		return nil
	}
}

const hShadow = "Ratelimit-Shadow"

// record reports a decided request: each rule's outcome, shadow
// rejections, and the admissions made without the backend. With no
// observer and nothing unusual it only reads the results.
func (l *Limiter) record(ctx context.Context, d *Decision) {
	obs := l.cfg.observer
	for i := range d.Results {
		rr := &d.Results[i]
		if rr.Fallback != inherit && d.Allowed && !rr.Rule.Shadow {
			l.countFallback(rr)
			if obs != nil {
				obs.ObserveFailMode(rr.Rule.Name, rr.Fallback)
			}
			continue // a fail mode's admission, not the rule's decision
		}
		if rr.Fallback == FailOpen {
			continue
		}
		outcome := OutcomeAllowed
		if !d.Allowed {
			outcome = OutcomeNotCharged
		}
		if !rr.Allowed {
			outcome = OutcomeRejected
			if rr.Rule.Shadow {
				outcome = OutcomeShadowRejected
				l.shadowRejected(ctx, rr)
			}
		}
		if obs != nil {
			obs.ObserveDecision(rr.Rule.Name, outcome)
		}
	}
	if obs != nil {
		obs.ObserveRequest(ctx, d, nil)
	}
}

// writeShadowHeader names, in RateLimit-Shadow, the shadow rules that would
// have rejected the request ([WithShadowHeader]).
func writeShadowHeader(h http.Header, d *Decision) {
	var b []byte
	for i := range d.Results {
		if rr := &d.Results[i]; rr.Rule.Shadow && !rr.Rule.Hidden && !rr.Allowed && rr.Fallback != FailOpen {
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = strconv.AppendQuote(b, rr.Rule.Name)
		}
	}
	if len(b) > 0 {
		h[hShadow] = []string{string(b)}
	}
}

// shadowRejected counts a shadow rule's would-be rejection and logs a
// sample of them.
func (l *Limiter) shadowRejected(ctx context.Context, rr *RuleResult) {
	if ok, n := l.countShadow(l.ruleIndex(rr.Rule)); ok {
		l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: shadow rule would have rejected requests",
			slog.String("rule", rr.Rule.Name), slog.Int64("requests", n), slog.Duration("retry_after", rr.RetryAfter))
	}
}

// ruleIndex finds a rule of the limiter by pointer; rules are few.
func (l *Limiter) ruleIndex(r *Rule) int {
	for i := range l.rules {
		if &l.rules[i] == r {
			return i
		}
	}
	panic("ceiling: a result names a rule of another limiter")
}

// counter is a monotonic count.
type counter = atomic.Int64

// sampler lets one log line through per interval and counts what it held
// back, so repeated events are loud without being noisy.
type sampler struct {
	every time.Duration
	next  atomic.Int64 // Unix ns before which lines are held back
	held  atomic.Int64 // events since the last line
}

// allow counts an event and reports whether to log it, with the number of
// events the line stands for.
func (s *sampler) allow(now time.Time) (bool, int64) {
	n := s.held.Add(1)
	t := now.UnixNano()
	next := s.next.Load()
	if t < next || !s.next.CompareAndSwap(next, t+int64(s.every)) {
		return false, 0
	}
	return true, max(n, s.held.Swap(0))
}

// log writes msg at level when the sampler lets it through.
func (s *sampler) log(lg *slog.Logger, now time.Time, level slog.Level, msg string, attrs ...slog.Attr) {
	if ok, n := s.allow(now); ok {
		lg.LogAttrs(context.Background(), level, msg, append(attrs, slog.Int64("occurrences", n))...)
	}
}

// Package ceilingotel reports what a ceiling limiter does through
// OpenTelemetry: it implements [ceiling.Observer] on the OpenTelemetry
// metric API, and records each decision on the request's current span.
//
//	obs, err := ceilingotel.New(ceilingotel.Options{})
//	limiter := ceiling.MustNew(rules, ceiling.WithObserver(obs), ...)
//
// The instruments follow the shape of ASP.NET Core's rate-limiting
// conventions under ceiling's own namespace: ceiling.rate_limiting.requests
// {request}, by ceiling.rate_limiting.rule and ceiling.rate_limiting.result;
// backend failures carry error.type; durations are in seconds. The
// OpenTelemetry Prometheus exporter (go.opentelemetry.io/otel/exporters/prometheus,
// default translation) turns them into exactly the series of package
// ceilingprom, labels included, so the alert rules and the dashboard that
// ship with metrics/prometheus work on either exporter. The README has the
// table.
//
// The package depends on the OpenTelemetry API only; the program chooses
// the SDK and the exporters.
package ceilingotel

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the instruments: the module's
// import path, as OpenTelemetry asks.
const ScopeName = "github.com/ceiling-go/ceiling/metrics/otel"

// Options configure an [Observer]. The zero value is ready to use.
type Options struct {
	// MeterProvider creates the instruments; nil means the global one
	// (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
	// Attributes are added to every measurement, for example
	// attribute.String("limiter", "api") when one process runs several
	// limiters (ceilingprom's ConstLabels). They must not carry a key
	// value, an address or a secret: every series repeats them.
	Attributes []attribute.KeyValue
	// Buckets are the backend latency histogram's bounds in seconds; nil
	// means DefaultBuckets. The highest must be at least the limiter's
	// timeout, or the alert that compares a latency quantile with the
	// timeout cannot fire. OpenTelemetry's default bounds are for
	// milliseconds, and would put every call in the first bucket.
	Buckets []float64
}

// DefaultBuckets are ceilingprom's: a backend round trip on a local
// network, the default 100ms timeout, and timeouts up to 10s.
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Observer records a limiter's events as OpenTelemetry metrics and its
// decisions on the requests' spans. Create it with [New]; it is safe for
// simultaneous use by multiple goroutines and may be shared by several
// limiters (their counts add up).
type Observer struct {
	ceiling.NopObserver

	requests    metric.Int64Counter
	duration    metric.Float64Histogram
	errors      metric.Int64Counter
	cached      metric.Int64Counter
	transitions metric.Int64Counter
	failmode    metric.Int64Counter

	attrs  []attribute.KeyValue // Options.Attributes
	plain  []metric.AddOption   // attrs alone
	record []metric.RecordOption
	kinds  map[ceiling.FailureKind][]metric.AddOption

	// rules holds each configured rule's measurement options, built once
	// so that a decision allocates nothing; replaced, never changed, when
	// a limiter adds rules.
	rules atomic.Pointer[map[string]*ruleOpts]

	// degraded counts the limiters observed that are degraded now: each
	// limiter's transitions alternate, so a shared observer's gauge stays
	// 1 until the last of them recovers.
	degraded atomic.Int64

	mu         sync.Mutex // guards the rest, and the replacement of rules
	minTimeout time.Duration
	health     []func() ceiling.Health
}

// ruleOpts are a rule's measurement options: by result (each
// [ceiling.Outcome], then resultFailClosed, resultShed, resultFailOpen
// and resultFailLocal), and by fail mode (open, local).
type ruleOpts struct {
	result [len(results)][]metric.AddOption
	mode   [2][]metric.AddOption
}

// The results of ceiling.rate_limiting.requests beyond a rule's
// [ceiling.Outcome]: a request refused with 503 because the rule fails
// closed and the backend could not decide, one shed with 503 because this
// process was too busy to ask the backend (whatever the fail modes), and
// the admissions the rule's fail mode made, open or local, which no
// backend counted.
const (
	resultFailClosed = int(ceiling.OutcomeNotCharged) + 1 + iota
	resultShed
	resultFailOpen
	resultFailLocal
)

// results are the values of AttrResult on the requests counter, by index:
// the outcomes', then resultFailClosed's, resultShed's, resultFailOpen's
// and resultFailLocal's.
var results = [...]string{
	ceiling.OutcomeAllowed:        ceiling.OutcomeAllowed.String(),
	ceiling.OutcomeRejected:       ceiling.OutcomeRejected.String(),
	ceiling.OutcomeShadowRejected: ceiling.OutcomeShadowRejected.String(),
	ceiling.OutcomeNotCharged:     ceiling.OutcomeNotCharged.String(),
	resultFailClosed:              "fail_closed",
	resultShed:                    "shed",
	resultFailOpen:                "fail_open",
	resultFailLocal:               "fail_local",
}

// AttrErrorType is OpenTelemetry's general attribute for the class of a
// failure: on the backend errors counter, [ceiling.KindOf]'s kind.
const AttrErrorType = attribute.Key("error.type")

var _ ceiling.Observer = (*Observer)(nil)

// New creates the instruments on the options' meter provider.
func New(o Options) (*Observer, error) {
	mp := o.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	buckets := o.Buckets
	if buckets == nil {
		buckets = DefaultBuckets
	}
	m := mp.Meter(ScopeName)
	obs := &Observer{attrs: slices.Clip(slices.Clone(o.Attributes))}
	set := attribute.NewSet(obs.attrs...)
	obs.plain = []metric.AddOption{metric.WithAttributeSet(set)}
	obs.record = []metric.RecordOption{metric.WithAttributeSet(set)}

	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	obs.requests = counter("ceiling.rate_limiting.requests", "{request}",
		"Requests each rule decided, by result: allowed (admitted and charged by the backend), rejected, shadow_rejected (a shadow rule that would have rejected), not_charged (the rule had room but another rule rejected the request), fail_open (admitted unlimited: the backend could not decide and the rule fails open), fail_local (admitted by this instance's own store: the rule fails local), fail_closed (refused with 503: the rule fails closed and the backend could not decide) or shed (refused with 503: this process was too busy to ask the backend; counted on the request's first enforced rule).")
	obs.errors = counter("ceiling.rate_limiting.backend.errors", "{call}",
		"Backend calls that failed, by kind (ceiling.KindOf): overloaded (never sent: this process was too busy, the request was shed with 503), unreachable, timeout, auth, read-only, out of memory or error.")
	obs.cached = counter("ceiling.rate_limiting.deny_cache.hits", "{request}",
		"Decisions answered in process by the backend's deny cache (keys known to be over their limit), without a backend call; not counted as backend calls.")
	obs.transitions = counter("ceiling.rate_limiting.degraded.transitions", "{transition}",
		"Transitions from healthy to degraded.")
	obs.failmode = counter("ceiling.rate_limiting.fail_mode.admissions", "{request}",
		"Rule admissions decided by a fail mode instead of the backend: open (not enforced) or local (enforced per instance).")
	var err error
	obs.duration, err = m.Float64Histogram("ceiling.rate_limiting.backend.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of backend decision calls, answered or failed; calls skipped by the open circuit breaker and deny-cache answers are not counted."),
		metric.WithExplicitBucketBoundaries(buckets...))
	errs = append(errs, err)
	degraded, err := m.Int64ObservableGauge("ceiling.rate_limiting.degraded",
		metric.WithDescription("1 while the backend is not called (circuit breaker open) and fail modes decide, else 0."))
	errs = append(errs, err)
	timeout, err := m.Float64ObservableGauge("ceiling.rate_limiting.backend.timeout", metric.WithUnit("s"),
		metric.WithDescription("The backend call timeout (ceiling.WithTimeout) of the limiters observed, the smallest if several; absent for in-process backends, which are never timed out."))
	errs = append(errs, err)
	evicted, err := m.Int64ObservableCounter("ceiling.rate_limiting.evicted_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys an in-process store (the memory backend, FailLocal's store) evicted while they held spent units, to stay under its key bound: each gave a caller quota back."))
	errs = append(errs, err)
	slots, err := m.Int64ObservableGauge("ceiling.rate_limiting.concurrency.slots_in_use", metric.WithUnit("{slot}"),
		metric.WithDescription("Units of a Concurrency rule's limit this process holds now, for requests it admitted that have not ended (ceiling.RuleHealth.SlotsInUse); 0 for rate rules."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	obs.kinds = map[ceiling.FailureKind][]metric.AddOption{}
	for _, kind := range ceiling.FailureKinds() {
		obs.kinds[kind] = obs.with(AttrErrorType.String(string(kind)))
	}
	empty := map[string]*ruleOpts{}
	obs.rules.Store(&empty)
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		obs.startAtZero(ctx)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if obs.minTimeout > 0 {
			o.ObserveFloat64(timeout, obs.minTimeout.Seconds(), metric.WithAttributeSet(set))
		}
		var n uint64
		var rules []string // in the order the limiters declare them
		inUse := map[string]int64{}
		live := obs.health[:0:0]
		for _, f := range obs.health {
			h := f()
			if h.Status == "closed" {
				// Dropped: the closed limiter holds nothing more, and,
				// closed degraded, will report no recovery.
				if !h.Since.IsZero() {
					obs.recovered()
				}
				continue
			}
			live = append(live, f)
			n += h.EvictedKeys
			for _, r := range h.Rules {
				if _, ok := inUse[r.Name]; !ok {
					rules = append(rules, r.Name)
				}
				inUse[r.Name] += r.SlotsInUse // limiters sharing a rule name add up
			}
		}
		obs.health = live
		o.ObserveInt64(degraded, min(obs.degraded.Load(), 1), metric.WithAttributeSet(set))
		o.ObserveInt64(evicted, int64(n), metric.WithAttributeSet(set))
		for _, r := range rules {
			o.ObserveInt64(slots, inUse[r], metric.WithAttributeSet(attribute.NewSet(append(slices.Clip(obs.attrs), AttrRule.String(r))...)))
		}
		return nil
	}, degraded, timeout, evicted, slots)
	if err != nil {
		return nil, err
	}

	obs.startAtZero(context.Background())
	return obs, nil
}

// startAtZero makes every series an alert watches exist, at zero, so that
// its first increase is one that increase() and rate() can see: the
// transitions, the deny-cache answers, the backend errors of each kind
// and the configured rules' fail-mode admissions. New calls it, and so
// does each collection, since measurements made on the global provider
// before the program installed its SDK went nowhere.
func (o *Observer) startAtZero(ctx context.Context) {
	o.transitions.Add(ctx, 0, o.plain...)
	o.cached.Add(ctx, 0, o.plain...)
	for _, kind := range ceiling.FailureKinds() {
		o.errors.Add(ctx, 0, o.kinds[kind]...)
	}
	for _, r := range *o.rules.Load() {
		for _, opts := range r.mode {
			o.failmode.Add(ctx, 0, opts...)
		}
	}
}

// with is the measurement options of the observer's attributes and kv.
func (o *Observer) with(kv ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(slices.Clip(o.attrs), kv...)...))}
}

// optsOf builds a rule's measurement options.
func (o *Observer) optsOf(rule string) *ruleOpts {
	r := &ruleOpts{}
	for i, result := range results {
		r.result[i] = o.with(AttrRule.String(rule), AttrResult.String(result))
	}
	for i, m := range []ceiling.FailMode{ceiling.FailOpen, ceiling.FailLocal} {
		r.mode[i] = o.with(AttrRule.String(rule), AttrFailMode.String(m.String()))
	}
	return r
}

// rule returns a rule's options: built once for a configured rule, and
// on each call for one no limiter told of.
func (o *Observer) rule(name string) *ruleOpts {
	if r, ok := (*o.rules.Load())[name]; ok {
		return r
	}
	return o.optsOf(name)
}

// ObserveConfig starts each rule's fail-mode counters at zero, and, for a
// limiter on a remote backend (timeout > 0), its fail_closed and shed
// results; it builds the rule's measurement options, and keeps the limiter's backend timeout and health
// (its evictions, its slots in use) for export. [ceiling.New] calls it.
func (o *Observer) ObserveConfig(rules []string, timeout time.Duration, health func() ceiling.Health) {
	o.mu.Lock()
	defer o.mu.Unlock()
	next := map[string]*ruleOpts{}
	for name, r := range *o.rules.Load() {
		next[name] = r
	}
	for _, name := range rules {
		r, ok := next[name]
		if !ok {
			r = o.optsOf(name)
			next[name] = r
		}
		for _, opts := range r.mode {
			o.failmode.Add(context.Background(), 0, opts...)
		}
		if timeout > 0 { // only a remote backend's limiter refuses with 503
			o.requests.Add(context.Background(), 0, r.result[resultFailClosed]...)
			o.requests.Add(context.Background(), 0, r.result[resultShed]...)
		}
	}
	o.rules.Store(&next)
	if health != nil {
		o.health = append(o.health, health)
	}
	if timeout > 0 && (o.minTimeout == 0 || timeout < o.minTimeout) {
		o.minTimeout = timeout
	}
}

// ObserveDecision counts one rule's decision.
func (o *Observer) ObserveDecision(rule string, outcome ceiling.Outcome) {
	var opts []metric.AddOption
	if int(outcome) < resultFailClosed {
		opts = o.rule(rule).result[outcome]
	} else {
		opts = o.with(AttrRule.String(rule), AttrResult.String(outcome.String()))
	}
	o.requests.Add(context.Background(), 1, opts...)
}

// ObserveBackend records a backend call's latency and, if it failed, its
// kind ([ceiling.KindOf]), which unlike the error's text names no
// address or key.
func (o *Observer) ObserveBackend(latency time.Duration, err error) {
	ctx := context.Background()
	if err != nil { // first, as in the Prometheus observer
		kind := ceiling.KindOf(err)
		opts, ok := o.kinds[kind]
		if !ok {
			opts = o.with(AttrErrorType.String(string(kind)))
		}
		o.errors.Add(ctx, 1, opts...)
	}
	o.duration.Record(ctx, latency.Seconds(), o.record...)
}

// ObserveCached counts a decision the deny cache answered.
func (o *Observer) ObserveCached() { o.cached.Add(context.Background(), 1, o.plain...) }

// ObserveDegraded sets the degraded gauge and counts transitions into it.
// Of limiters sharing the observer, the gauge is 1 while any is degraded.
func (o *Observer) ObserveDegraded(e ceiling.DegradedEvent) {
	if e.Degraded {
		o.degraded.Add(1)
		o.transitions.Add(context.Background(), 1, o.plain...)
		return
	}
	o.recovered()
}

// recovered takes one limiter out of the degraded count.
func (o *Observer) recovered() {
	for {
		n := o.degraded.Load()
		if n <= 0 || o.degraded.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// ObserveFailMode counts a rule admission made by a fail mode, and counts
// it as the rule's result fail_open or fail_local, never allowed: those
// admissions were not charged to the backend's count.
func (o *Observer) ObserveFailMode(rule string, mode ceiling.FailMode) {
	var opts, result []metric.AddOption
	switch r := o.rule(rule); mode {
	case ceiling.FailOpen:
		opts, result = r.mode[0], r.result[resultFailOpen]
	case ceiling.FailLocal:
		opts, result = r.mode[1], r.result[resultFailLocal]
	default:
		opts = o.with(AttrRule.String(rule), AttrFailMode.String(mode.String()))
		result = o.with(AttrRule.String(rule), AttrResult.String("fail_"+mode.String()))
	}
	o.failmode.Add(context.Background(), 1, opts...)
	o.requests.Add(context.Background(), 1, result...)
}

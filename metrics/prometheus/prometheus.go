// Package ceilingprom exposes what a ceiling limiter does as Prometheus
// metrics: it implements [ceiling.Observer] and [prometheus.Collector].
//
//	obs := ceilingprom.New(ceilingprom.Options{})
//	prometheus.MustRegister(obs)
//	limiter := ceiling.MustNew(rules, ceiling.WithObserver(obs), ...)
//
// The metrics (rule, result and fail_mode stand for the labels
// ceiling_rate_limiting_rule, ceiling_rate_limiting_result and
// ceiling_rate_limiting_fail_mode):
//
//	ceiling_rate_limiting_requests_total{rule, result="allowed|rejected|shadow_rejected|not_charged|fail_open|fail_local|fail_closed|shed"}
//	ceiling_rate_limiting_backend_duration_seconds      histogram of backend calls
//	ceiling_rate_limiting_backend_errors_total{error_type="overloaded|unreachable|timeout|auth|read-only|out of memory|error"}
//	ceiling_rate_limiting_backend_timeout_seconds       the limiter's backend timeout (remote backends)
//	ceiling_rate_limiting_deny_cache_hits_total         decisions the Redis deny cache answered in process
//	ceiling_rate_limiting_evicted_keys_total            keys an in-process store evicted holding spent units
//	ceiling_rate_limiting_concurrency_slots_in_use{rule} units of Concurrency rules held now
//	ceiling_rate_limiting_degraded                      1 while the breaker is open
//	ceiling_rate_limiting_degraded_transitions_total    healthy → degraded transitions
//	ceiling_rate_limiting_fail_mode_admissions_total{rule, fail_mode="open|local"}
//
// They are the names and labels that the OpenTelemetry Prometheus exporter
// gives package ceilingotel's instruments (ceiling.rate_limiting.requests
// by ceiling.rate_limiting.rule and ceiling.rate_limiting.result, and so
// on), so that one rule file and one dashboard serve either exporter.
//
// Alert on ceiling_rate_limiting_degraded == 1 and on any increase of
// ceiling_rate_limiting_fail_mode_admissions_total, both meaning limits are
// enforced less than configured, and on the fail_closed and shed results,
// 503s for callers within their limits. The module ships these alerts as a
// Prometheus rule file, alerts.yml, and a Grafana dashboard,
// dashboard.json; its README is their runbook.
package ceilingprom

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure an [Observer]. The zero value is ready to use.
type Options struct {
	// ConstLabels are added to every metric, for example
	// {"limiter": "api"} when one process runs several limiters.
	ConstLabels prometheus.Labels
	// Buckets are the backend latency histogram's bucket bounds in
	// seconds; nil means DefaultBuckets. The highest bound must be at least
	// the limiter's timeout: the latency alert compares a quantile with 80%
	// of the timeout, and a quantile never exceeds the highest bound.
	Buckets []float64
}

// DefaultBuckets frame a backend round trip on a local network, the
// default 100ms timeout, and timeouts up to 10s.
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Observer records a limiter's events as Prometheus metrics. Create it with
// [New]; it is safe for simultaneous use by multiple goroutines and may be
// shared by several limiters (their counts add up).
type Observer struct {
	ceiling.NopObserver // what it does not count (ObserveLimit)

	requests    *prometheus.CounterVec
	duration    prometheus.Histogram
	errors      *prometheus.CounterVec
	degraded    prometheus.Gauge
	transitions prometheus.Counter
	failmode    *prometheus.CounterVec
	// timeout has no labels but is a vector so that it exports nothing
	// until a limiter with a remote backend tells its timeout: a zero
	// would put every in-process limiter's latency "near the timeout".
	timeout *prometheus.GaugeVec
	cached  prometheus.Counter

	// evicted and slots read the limiters' health at collection (the
	// function ObserveConfig is given).
	evicted *prometheus.Desc
	slots   *prometheus.Desc

	mu         sync.Mutex
	nDegraded  int // the limiters observed that are degraded now
	minTimeout time.Duration
	health     []*func() ceiling.Health // by pointer, to drop one a collection found closed
}

// The labels: ceilingotel's attributes as the OpenTelemetry Prometheus
// exporter names them (dots become underscores).
const (
	labelRule      = "ceiling_rate_limiting_rule"
	labelResult    = "ceiling_rate_limiting_result"
	labelFailMode  = "ceiling_rate_limiting_fail_mode"
	labelErrorType = "error_type"
)

var (
	_ ceiling.Observer     = (*Observer)(nil)
	_ prometheus.Collector = (*Observer)(nil)
)

// New returns an Observer; register it with a prometheus.Registerer.
func New(o Options) *Observer {
	const ns = "ceiling_rate_limiting"
	buckets := o.Buckets
	if buckets == nil {
		buckets = DefaultBuckets
	}
	obs := &Observer{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "requests_total", ConstLabels: o.ConstLabels,
			Help: "Requests each rule decided, by result: allowed (admitted and charged by the backend), rejected, shadow_rejected (a shadow rule that would have rejected), not_charged (the rule had room but another rule rejected the request), fail_open (admitted unlimited: the backend could not decide and the rule fails open), fail_local (admitted by this instance's own store: the rule fails local), fail_closed (refused with 503: the rule fails closed and the backend could not decide) or shed (refused with 503: this process was too busy to ask the backend; counted on the request's first enforced rule).",
		}, []string{labelRule, labelResult}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "backend_duration_seconds", ConstLabels: o.ConstLabels, Buckets: buckets,
			Help: "Latency of backend decision calls, answered or failed; calls skipped by the open circuit breaker and deny-cache answers are not counted.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "backend_errors_total", ConstLabels: o.ConstLabels,
			Help: "Backend calls that failed, by kind (ceiling.KindOf): overloaded (never sent: this process was too busy, the request was shed with 503), unreachable, timeout, auth, read-only, out of memory or error.",
		}, []string{labelErrorType}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "degraded", ConstLabels: o.ConstLabels,
			Help: "1 while the backend is not called (circuit breaker open) and fail modes decide, else 0.",
		}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "degraded_transitions_total", ConstLabels: o.ConstLabels,
			Help: "Transitions from healthy to degraded.",
		}),
		failmode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "fail_mode_admissions_total", ConstLabels: o.ConstLabels,
			Help: "Rule admissions decided by a fail mode instead of the backend: open (not enforced) or local (enforced per instance).",
		}, []string{labelRule, labelFailMode}),
		timeout: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "backend_timeout_seconds", ConstLabels: o.ConstLabels,
			Help: "The backend call timeout (ceiling.WithTimeout) of the limiters observed, the smallest if several; absent for in-process backends, which are never timed out.",
		}, nil),
		cached: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "deny_cache_hits_total", ConstLabels: o.ConstLabels,
			Help: "Decisions answered in process by the backend's deny cache (keys known to be over their limit), without a backend call; not counted as backend calls.",
		}),
		evicted: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "evicted_keys_total"),
			"Keys an in-process store (the memory backend, FailLocal's store) evicted while they held spent units, to stay under its key bound: each gave a caller quota back.",
			nil, o.ConstLabels),
		slots: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "concurrency_slots_in_use"),
			"Units of a Concurrency rule's limit this process holds now, for requests it admitted that have not ended (ceiling.RuleHealth.SlotsInUse); 0 for rate rules.",
			[]string{labelRule}, o.ConstLabels),
	}
	// Every series an alert watches exists from the start, at zero, so
	// that its first increase is one that increase() and rate() can see.
	for _, kind := range ceiling.FailureKinds() {
		obs.errors.WithLabelValues(string(kind))
	}
	return obs
}

// ObserveConfig starts each rule's fail-mode counters at zero, and, for a
// limiter on a remote backend (timeout > 0), the only kind that can refuse
// with 503, its fail_closed and shed results; it exports the limiter's
// backend timeout, and health is read at each collection. [ceiling.New]
// calls it.
func (o *Observer) ObserveConfig(rules []string, timeout time.Duration, health func() ceiling.Health) {
	for _, rule := range rules {
		for _, mode := range []ceiling.FailMode{ceiling.FailOpen, ceiling.FailLocal} {
			o.failmode.WithLabelValues(rule, mode.String())
		}
		if timeout > 0 {
			o.requests.WithLabelValues(rule, "fail_closed")
			o.requests.WithLabelValues(rule, "shed")
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if health != nil {
		o.health = append(o.health, &health)
	}
	if timeout <= 0 {
		return
	}
	if o.minTimeout == 0 || timeout < o.minTimeout {
		o.minTimeout = timeout
		o.timeout.WithLabelValues().Set(timeout.Seconds())
	}
}

// ObserveDecision counts one rule's decision.
func (o *Observer) ObserveDecision(rule string, outcome ceiling.Outcome) {
	o.requests.WithLabelValues(rule, outcome.String()).Inc()
}

// ObserveRequest counts a request refused with 503, which no rule's
// decision reports: err is an [*ceiling.UnavailableError], counted on its
// rule as fail_closed (the rule fails closed and the backend could not
// decide) or shed ([ceiling.UnavailableError.Shed]: this process could not
// get the backend's verdict in time). Any other request was counted by
// ObserveDecision.
func (o *Observer) ObserveRequest(_ context.Context, _ *ceiling.Decision, err error) {
	var ue *ceiling.UnavailableError
	if err == nil || !errors.As(err, &ue) {
		return
	}
	result := "fail_closed"
	if ue.Shed {
		result = "shed"
	}
	o.requests.WithLabelValues(ue.Rule, result).Inc()
}

// ObserveBackend records a backend call's latency and, if it failed, its
// error's kind ([ceiling.KindOf]): a refused connection, a timeout, a
// refused password, a read-only replica, a full server or another error
// call for different fixes, and the kind, unlike the error's text, names
// no address or key. The error is counted first, so that a scrape that
// sees the call in the histogram sees its error too.
func (o *Observer) ObserveBackend(latency time.Duration, err error) {
	if err != nil {
		o.errors.WithLabelValues(string(ceiling.KindOf(err))).Inc()
	}
	o.duration.Observe(latency.Seconds())
}

// ObserveCached counts a decision the deny cache answered.
func (o *Observer) ObserveCached() { o.cached.Inc() }

// ObserveDegraded sets the degraded gauge and counts transitions into it.
// Of limiters sharing the observer, the gauge is 1 while any is degraded:
// each limiter's transitions alternate, so counting them tells how many
// are degraded now.
func (o *Observer) ObserveDegraded(e ceiling.DegradedEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.Degraded {
		o.nDegraded++
		o.transitions.Inc()
	} else if o.nDegraded > 0 {
		o.nDegraded--
	}
	if o.nDegraded > 0 {
		o.degraded.Set(1)
	} else {
		o.degraded.Set(0)
	}
}

// ObserveFailMode counts a rule admission made by a fail mode, and counts
// it as the rule's result fail_open or fail_local, never allowed: those
// admissions were not charged to the backend's count.
func (o *Observer) ObserveFailMode(rule string, mode ceiling.FailMode) {
	o.failmode.WithLabelValues(rule, mode.String()).Inc()
	o.requests.WithLabelValues(rule, "fail_"+mode.String()).Inc()
}

// release drops the health function of a closed limiter, which then holds
// nothing of it, and the limiter's part of the degraded gauge if it was
// degraded when closed (it will not report a recovery).
func (o *Observer) release(f *func() ceiling.Health, degraded bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := slices.Index(o.health, f)
	if i < 0 {
		return // a simultaneous collection released it
	}
	// A new array: a collection may be reading the old one.
	o.health = append(slices.Clip(o.health[:i]), o.health[i+1:]...)
	if degraded && o.nDegraded > 0 {
		o.nDegraded--
		if o.nDegraded == 0 {
			o.degraded.Set(0)
		}
	}
}

// Describe sends the metrics' descriptions.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	o.requests.Describe(ch)
	o.duration.Describe(ch)
	o.errors.Describe(ch)
	o.degraded.Describe(ch)
	o.transitions.Describe(ch)
	o.failmode.Describe(ch)
	o.timeout.Describe(ch)
	o.cached.Describe(ch)
	ch <- o.evicted
	ch <- o.slots
}

// Collect sends the metrics' current values.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	o.requests.Collect(ch)
	o.duration.Collect(ch)
	o.errors.Collect(ch)
	o.transitions.Collect(ch)
	o.failmode.Collect(ch)
	o.timeout.Collect(ch)
	o.cached.Collect(ch)
	o.mu.Lock()
	health := o.health[:len(o.health):len(o.health)]
	o.mu.Unlock()
	var n uint64
	var rules []string // in the order the limiters declare them
	slots := map[string]int64{}
	for _, f := range health {
		h := (*f)()
		if h.Status == "closed" {
			o.release(f, !h.Since.IsZero())
			continue
		}
		n += h.EvictedKeys
		for _, r := range h.Rules {
			if _, ok := slots[r.Name]; !ok {
				rules = append(rules, r.Name)
			}
			slots[r.Name] += r.SlotsInUse // limiters sharing a rule name add up
		}
	}
	o.degraded.Collect(ch) // after release: a limiter closed degraded no longer holds it
	ch <- prometheus.MustNewConstMetric(o.evicted, prometheus.CounterValue, float64(n))
	for _, r := range rules {
		ch <- prometheus.MustNewConstMetric(o.slots, prometheus.GaugeValue, float64(slots[r]), r)
	}
}

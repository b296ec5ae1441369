package ceiling

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// plan is the limit and burst a rule enforces now: the rule's own until
// [Limiter.SetLimit] replaces it. A request reads it once, when it is
// added to a decision, so it sees one plan, old or new, never half of each.
type plan struct {
	limit, burst int64
	policy       []string // RateLimit-Policy under every rule's current plan
	rules        []Rule   // the rules under their current plans, for Rules
	// changed is closed by the next SetLimit (of any rule): a [Limiter.Wait]
	// sleeping on a RetryAfter of the old limits wakes to decide again.
	changed chan struct{}
}

// SetLimit replaces rule's Limit and Burst (zero: Limit, as in [Rule]) for
// the requests decided from now on, each under the old plan or the new one,
// whole; invalid values change nothing. Stored units keep their meaning
// (backend/ALGORITHMS.md, "A limit that changes"): after lowering, a key
// over the new limit admits nothing until enough units leave. The change is
// logged, shown in [Limiter.Health] and told to [Observer.ObserveLimit].
func (l *Limiter) SetLimit(rule string, limit, burst int64) error {
	r, err := l.rule(rule)
	if err != nil {
		return err
	}
	next := *r
	next.Limit, next.Burst = limit, burst
	if next.Estimate != nil {
		// New's validate defaulted the stored rule's Cost to 1, which
		// validate refuses beside an Estimate: judge the rule as declared.
		next.Cost = 0
	}
	if err := next.validate(); err != nil {
		return err
	}
	i := l.ruleIndex(r)
	l.planMu.Lock()
	old := l.plans[i].Load()
	rules := append([]Rule(nil), old.rules...)
	rules[i].Limit, rules[i].Burst = limit, burst
	policy := requestPolicy(rules, &Decision{})
	changed := make(chan struct{})
	for j := range l.plans {
		p := *l.plans[j].Load()
		p.policy, p.rules, p.changed = policy, rules, changed
		if j == i {
			p.limit, p.burst = limit, burst
		}
		l.plans[j].Store(&p)
	}
	close(old.changed)
	l.planMu.Unlock()
	l.cfg.logger.LogAttrs(context.Background(), slog.LevelInfo, "ceiling: a rule's limit changed",
		slog.String("rule", rule), slog.Int64("limit", limit), slog.Int64("burst", burst),
		slog.Int64("previous_limit", old.limit), slog.Int64("previous_burst", old.burst))
	if o := l.cfg.observer; o != nil {
		o.ObserveLimit(rule, limit, burst)
	}
	return nil
}

// initPlans gives every rule its own limit as its plan; New calls it.
func (l *Limiter) initPlans() {
	l.plans = make([]atomic.Pointer[plan], len(l.rules))
	rules := append([]Rule(nil), l.rules...)
	policy := requestPolicy(rules, &Decision{})
	changed := make(chan struct{})
	for i := range l.rules {
		l.plans[i].Store(&plan{limit: l.rules[i].Limit, burst: l.rules[i].Burst, policy: policy, rules: rules, changed: changed})
		l.rules[i].plan = &l.plans[i]
	}
}

// planOf returns rule's current plan.
func planOf(rule *Rule) *plan { return rule.plan.Load() }

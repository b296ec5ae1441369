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
}

// SetLimit replaces rule's Limit and Burst (zero: Limit, as in [Rule]) for
// the requests decided from now on, while requests are in flight: each
// request is decided under the old limit or the new one, whole. The new
// values are validated as [New] validates a rule, with the same errors; on
// an error nothing changes.
//
// What the keys' stored units mean under the new limit is defined by the
// algorithm (backend/ALGORITHMS.md, "A limit that changes"): raising takes
// effect at once; after lowering, a key already holding more than the new
// limit admits nothing until enough of its units leave. A rule with
// [Rule.Limits] keeps taking a request's limit from it; SetLimit changes
// the limit of requests it gives none. The change lasts until the next
// SetLimit or the end of the process: read the limit from configuration
// at start-up too (the example reloads a file on SIGHUP).
//
// The change is logged, shown in [Limiter.Health] (RuleHealth.Limit), and
// told to the observer ([Observer.ObserveLimit]).
func (l *Limiter) SetLimit(rule string, limit, burst int64) error {
	r, err := l.rule(rule)
	if err != nil {
		return err
	}
	next := *r
	next.Limit, next.Burst = limit, burst
	if err := next.validate(); err != nil {
		return err
	}
	i := l.ruleIndex(r)
	l.planMu.Lock()
	old := l.plans[i].Load()
	rules := append([]Rule(nil), old.rules...)
	rules[i].Limit, rules[i].Burst = limit, burst
	policy := policyHeader(rules)
	for j := range l.plans {
		p := *l.plans[j].Load()
		p.policy, p.rules = policy, rules
		if j == i {
			p.limit, p.burst = limit, burst
		}
		l.plans[j].Store(&p)
	}
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
	policy := policyHeader(rules)
	for i := range l.rules {
		l.plans[i].Store(&plan{limit: l.rules[i].Limit, burst: l.rules[i].Burst, policy: policy, rules: rules})
		l.rules[i].plan = &l.plans[i]
	}
}

// planOf returns rule's current plan.
func planOf(rule *Rule) *plan { return rule.plan.Load() }

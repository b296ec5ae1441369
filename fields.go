package ceiling

import "slices"

// RateLimit returns the IETF RateLimit field for d exactly as
// [Limiter.Handler] sends it with [HeadersIETF] ("" when not sent), for
// adapters of other protocols: package ceilinggrpc sends it as metadata.
func (d *Decision) RateLimit() string {
	return string(appendRateLimit(nil, d))
}

// RateLimitPolicy returns the IETF RateLimit-Policy field for d, a
// decision of l, exactly as [Limiter.Handler] sends it, with the limits
// that applied to d ("" when not sent; a nil d lists the rules' own).
// Given rules, it lists only those, for a front that decides only them.
func (l *Limiter) RateLimitPolicy(d *Decision, rules ...string) string {
	pl := l.plans[0].Load()
	if len(rules) == 0 && (!l.dynamic || d == nil) {
		if pl.policy == nil {
			return ""
		}
		return pl.policy[0]
	}
	if d == nil {
		d = &Decision{}
	}
	var only func(*Rule) bool
	if len(rules) > 0 {
		only = func(r *Rule) bool { return slices.Contains(rules, r.Name) }
	}
	return string(appendRequestPolicy(nil, pl.rules, d, only))
}

package ceiling

import "slices"

// RateLimit returns the value of the IETF RateLimit field for d, exactly as
// [Limiter.Handler] sends it with [HeadersIETF]: the state of each rule of
// d that is advertised (neither Shadow nor Hidden, and decided by the
// backend or FailLocal's store), only the rejecting ones when d is a
// rejection. Empty means the field is not sent. With
// [Limiter.RateLimitPolicy] it is for adapters of other protocols:
// package ceilinggrpc sends both as response metadata.
func (d *Decision) RateLimit() string {
	return string(appendRateLimit(nil, d))
}

// RateLimitPolicy returns the value of the IETF RateLimit-Policy field for
// d, a decision of l, exactly as [Limiter.Handler] sends it with
// [HeadersIETF]: each of l's rules that is neither Shadow nor Hidden, with
// the limit that applied to d where the rule applied ([Rule.Limits],
// [Input.Limit]) and its own elsewhere. A nil d lists every rule's own
// limit. Empty means the field is not sent.
//
// With rules, it lists only the rules named (in declaration order), for a
// front that decides only those: a gRPC service advertises the rules
// bound to its calls, not those of the HTTP front sharing the limiter.
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

package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// LimitError is the error of a request whose limit for a rule could not be
// had: [Rule.Limits] failed, a limit or burst was out of range, or the
// backend refused the call as invalid ([backend.ErrInvalidRequest]). It is
// the server's fault, not the client's: the middleware answers 500 naming
// the rule (never the error's text) and logs it. Nothing is consumed, and
// the backend's health is not touched.
type LimitError struct {
	// Rule names the rule whose limit failed.
	Rule string
	// Limit and Burst are the values refused; both zero when the Limits
	// function itself failed.
	Limit, Burst int64
	// Err is why: the Limits function's error, or the validation error
	// (wrapping [backend.ErrInvalidRequest]).
	Err error
}

// Error names the rule and the cause.
func (e *LimitError) Error() string {
	if e.Limit == 0 && e.Burst == 0 {
		return fmt.Sprintf("ceiling: rule %q: no limit for this request: %v", e.Rule, e.Err)
	}
	return fmt.Sprintf("ceiling: rule %q: limit for this call (limit %d, burst %d): %v", e.Rule, e.Limit, e.Burst, e.Err)
}

// Unwrap returns the cause.
func (e *LimitError) Unwrap() error { return e.Err }

// slidingLogBound refuses a sliding log past [MaxSlidingLogLimit], whether
// a rule or a request sets the limit: a key costs its log's size whoever
// set it.
func slidingLogBound(a backend.Algorithm, limit int64) error {
	if a != SlidingLog || limit <= MaxSlidingLogLimit {
		return nil
	}
	return fmt.Errorf("%w: a sliding log of %d keeps up to %d records, about %d KB per key on Redis; "+
		"keep it at most %d, or use RollingWindow (the default: never more than Limit in any rolling Period, in 19 integers per key)",
		backend.ErrInvalidRequest, limit, limit, limit*40/1000, MaxSlidingLogLimit)
}

// requestPolicy is RateLimit-Policy with the limits that applied to d: for
// a zero Decision the rules' own, which a plan computes once for limiters
// without a Limits function. Shadow and Hidden rules are not advertised.
// The value has capacity 1, so a handler that appends gets its own array.
func requestPolicy(rules []Rule, d *Decision) []string {
	b := appendRequestPolicy(nil, rules, d, nil)
	if len(b) == 0 {
		return nil
	}
	return []string{string(b)}
}

// appendRequestPolicy appends to b the RateLimit-Policy items of the rules
// that only accepts (every rule when nil), with the limits that applied
// to d.
func appendRequestPolicy(b []byte, rules []Rule, d *Decision, only func(*Rule) bool) []byte {
	j := 0 // d's results are in declaration order: walk them alongside
	for i := range rules {
		r := &rules[i]
		limit := r.Limit
		if j < len(d.Results) && d.Results[j].Rule.Name == r.Name { // rules may be a copy under new limits
			limit = d.Results[j].limit
			j++
		}
		if !r.Shadow && !r.Hidden && (only == nil || only(r)) {
			b = appendPolicy(b, r, limit)
		}
	}
	return b
}

// limitFailed logs a request refused for want of a limit, once a minute per
// rule with the number of such requests: a broken plan lookup fails every
// request of its tenants.
func (l *Limiter) limitFailed(ctx context.Context, e *LimitError, attrs ...slog.Attr) {
	rule, err := l.rule(e.Rule)
	if err != nil {
		return
	}
	if ok, n := l.limitLogAllow(l.ruleIndex(rule)); ok {
		attrs = append(attrs, slog.String("rule", e.Rule), slog.Any("err", e.Err), slog.Int64("occurrences", n))
		l.cfg.logger.LogAttrs(ctx, slog.LevelError, "ceiling: a rule has no valid limit for a request; such requests are refused as a server error", attrs...)
	}
}

// writeLimitError answers a request whose limit could not be had: the
// server's fault, so 500, naming the rule but not the cause, which may
// hold a tenant's configuration.
func writeLimitError(w http.ResponseWriter, e *LimitError) {
	writeProblem(w, &Problem{
		Type:   "about:blank",
		Title:  "Internal Server Error",
		Status: http.StatusInternalServerError,
		Detail: fmt.Sprintf("no valid rate limit for this request under rule %q; the operator has been told", e.Rule),
	})
}

// limitLogEvery spaces the log lines of requests refused for want of a
// limit.
const limitLogEvery = time.Minute

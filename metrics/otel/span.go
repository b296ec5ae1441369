package ceilingotel

import (
	"context"
	"errors"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The span attributes a decision sets, under ceiling's own namespace in
// the shape of ASP.NET Core's rate-limiting conventions (OpenTelemetry has
// none of its own for rate limiting yet).
const (
	// AttrRule is the rule that decided: on a rejection the first
	// rejecting rule in declaration order (the one the 429 names), on a
	// 503 the first rule failing closed (or a shed request's first
	// enforced rule), on an admission the rule with
	// the fewest units remaining, the nearest to refusing. Absent when no
	// rule counted the request (every rule failed open).
	AttrRule = attribute.Key("ceiling.rate_limiting.rule")
	// AttrResult is, on a span, the request's result, in the words the
	// requests counter uses for a rule's: "allowed", "rejected" (429),
	// "fail_closed" (503: a rule fails closed and the backend could not
	// decide) or "shed" (503: this process was too busy to ask the
	// backend).
	AttrResult = attribute.Key("ceiling.rate_limiting.result")
	// AttrFailMode is set when a fail mode decided instead of the
	// backend: "open", "local" or "closed".
	AttrFailMode = attribute.Key("ceiling.rate_limiting.fail_mode")
	// AttrRetryAfter is, on a refusal, the Retry-After sent: whole
	// seconds, rounded up. Absent when the request can never fit.
	AttrRetryAfter = attribute.Key("ceiling.rate_limiting.retry_after")
)

// ObserveRequest counts a request refused with 503 (err is an
// [*ceiling.UnavailableError]: a rule failing closed, or a shed request),
// which no rule's decision reports, and records the decided request on the
// span of ctx, the request's span that otelhttp, otelgrpc or the framework
// started: ceiling starts no span of its own for a decision, which is a
// moment in the request, not an operation. When err is nil and ctx has no
// recording span it does nothing and allocates nothing.
func (o *Observer) ObserveRequest(ctx context.Context, d *ceiling.Decision, err error) {
	if err != nil {
		if rule, i, ok := refusal(err); ok {
			o.requests.Add(context.Background(), 1, o.rule(rule).result[i]...)
		}
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	recordSpan(span, d, err)
}

// recordSpan sets a decision's attributes on a recording span.
func recordSpan(span trace.Span, d *ceiling.Decision, err error) {
	var kv [4]attribute.KeyValue
	n := 0
	var ue *ceiling.UnavailableError
	switch {
	case errors.As(err, &ue):
		kv[0], kv[1] = AttrRule.String(ue.Rule), AttrResult.String(results[resultFailClosed])
		n = 2
		if ue.Shed {
			// No fail mode decided: the process was too busy to ask.
			kv[1] = AttrResult.String(results[resultShed])
		} else {
			kv[n] = AttrFailMode.String(ceiling.FailClosed.String())
			n++
		}
		if s, ok := retrySeconds(ue.RetryAfter); ok {
			kv[n] = AttrRetryAfter.Int64(s)
			n++
		}
	case err != nil || d == nil:
		return // not a decision: a bad input or limit, answered 400 or 500
	case !d.Allowed:
		kv[1] = AttrResult.String(results[ceiling.OutcomeRejected])
		n = 2
		rr, retry := refused(d)
		if rr != nil {
			kv[0] = AttrRule.String(rr.Rule.Name)
			if rr.Fallback != 0 {
				kv[n] = AttrFailMode.String(rr.Fallback.String())
				n++
			}
		}
		if s, ok := retrySeconds(retry); ok {
			kv[n] = AttrRetryAfter.Int64(s)
			n++
		}
	default:
		kv[1] = AttrResult.String(results[ceiling.OutcomeAllowed])
		n = 2
		rr := nearest(d)
		if rr != nil {
			kv[0] = AttrRule.String(rr.Rule.Name)
		}
		if m := fallback(d); m != 0 {
			// Admitted by a fail mode, not the backend: the counter's
			// words, fail_open or fail_local.
			kv[1] = AttrResult.String(results[resultFailOpen])
			if m == ceiling.FailLocal {
				kv[1] = AttrResult.String(results[resultFailLocal])
			}
			kv[n] = AttrFailMode.String(m.String())
			n++
		}
	}
	if kv[0].Key == "" { // no rule to name: keep the others
		copy(kv[:], kv[1:n])
		n--
	}
	span.SetAttributes(kv[:n]...)
}

// refusal is the rule and the requests counter's result (resultFailClosed
// or resultShed) of a request refused with 503; false for any other error
// (a bad input or limit, answered 400 or 500: not a decision).
func refusal(err error) (string, int, bool) {
	var ue *ceiling.UnavailableError
	if !errors.As(err, &ue) {
		return "", 0, false
	}
	if ue.Shed {
		return ue.Rule, resultShed, true
	}
	return ue.Rule, resultFailClosed, true
}

// refused is what the 429 says of a rejection: the first rejecting rule
// it names and the Retry-After it sends, the longest wait of the rules it
// names. Like the response, it leaves a Hidden rule out when a listed rule
// rejects too (see [ceiling.Rule.Hidden]).
func refused(d *ceiling.Decision) (*ceiling.RuleResult, time.Duration) {
	hideHidden := false
	for i := range d.Results {
		if rr := &d.Results[i]; !rr.Allowed && !rr.Rule.Shadow && !rr.Rule.Hidden {
			hideHidden = true
			break
		}
	}
	var first *ceiling.RuleResult
	var retry time.Duration
	for i := range d.Results {
		rr := &d.Results[i]
		if rr.Allowed || rr.Rule.Shadow || hideHidden && rr.Rule.Hidden {
			continue
		}
		if first == nil {
			first = rr
		}
		if rr.RetryAfter == backend.Never || retry == backend.Never {
			retry = backend.Never
		} else {
			retry = max(retry, rr.RetryAfter)
		}
	}
	return first, retry
}

// nearest is the admitting rule with the fewest units remaining, the
// first such in declaration order, among those that counted the request:
// not shadow rules, nor rules admitted failing open. nil when none did.
func nearest(d *ceiling.Decision) *ceiling.RuleResult {
	var best *ceiling.RuleResult
	for i := range d.Results {
		rr := &d.Results[i]
		if rr.Rule.Shadow || rr.Fallback == ceiling.FailOpen {
			continue
		}
		if best == nil || rr.Remaining < best.Remaining {
			best = rr
		}
	}
	return best
}

// fallback is the fail mode that decided an admitted request: local when
// an enforced rule was decided by the in-process store, else open when one
// was admitted unenforced, else none. Shadow rules enforce nothing.
func fallback(d *ceiling.Decision) ceiling.FailMode {
	var m ceiling.FailMode
	for i := range d.Results {
		if d.Results[i].Rule.Shadow {
			continue
		}
		switch d.Results[i].Fallback {
		case ceiling.FailLocal:
			return ceiling.FailLocal
		case ceiling.FailOpen:
			m = ceiling.FailOpen
		}
	}
	return m
}

// retrySeconds is a wait as Retry-After says it, and false for a request
// that can never fit.
func retrySeconds(d time.Duration) (int64, bool) {
	if d == backend.Never {
		return 0, false
	}
	if d <= 0 {
		return 0, true
	}
	return int64((d + time.Second - 1) / time.Second), true
}

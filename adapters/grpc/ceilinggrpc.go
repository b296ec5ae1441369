// Package ceilinggrpc limits gRPC servers with a [ceiling.Limiter]: unary
// and stream server interceptors, and the Limiter of go-grpc-middleware's
// ratelimit package, all thin users of [ceiling.Limiter.Decide]. A call is
// decided like an HTTP request: one backend call for every rule that
// applies, all or nothing, with the limiter's fail modes, circuit breaker,
// observer and metrics.
//
// Every call that the limiter decides carries its rate-limit state in its
// response header metadata, as the IETF fields an HTTP response carries:
// "ratelimit-policy" and "ratelimit", with the same values (see
// [ceiling.Limiter.RateLimitPolicy] and [ceiling.Decision.RateLimit]), on
// admitted and refused calls alike. The policy lists the rules bound to
// gRPC calls; a refusal's "ratelimit" only the refusing rules, and a Hidden
// rule is in neither.
//
// A call that a rule refuses gets codes.ResourceExhausted, with the time
// after which every refusing rule would admit it in an
// [errdetails.RetryInfo] and the rules in an [errdetails.QuotaFailure]. A
// call refused because the backend cannot decide and a rule fails closed
// gets codes.Unavailable, with a RetryInfo too. A key function's complaint
// is codes.InvalidArgument; a limit that cannot be had (see [Rule.Limits])
// is codes.Internal, and logged.
//
// Rules are the limiter's, bound to gRPC keys by name ([Rule]): key
// functions read the call's metadata ([Metadata]), its peer address
// ([PeerAddr], [ClientIP], which trust no metadata unless told to), or its
// method ([FullMethod], [ForMethods]), and [FromHTTP] reuses ceiling's HTTP
// key functions (verified JWTs from the "authorization" entry).
package ceilinggrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A Rule says how gRPC calls are keyed under one of the limiter's rules,
// whose limit, period, algorithm and fail mode apply. The limiter's rules
// that no Rule names are not applied to gRPC calls, so one limiter can
// serve HTTP and gRPC with rules of each, sharing budgets where a rule is
// bound to both.
type Rule struct {
	// Name is the limiter's rule. Required.
	Name string
	// Key is what the rule limits by for a call. Required.
	Key KeyFunc
	// Cost, when set, returns the units a call takes; nil, zero and
	// [ceiling.ErrNoKey] (a call that names no cost) mean the limiter
	// rule's Cost, 1 unless it says otherwise. A call without a cost pays
	// the default, never nothing: only Key leaves the rule out of a call.
	// Any other error, or a negative cost, refuses the call as
	// codes.InvalidArgument.
	Cost func(ctx context.Context, method string) (int64, error)
	// Limits, when set, gives the limit and burst that apply to a call (a
	// limit per plan or tenant), as [ceiling.Rule.Limits] does for HTTP: a
	// zero means the rule's own, and so does [ceiling.ErrNoKey] (a call
	// without a plan): what the lookup does not know is limited as the rule
	// says, never unlimited. To leave the rule out for some calls (an
	// unlimited plan), say so in its Key. Any other error, or a value out
	// of range, refuses the call as codes.Internal, logged once a minute
	// per rule.
	Limits func(ctx context.Context, method string) (limit, burst int64, err error)
}

// Limiter decides gRPC calls with a [ceiling.Limiter]. Create one with
// [New]; it is safe for simultaneous use by multiple goroutines. It
// implements go-grpc-middleware's ratelimit.Limiter.
type Limiter struct {
	l      *ceiling.Limiter
	rules  []Rule
	logger *slog.Logger
	logged []atomic.Int64 // per rule: when a limit error was last logged (Unix ns)
	// concurrent names the first bound [ceiling.Concurrency] rule, whose
	// slots an admitted call holds until its handler returns ("" if none):
	// Limit refuses to serve it.
	concurrent    string
	limitRefusals atomic.Bool // Limit's refusal of concurrent has been logged
	names         []string    // the bound rules, which the policy lists
	policy        string      // "ratelimit-policy" when no bound rule has Limits
	dynamic       bool        // a bound rule has Limits: the policy is per call
	noFields      bool        // WithoutRateLimitMetadata
}

// An Option configures [New].
type Option func(*Limiter)

// WithLogger sets where calls refused for want of a limit are logged
// (default [slog.Default]).
func WithLogger(l *slog.Logger) Option { return func(g *Limiter) { g.logger = l } }

// WithoutRateLimitMetadata leaves the "ratelimit" and "ratelimit-policy"
// entries out of the response header metadata, as [ceiling.HeadersNone]
// leaves the fields out of HTTP responses. The status and its details of a
// refused call are sent whatever this says.
func WithoutRateLimitMetadata() Option { return func(g *Limiter) { g.noFields = true } }

// New binds rules to l's rules of the same names. It returns an error
// naming a rule that l does not declare, that is bound twice, or that has
// no Key.
func New(l *ceiling.Limiter, rules []Rule, opts ...Option) (*Limiter, error) {
	if l == nil {
		return nil, errors.New("ceilinggrpc: New with a nil limiter")
	}
	if len(rules) == 0 {
		return nil, errors.New("ceilinggrpc: no rules")
	}
	declared := map[string]bool{}
	concurrent := map[string]bool{}
	for _, r := range l.Rules() {
		declared[r.Name] = true
		concurrent[r.Name] = r.Algorithm == ceiling.Concurrency
	}
	seen := map[string]bool{}
	for _, r := range rules {
		switch {
		case !declared[r.Name]:
			return nil, fmt.Errorf("ceilinggrpc: rule %q: the limiter declares no such rule", r.Name)
		case seen[r.Name]:
			return nil, fmt.Errorf("ceilinggrpc: rule %q: bound twice", r.Name)
		case r.Key == nil:
			return nil, fmt.Errorf("ceilinggrpc: rule %q: no Key", r.Name)
		}
		seen[r.Name] = true
	}
	g := &Limiter{l: l, rules: append([]Rule(nil), rules...), logger: slog.Default(), logged: make([]atomic.Int64, len(rules))}
	for _, r := range rules {
		if concurrent[r.Name] && g.concurrent == "" {
			g.concurrent = r.Name
		}
		g.names = append(g.names, r.Name)
		g.dynamic = g.dynamic || r.Limits != nil
	}
	g.policy = l.RateLimitPolicy(nil, g.names...)
	for _, o := range opts {
		o(g)
	}
	if g.logger == nil {
		return nil, errors.New("ceilinggrpc: WithLogger(nil)")
	}
	return g, nil
}

// MustNew is like [New] but panics on a configuration error.
func MustNew(l *ceiling.Limiter, rules []Rule, opts ...Option) *Limiter {
	g, err := New(l, rules, opts...)
	if err != nil {
		panic(err)
	}
	return g
}

// UnaryServerInterceptor decides each call before its handler runs; a
// refused call never reaches the handler. The slots of
// [ceiling.Concurrency] rules come back when the handler returns, before
// the client has its answer.
func (g *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		d, err := g.decide(ctx, info.FullMethod, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) })
		if err != nil {
			return nil, err
		}
		defer d.Release() // the slots of concurrency rules, when the handler returns
		return handler(ctx, req)
	}
}

// StreamServerInterceptor decides each stream once, when it opens, before
// its handler runs; a refused stream never reaches the handler. A stream
// holds the slots of [ceiling.Concurrency] rules until its handler returns:
// a limit on streams open at once per key.
func (g *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		d, err := g.decide(ss.Context(), info.FullMethod, ss.SetHeader)
		if err != nil {
			return err
		}
		defer d.Release() // the slots of concurrency rules, when the stream ends
		return handler(srv, ss)
	}
}

// Limit decides the call whose context ctx is (the method comes from
// [grpc.Method]); it is go-grpc-middleware's ratelimit.Limiter, so that
// ratelimit.UnaryServerInterceptor(g) and StreamServerInterceptor(g) drop
// it into an existing chain. Those interceptors turn any error into
// codes.ResourceExhausted with its text, so the RetryInfo detail and the
// Unavailable code of a fail-closed refusal are lost on the way: prefer
// this package's own interceptors where clients read them. The rate-limit
// metadata is set on ctx's call (grpc.SetHeader), as the interceptors set
// it.
//
// Limit does not serve [ceiling.Concurrency] rules: a Limiter bound to one
// refuses every call through Limit, with an error naming the rule, and
// logs it once. Those interceptors run nothing after the handler, so Limit
// cannot know when a call's slot is free. Giving it back when ctx ends
// would free it while the handler still runs (a client that cancels, or
// sends short deadlines, would run any number of handlers at once), and
// holding it until its lease ends would free it under a handler that
// outlives the lease; refusing is the only answer that never admits more
// than the limit. This package's interceptors give the slot back when the
// handler returns: use them for Concurrency rules.
func (g *Limiter) Limit(ctx context.Context) error {
	if g.concurrent != "" {
		return g.refuseConcurrency(ctx)
	}
	method, _ := grpc.Method(ctx)
	_, err := g.decide(ctx, method, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) })
	return err
}

// refuseConcurrency is Limit's answer for a Limiter bound to a Concurrency
// rule: the call is refused and the operator told, once per Limiter.
func (g *Limiter) refuseConcurrency(ctx context.Context) error {
	const fix = "use ceilinggrpc's UnaryServerInterceptor and StreamServerInterceptor, which give a slot back when the handler returns"
	if g.limitRefusals.CompareAndSwap(false, true) {
		g.logger.LogAttrs(ctx, slog.LevelError, "ceilinggrpc: Limit refuses every call: a bound rule is a Concurrency rule, "+
			"whose slots go-grpc-middleware's ratelimit interceptors cannot give back when the handler returns; "+fix,
			slog.String("rule", g.concurrent))
	}
	return status.Errorf(codes.FailedPrecondition, "ceilinggrpc: rule %q is a Concurrency rule, which Limit cannot serve; %s", g.concurrent, fix)
}

// decide decides one call and returns, when it is not admitted, the status
// error the client gets. The decision's rate-limit fields go to setHeader,
// the call's response header metadata, whether it admits or refuses; a
// call refused before a decision (bad input, no limit) or failing closed
// gets none, as an HTTP 400, 500 or 503 gets no RateLimit fields.
func (g *Limiter) decide(ctx context.Context, method string, setHeader func(metadata.MD) error) (ceiling.Decision, error) {
	var buf [8]ceiling.Input
	inputs := buf[:0]
	for i := range g.rules {
		r := &g.rules[i]
		in, ok, err := g.input(ctx, method, i, r)
		if err != nil {
			return ceiling.Decision{}, err
		}
		if ok {
			inputs = append(inputs, in)
		}
	}
	d, err := g.l.Decide(ctx, inputs...)
	if err != nil {
		return d, decideError(err)
	}
	if md := g.fields(&d); md != nil {
		_ = setHeader(md) // fails only once headers are sent, which no handler has done yet
	}
	if !d.Allowed {
		return d, rejection(&d)
	}
	return d, nil
}

// fields is the response header metadata for d: the IETF rate-limit
// fields an HTTP response to the same decision carries, its policy
// listing the rules bound to gRPC calls. Nil when there is nothing to
// send.
func (g *Limiter) fields(d *ceiling.Decision) metadata.MD {
	if g.noFields {
		return nil
	}
	policy := g.policy
	if g.dynamic {
		policy = g.l.RateLimitPolicy(d, g.names...)
	}
	rateLimit := d.RateLimit()
	md := make(metadata.MD, 2)
	if policy != "" {
		md[policyKey] = []string{policy}
	}
	if rateLimit != "" {
		md[rateLimitKey] = []string{rateLimit}
	}
	if len(md) == 0 {
		return nil
	}
	return md
}

// The response header metadata keys of the IETF rate-limit fields
// (gRPC metadata keys are lower case).
const (
	policyKey    = "ratelimit-policy"
	rateLimitKey = "ratelimit"
)

// input is rule r's part of a call's decision; ok is false when the rule
// does not apply.
func (g *Limiter) input(ctx context.Context, method string, i int, r *Rule) (in ceiling.Input, ok bool, err error) {
	in = ceiling.Input{Rule: r.Name}
	if in.Key, err = r.Key(ctx, method); err != nil {
		return in, false, keyError(r.Name, err)
	}
	if r.Cost != nil {
		if in.Cost, err = r.Cost(ctx, method); err != nil {
			if !errors.Is(err, ceiling.ErrNoKey) {
				return in, false, status.Errorf(codes.InvalidArgument, "ceiling: rule %q: %v", r.Name, err)
			}
			in.Cost = 0 // no cost named: the rule's own, never "the rule does not apply"
		}
		if in.Cost < 0 {
			return in, false, status.Errorf(codes.InvalidArgument, "ceiling: rule %q: negative cost %d", r.Name, in.Cost)
		}
	}
	if r.Limits != nil {
		if in.Limit, in.Burst, err = r.Limits(ctx, method); err != nil {
			if !errors.Is(err, ceiling.ErrNoKey) {
				g.limitFailed(ctx, i, &ceiling.LimitError{Rule: r.Name, Err: err})
				return in, false, limitStatus(r.Name)
			}
			in.Limit, in.Burst = 0, 0 // no plan: the rule's own limit
		}
	}
	return in, true, nil
}

// keyError is the status of a call whose key function complained, or nil
// (with ok false from input) when the rule does not apply.
func keyError(rule string, err error) error {
	if errors.Is(err, ceiling.ErrNoKey) {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "ceiling: rule %q: %v", rule, err)
}

// decideError is the status of a call that Decide refused to decide.
func decideError(err error) error {
	var ue *ceiling.UnavailableError
	var le *ceiling.LimitError
	switch {
	case errors.As(err, &ue):
		return withDetails(status.New(codes.Unavailable, "ceiling: the rate limiter cannot decide right now; retry later"),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(ue.RetryAfter)})
	case errors.As(err, &le):
		return limitStatus(le.Rule) // Decide has logged it
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// limitStatus names the rule whose limit could not be had, but not why:
// the cause may hold a tenant's configuration.
func limitStatus(rule string) error {
	return status.Errorf(codes.Internal, "ceiling: no valid rate limit for this call under rule %q; the operator has been told", rule)
}

// rejection is the status of a call a rule refused: the HTTP problem's
// words, RetryInfo with the wait (none when the cost can never fit), and a
// QuotaFailure naming each refusing rule with the limit that applied. Like
// the problem, it names a Hidden rule only when no other rule refused.
func rejection(d *ceiling.Decision) error {
	p := ceiling.RejectionProblem(d)
	qf := &errdetails.QuotaFailure{}
	for i := range d.Results {
		if rr := &d.Results[i]; !rr.Allowed && slices.Contains(p.ViolatedPolicies, rr.Rule.Name) {
			qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
				Subject:     rr.Rule.Name,
				Description: quota(rr),
			})
		}
	}
	details := []protoadapt.MessageV1{qf}
	if p.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(p.RetryAfter) * time.Second)})
	}
	return withDetails(status.New(codes.ResourceExhausted, p.Detail), details...)
}

// quota says the limit that applied to a refusing rule.
func quota(rr *ceiling.RuleResult) string {
	if rr.Rule.Algorithm == ceiling.Concurrency {
		return fmt.Sprintf("%d at once", rr.Limit)
	}
	return fmt.Sprintf("%d per %v", rr.Limit, rr.Rule.Period)
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if s, err := st.WithDetails(details...); err == nil {
		st = s
	}
	return st.Err()
}

// limitLogEvery spaces the log lines of calls refused for want of a limit.
const limitLogEvery = time.Minute

// limitFailed logs a call refused for want of a limit, at most once a
// minute per rule.
func (g *Limiter) limitFailed(ctx context.Context, i int, e *ceiling.LimitError) {
	now := time.Now().UnixNano()
	last := g.logged[i].Load()
	if last != 0 && now-last < int64(limitLogEvery) || !g.logged[i].CompareAndSwap(last, now) {
		return
	}
	g.logger.LogAttrs(ctx, slog.LevelError, "ceilinggrpc: a rule has no valid limit for a call; such calls are refused as codes.Internal",
		slog.String("rule", e.Rule), slog.Any("err", e.Err))
}

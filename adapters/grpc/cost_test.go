package ceilinggrpc_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/ceiling-go/ceiling/backend"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// costFromMetadata is a Rule.Cost that believes the caller: the units
// named by the "x-cost" entry (an LLM call's max_tokens, say). A call that
// names no cost pays the rule's own; one whose entry is no number is
// refused.
func costFromMetadata(ctx context.Context, _ string) (int64, error) {
	v, err := ceilinggrpc.Metadata("x-cost")(ctx, "")
	if errors.Is(err, ceiling.ErrNoKey) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// A Cost that returns ceiling.ErrNoKey, as a metadata lookup does for a
// missing or empty entry, means the rule's default cost, never "the rule
// does not apply": a caller that sends no x-cost, or an empty one, gets
// the budget of 10 and no more (it got 30 of 30). Only the Key leaves a
// rule out.
func TestCostErrNoKeyIsTheDefaultCostRegression(t *testing.T) {
	passThrough := func(ctx context.Context, _ string) (int64, error) {
		v, err := ceilinggrpc.Metadata("x-cost")(ctx, "")
		if err != nil {
			return 0, err // ErrNoKey for a call that names no cost
		}
		return strconv.ParseInt(v, 10, 64)
	}
	onBackends(t, func(t *testing.T, opts ...ceiling.Option) {
		for _, md := range [][]string{{"x-api-key", "missing"}, {"x-api-key", "empty", "x-cost", ""}} {
			l := ceiling.MustNew([]ceiling.Rule{{Name: "api", Limit: 10, Period: time.Minute, Algorithm: ceiling.SlidingLog}}, opts...)
			t.Cleanup(func() { l.Close() })
			g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key"), Cost: passThrough}})
			s := serveLimiter(t, g)
			got := map[codes.Code]int{}
			for range 30 {
				got[status.Code(s.check(t, md...))]++
			}
			if got[codes.OK] != 10 || got[codes.ResourceExhausted] != 20 {
				t.Errorf("metadata %q, 30 calls on a budget of 10: %v, want 10 OK and 20 ResourceExhausted", md, got)
			}
		}
	})
}

// A cost that no limit can hold, sent by a caller, is that caller's
// refusal, never a backend failure: it does not open the breaker, so a
// rule that fails open keeps limiting everybody else (issue 23.1). A
// victim with a budget of 10 gets 10 of 20 calls while an attacker sends
// six costs over backend.MaxLimit before each of them.
func TestHugeCostFromMetadataIsNoBackendFailure(t *testing.T) {
	// More in a row than the breaker's threshold of failures.
	huge := []int64{backend.MaxLimit + 1, 1 << 40, 1 << 62, math.MaxInt64, backend.MaxLimit + 1, 1 << 40}
	onBackends(t, func(t *testing.T, opts ...ceiling.Option) {
		l := ceiling.MustNew([]ceiling.Rule{{Name: "api", Limit: 10, Period: time.Minute, Algorithm: ceiling.SlidingLog}},
			append(opts, ceiling.WithFailMode(ceiling.FailOpen))...)
		t.Cleanup(func() { l.Close() })
		g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key"), Cost: costFromMetadata}})
		s := serveLimiter(t, g)
		victim, wrong := 0, map[string]int{}
		for range 20 {
			for _, c := range huge {
				err := s.check(t, "x-api-key", "attacker", "x-cost", strconv.FormatInt(c, 10))
				if got := status.Code(err); got != codes.ResourceExhausted {
					wrong["cost "+strconv.FormatInt(c, 10)+": "+got.String()]++
				}
			}
			if err := s.check(t, "x-api-key", "attacker", "x-cost", "-5"); status.Code(err) != codes.InvalidArgument {
				wrong["cost -5: "+status.Code(err).String()]++
			}
			if err := s.check(t, "x-api-key", "victim", "x-cost", "1"); err == nil {
				victim++
			} else if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("victim: %v, want OK or ResourceExhausted", err)
			}
		}
		if len(wrong) > 0 {
			t.Errorf("the attacker's calls, over 20 rounds: %v; want ResourceExhausted for a cost that can never fit, InvalidArgument for a negative one", wrong)
		}
		if victim != 10 {
			t.Errorf("the victim got %d of 20 calls, want its budget of 10", victim)
		}
		h := l.Health()
		if h.DegradedTotal != 0 || h.Rules[0].FailOpenAdmissions != 0 {
			t.Errorf("health %+v: want no transition to degraded and no admission without the backend", h)
		}
	})
}

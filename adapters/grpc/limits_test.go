package ceilinggrpc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"google.golang.org/grpc/codes"
)

// A call without a plan, or with one the lookup does not know, gets the
// rule's own limit, never an unlimited budget (issue 23.4): through a
// Limits that passes its lookup's ErrNoKey on, and through the README's,
// which maps a missing or unknown plan to zero.
func TestNoPlanGetsTheRulesLimit(t *testing.T) {
	perMinute := map[string]int64{"pro": 3}
	planOf := func(ctx context.Context) (string, error) { return ceilinggrpc.Metadata("x-plan")(ctx, "") }
	for name, limits := range map[string]func(context.Context, string) (int64, int64, error){
		"ErrNoKey passed on": func(ctx context.Context, _ string) (int64, int64, error) {
			plan, err := planOf(ctx)
			if err != nil {
				return 0, 0, err
			}
			if _, ok := perMinute[plan]; !ok {
				return 0, 0, ceiling.ErrNoKey
			}
			return perMinute[plan], 0, nil
		},
		"README": func(ctx context.Context, _ string) (int64, int64, error) {
			plan, err := planOf(ctx)
			if err != nil && !errors.Is(err, ceiling.ErrNoKey) {
				return 0, 0, err
			}
			return perMinute[plan], 0, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := ceilinggrpc.MustNew(apiLimiter(t, 1), []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Metadata("x-api-key"), Limits: limits}})
			s := serveLimiter(t, g)
			for _, tc := range []struct {
				who  string
				md   []string
				want []codes.Code
			}{
				{"no plan", []string{"x-api-key", "eve"}, []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
				{"unknown plan", []string{"x-api-key", "mallory", "x-plan", "gold"}, []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
				{"pro", []string{"x-api-key", "ana", "x-plan", "pro"}, []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted}},
			} {
				var errs []error
				for range tc.want {
					errs = append(errs, s.check(t, tc.md...))
				}
				if got := codesOf(errs...); !equalCodes(got, tc.want) {
					t.Errorf("%s: %v, want %v", tc.who, got, tc.want)
				}
			}
		})
	}
}

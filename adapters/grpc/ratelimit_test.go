package ceilinggrpc_test

import (
	"strings"
	"testing"

	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The Limiter is go-grpc-middleware's ratelimit.Limiter: that package's own
// interceptors, in an ordinary chain, refuse over the limit with the
// limiter's words.
var _ ratelimit.Limiter = (*ceilinggrpc.Limiter)(nil)

func TestDropsIntoGoGRPCMiddlewareRatelimit(t *testing.T) {
	g := ceilinggrpc.MustNew(apiLimiter(t, 2), []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.Join(ceilinggrpc.Metadata("x-api-key"), ceilinggrpc.FullMethod)}})
	s := serve(t,
		[]grpc.UnaryServerInterceptor{ratelimit.UnaryServerInterceptor(g)},
		[]grpc.StreamServerInterceptor{ratelimit.StreamServerInterceptor(g)})
	unary := codesOf(s.check(t, "x-api-key", "k"), s.check(t, "x-api-key", "k"), s.check(t, "x-api-key", "k"))
	if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; !equalCodes(unary, want) {
		t.Errorf("unary through ratelimit.UnaryServerInterceptor: %v, want %v", unary, want)
	}
	// The method comes from the call's context: Watch has its own budget.
	err := s.watch(t, "x-api-key", "k")
	if err != nil {
		t.Fatalf("first Watch: %v", err)
	}
	s.watch(t, "x-api-key", "k")
	err = s.watch(t, "x-api-key", "k")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "quota exceeded for api (2 per 60 s)") {
		t.Errorf("third Watch through ratelimit.StreamServerInterceptor: %v, want ResourceExhausted in the limiter's words", err)
	}
}

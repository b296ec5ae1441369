package ceilinggrpc_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fieldsLimiter has a rule only HTTP uses, a Hidden one and a shadow one
// beside "api", which is 2 a minute.
func fieldsLimiter(t *testing.T, opts ...ceilinggrpc.Option) *ceilinggrpc.Limiter {
	t.Helper()
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "web", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute},
		{Name: "dest", Limit: 1, Period: time.Hour, Algorithm: ceiling.SlidingLog, Hidden: true},
		{Name: "api", Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "trial", Limit: 1, Period: time.Minute, Shadow: true},
	}, ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	return ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{
		{Name: "dest", Key: ceilinggrpc.Metadata("x-dest")},
		{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")},
		{Name: "trial", Key: ceilinggrpc.Metadata("x-api-key")},
	}, opts...)
}

// checkFields fails t unless md carries the IETF fields want: the policy,
// and "ratelimit" as wantRL, where a trailing "t=" stands for any wait of
// at least a second ("" for no entry).
func checkFields(t *testing.T, what string, md metadata.MD, wantPolicy, wantRL string) {
	t.Helper()
	if got := strings.Join(md.Get("ratelimit-policy"), " | "); got != wantPolicy {
		t.Errorf("%s: ratelimit-policy %q, want %q", what, got, wantPolicy)
	}
	got := strings.Join(md.Get("ratelimit"), " | ")
	if prefix, ok := strings.CutSuffix(wantRL, "t="); ok {
		if rest, found := strings.CutPrefix(got, prefix+"t="); !found || rest == "" || rest == "0" || strings.ContainsAny(rest, ",;") {
			t.Errorf("%s: ratelimit %q, want %q and a wait of a second or more", what, got, wantRL)
		}
		return
	}
	if got != wantRL {
		t.Errorf("%s: ratelimit %q, want %q", what, got, wantRL)
	}
}

// Every decided call, unary or stream, admitted or refused, carries the
// fields an HTTP response to the same decision carries, as response header
// metadata: the policy of the rules bound to gRPC (not the HTTP-only one,
// the Hidden one or the shadow one), and on a refusal only the refusing
// rule's state, never the Hidden rule's.
func TestResponseMetadataCarriesTheRateLimitFields(t *testing.T) {
	s := serveLimiter(t, fieldsLimiter(t))
	const policy = `"api";q=2;w=60`
	call := func(key, dest string) (metadata.MD, error) { return s.checkHeader(t, "x-api-key", key, "x-dest", dest) }

	md, err := call("k1", "d1")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "first unary call", md, policy, `"api";r=1;t=0`)
	md, err = call("k1", "d2")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "second unary call", md, policy, `"api";r=0;t=`)
	md, err = call("k1", "d1") // api spent, and d1 at its limit
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call: %v, want ResourceExhausted", err)
	}
	checkFields(t, "a call refused by api and the Hidden rule", md, policy, `"api";r=0;t=`)
	md, err = call("k2", "d1")
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a call to d1 from k2: %v, want ResourceExhausted", err)
	}
	checkFields(t, "a call refused by the Hidden rule alone", md, policy, "")

	md, err = s.watchHeader(t, "x-api-key", "k3", "x-dest", "d3")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "an admitted stream", md, policy, `"api";r=1;t=0`)
	md, err = s.watchHeader(t, "x-api-key", "k1", "x-dest", "d4")
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream over api's limit: %v, want ResourceExhausted", err)
	}
	checkFields(t, "a refused stream", md, policy, `"api";r=0;t=`)

	// A call refused before any decision (two x-api-key values) carries
	// none, as an HTTP 400 carries no RateLimit fields.
	md, err = s.checkHeader(t, "x-api-key", "a", "x-api-key", "b")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("two keys: %v, want InvalidArgument", err)
	}
	checkFields(t, "a call with bad input", md, "", "")
}

// WithoutRateLimitMetadata sends no fields; the refusal's status is as
// before.
func TestWithoutRateLimitMetadata(t *testing.T) {
	s := serveLimiter(t, fieldsLimiter(t, ceilinggrpc.WithoutRateLimitMetadata()))
	for i := range 3 {
		md, err := s.checkHeader(t, "x-api-key", "k", "x-dest", "d"+string(rune('0'+i)))
		checkFields(t, "call", md, "", "")
		if i == 2 && status.Code(err) != codes.ResourceExhausted {
			t.Errorf("third call: %v, want ResourceExhausted", err)
		}
	}
}

// A limit per call from Rule.Limits is the one the policy advertises, as in
// HTTP's RateLimit-Policy.
func TestResponseMetadataShowsTheLimitThatApplied(t *testing.T) {
	g := ceilinggrpc.MustNew(apiLimiter(t, 1), []ceilinggrpc.Rule{{
		Name: "api", Key: ceilinggrpc.Metadata("x-api-key"),
		Limits: func(ctx context.Context, _ string) (int64, int64, error) {
			if p, _ := ceilinggrpc.Metadata("x-plan")(ctx, ""); p == "pro" {
				return 5, 0, nil
			}
			return 0, 0, nil
		},
	}})
	s := serveLimiter(t, g)
	md, err := s.checkHeader(t, "x-api-key", "p", "x-plan", "pro")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "pro", md, `"api";q=5;w=60`, `"api";r=4;t=0`)
	md, err = s.checkHeader(t, "x-api-key", "f")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "free", md, `"api";q=1;w=60`, `"api";r=0;t=`)
}

// Through go-grpc-middleware's ratelimit interceptors (Limit), the fields
// are set on the call too.
func TestResponseMetadataThroughGoGRPCMiddleware(t *testing.T) {
	g := fieldsLimiter(t)
	s := serve(t,
		[]grpc.UnaryServerInterceptor{ratelimit.UnaryServerInterceptor(g)},
		[]grpc.StreamServerInterceptor{ratelimit.StreamServerInterceptor(g)})
	md, err := s.checkHeader(t, "x-api-key", "k", "x-dest", "d1")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "unary", md, `"api";q=2;w=60`, `"api";r=1;t=0`)
	md, err = s.watchHeader(t, "x-api-key", "k", "x-dest", "d2")
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, "stream", md, `"api";q=2;w=60`, `"api";r=0;t=`)
}

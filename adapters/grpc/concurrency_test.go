package ceilinggrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// openWatch opens a stream for key and waits for its first message; the
// stream stays open until cancel.
func openWatch(t *testing.T, s *server, key string) (cancel func(), err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	st, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	return cancel, err
}

// A concurrency rule limits streams open at once per key: a stream holds
// its slot until it ends, through this package's interceptor and through
// go-grpc-middleware's ratelimit chain alike.
func TestConcurrencyLimitsOpenStreams(t *testing.T) {
	for _, chain := range []string{"ceilinggrpc", "ratelimit"} {
		t.Run(chain, func(t *testing.T) {
			l := ceiling.MustNew([]ceiling.Rule{{Name: "streams", Limit: 2, Period: time.Minute, Algorithm: ceiling.Concurrency}})
			t.Cleanup(func() { l.Close() })
			g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "streams", Key: ceilinggrpc.Metadata("x-api-key")}})
			var s *server
			if chain == "ratelimit" {
				s = serve(t, nil, []grpc.StreamServerInterceptor{ratelimit.StreamServerInterceptor(g)})
			} else {
				s = serveLimiter(t, g)
			}
			cancel1, err1 := openWatch(t, s, "k")
			cancel2, err2 := openWatch(t, s, "k")
			defer cancel2()
			cancel3, err3 := openWatch(t, s, "k")
			defer cancel3()
			if err1 != nil || err2 != nil || status.Code(err3) != codes.ResourceExhausted {
				t.Fatalf("three streams with 2 slots: %v, %v, %v", err1, err2, err3)
			}
			if chain == "ceilinggrpc" && retryDelay(err3) != time.Second {
				t.Errorf("RetryInfo %v, want the one-second hint", retryDelay(err3))
			}
			if cancel, err := openWatch(t, s, "other"); err != nil {
				t.Errorf("another key: %v", err)
			} else {
				cancel()
			}
			cancel1() // the first stream ends: its slot comes back
			deadline := time.Now().Add(10 * time.Second)
			for {
				cancel, err := openWatch(t, s, "k")
				if err == nil {
					cancel()
					break
				}
				if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
					t.Fatalf("after a stream ended: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

package ceilinggrpc_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
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
// its slot until it ends.
func TestConcurrencyLimitsOpenStreams(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "streams", Limit: 2, Period: time.Minute, Algorithm: ceiling.Concurrency}})
	t.Cleanup(func() { l.Close() })
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "streams", Key: ceilinggrpc.Metadata("x-api-key")}})
	s := serveLimiter(t, g)
	cancel1, err1 := openWatch(t, s, "k")
	cancel2, err2 := openWatch(t, s, "k")
	defer cancel2()
	cancel3, err3 := openWatch(t, s, "k")
	defer cancel3()
	if err1 != nil || err2 != nil || status.Code(err3) != codes.ResourceExhausted {
		t.Fatalf("three streams with 2 slots: %v, %v, %v", err1, err2, err3)
	}
	if retryDelay(err3) != time.Second {
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
		time.Sleep(10 * time.Millisecond) // polling until gRPC's own goroutines end the stream
	}
}

// The package's interceptor gives a call's slot back when its handler
// returns, before grpc-go sends the status: a client that waits for each
// answer before its next call never finds its own slot still taken. 50
// strictly sequential calls on a limit of 1, over a loopback TCP
// connection, are all admitted.
func TestSequentialCallsGetTheSlotBack(t *testing.T) {
	// A release that took 20 ms must still land before the answer.
	slow := ceiling.WithBackend(slowRelease{memory.New()})
	onBackends(t, sequentialCalls)
	t.Run("slow release", func(t *testing.T) { sequentialCalls(t, slow, ceiling.WithLogger(slog.New(slog.DiscardHandler))) })
}

// sequentialCalls makes 50 calls one after the other on a limit of 1.
func sequentialCalls(t *testing.T, opts ...ceiling.Option) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "calls", Limit: 1, Period: time.Minute, Algorithm: ceiling.Concurrency}}, opts...)
	t.Cleanup(func() { l.Close() })
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "calls", Key: ceilinggrpc.Metadata("x-api-key")}})
	s := serveTCP(t, []grpc.UnaryServerInterceptor{g.UnaryServerInterceptor()}, nil)
	var refused []error
	for range 50 {
		if err := s.check(t, "x-api-key", "k"); err != nil {
			refused = append(refused, err)
		}
	}
	if len(refused) > 0 {
		t.Errorf("%d of 50 sequential calls refused on a limit of 1, want none; first: %v", len(refused), refused[0])
	}
}

// slowRelease is a backend whose releases of concurrency slots take 20 ms
// to arrive, as a slow round trip would: a release sent after the answer
// loses the race with the client's next call.
type slowRelease struct{ backend.Backend }

func (b slowRelease) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	for _, r := range reqs {
		if r.Algorithm == backend.Concurrency && r.Cost < 0 {
			time.Sleep(20 * time.Millisecond) // a slow round trip, in real time
			break
		}
	}
	return b.Backend.Decide(ctx, reqs)
}

package ceilinggrpc_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// dialBufconn serves the health service on an in-memory listener with opts
// and returns a client of it, and a func that stops both.
func dialBufconn(opts ...grpc.ServerOption) (healthpb.HealthClient, func()) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	return healthpb.NewHealthClient(conn), func() { conn.Close(); srv.Stop() }
}

// A gRPC server limits each API key to 2 calls a minute and each method to
// 1000 a minute in one decision; the third call of a key is
// ResourceExhausted with the wait in a RetryInfo detail.
func ExampleLimiter_UnaryServerInterceptor() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "rpc:key", Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "rpc:method", Limit: 1000, Period: time.Minute},
	})
	defer limiter.Close()
	g := ceilinggrpc.MustNew(limiter, []ceilinggrpc.Rule{
		{Name: "rpc:key", Key: ceilinggrpc.Metadata("x-api-key")},
		{Name: "rpc:method", Key: ceilinggrpc.FullMethod},
	})
	client, stop := dialBufconn(
		grpc.ChainUnaryInterceptor(g.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(g.StreamServerInterceptor()),
	)
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-1")
	for range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		if err == nil {
			fmt.Println(st.Code())
			continue
		}
		fmt.Println(st.Code(), st.Message())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("retry in", ri.GetRetryDelay().AsDuration().Round(time.Second))
			}
		}
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted quota exceeded for rpc:key (2 per 60 s); retry in 60 s
	// retry in 1m0s
}

// The Limiter drops into go-grpc-middleware's chain as its
// ratelimit.Limiter; that package reports every refusal as
// ResourceExhausted in its own words around the limiter's.
func ExampleLimiter_Limit() {
	limiter := ceiling.MustNew([]ceiling.Rule{{Name: "rpc", Limit: 1, Period: time.Minute}})
	defer limiter.Close()
	g := ceilinggrpc.MustNew(limiter, []ceilinggrpc.Rule{{Name: "rpc", Key: ceilinggrpc.FullMethod}})
	client, stop := dialBufconn(grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(g)))
	defer stop()
	for range 2 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// ResourceExhausted
}

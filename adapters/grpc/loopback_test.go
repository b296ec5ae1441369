package ceilinggrpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A real server and client over a loopback TCP connection: the peer is the
// client's real address, and the status with its details crosses the wire.
func TestLoopbackServerAndClient(t *testing.T) {
	l := apiLimiter(t, 2)
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "api", Key: ceilinggrpc.PeerAddr}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(g.UnaryServerInterceptor()), grpc.StreamInterceptor(g.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	var header metadata.MD
	for range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		errs = append(errs, err)
	}
	if got, want := codesOf(errs...), []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; !equalCodes(got, want) {
		t.Fatalf("codes %v, want %v (%v)", got, want, errs)
	}
	if d := retryDelay(errs[2]); d < 59*time.Second || d > time.Minute {
		t.Errorf("RetryInfo delay %v over the wire, want just under a minute", d)
	}
	checkFields(t, "the refused call's header metadata over the wire", header, `"api";q=2;w=60`, `"api";r=0;t=`)
	st, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a stream from the same address: %v, want ResourceExhausted", err)
	}
	// The key was the loopback address the client connects from.
	d, err := l.Peek(ctx, "api", "127.0.0.1")
	if err != nil || d.Remaining != 0 {
		t.Errorf("Peek(127.0.0.1): %+v, %v: want the budget spent", d, err)
	}
}

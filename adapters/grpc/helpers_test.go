package ceilinggrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// The tests serve grpc.health.v1.Health, a service that ships with grpc-go:
// Check is a unary call, Watch a server stream.
const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// testPeer is the metadata entry through which a bufconn test says which
// address its call comes from (bufconn has none): fakePeer, installed
// before the interceptor under test, makes it the call's peer.
const testPeer = "test-peer"

func peerFromMetadata(ctx context.Context) context.Context {
	if vs := metadata.ValueFromIncomingContext(ctx, testPeer); len(vs) > 0 {
		ap, err := net.ResolveTCPAddr("tcp", vs[0])
		if err == nil {
			return peer.NewContext(ctx, &peer.Peer{Addr: ap})
		}
	}
	return ctx
}

func fakePeerUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(peerFromMetadata(ctx), req)
}

func fakePeerStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &ctxStream{ServerStream: ss, ctx: peerFromMetadata(ss.Context())})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// server is a health service behind interceptors, on bufconn, counting the
// calls that reached it.
type server struct {
	client  healthpb.HealthClient
	handled atomic.Int64
}

// serve starts the service with the given interceptors after fakePeer and
// returns a client; both stop when the test ends.
func serve(t *testing.T, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) *server {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	return serveOn(t, lis, "passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }), unary, stream)
}

// serveTCP is serve on a loopback TCP port, where the client reads the
// server's answers from a real socket as soon as they are written.
func serveTCP(t *testing.T, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis, lis.Addr().String(), nil, unary, stream)
}

func serveOn(t *testing.T, lis net.Listener, target string, dial grpc.DialOption, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) *server {
	t.Helper()
	s := &server{}
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.handled.Add(1)
		return h(ctx, req)
	}
	countStream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.handled.Add(1)
		return h(srv, ss)
	}
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(append(append([]grpc.UnaryServerInterceptor{fakePeerUnary}, unary...), count)...),
		grpc.ChainStreamInterceptor(append(append([]grpc.StreamServerInterceptor{fakePeerStream}, stream...), countStream)...),
	)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dial != nil {
		opts = append(opts, dial)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	s.client = healthpb.NewHealthClient(conn)
	return s
}

// check makes a unary call with metadata given as key, value pairs.
func (s *server) check(t *testing.T, md ...string) error {
	t.Helper()
	_, err := s.checkHeader(t, md...)
	return err
}

// watch opens a stream and returns the error of its first message.
func (s *server) watch(t *testing.T, md ...string) error {
	t.Helper()
	_, err := s.watchHeader(t, md...)
	return err
}

// codesOf lists the status codes of errs.
func codesOf(errs ...error) []codes.Code {
	out := make([]codes.Code, len(errs))
	for i, err := range errs {
		out[i] = status.Code(err)
	}
	return out
}

func equalCodes(a, b []codes.Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// retryDelay is the RetryInfo detail of err's status, or -1.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

// quotaSubjects lists the subjects of err's QuotaFailure detail.
func quotaSubjects(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.GetViolations() {
				out = append(out, v.GetSubject()+": "+v.GetDescription())
			}
		}
	}
	return out
}

// checkHeader makes a unary call with metadata given as key, value pairs
// and returns the response header metadata with the call's error.
func (s *server) checkHeader(t *testing.T, md ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	var header metadata.MD
	_, err := s.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	return header, err
}

// watchHeader opens a stream and returns its response header metadata with
// the error of its first message.
func (s *server) watchHeader(t *testing.T, md ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	st, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	_, err = st.Recv()
	header, herr := st.Header()
	if herr != nil && err == nil {
		err = herr
	}
	return header, err
}

package ceilinggrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// inFlight is the innermost interceptor of a test server: it counts the
// handlers running at once and works 300 ms whatever the client does, as a
// handler that ignores cancellation would.
type inFlight struct{ now, max, entered atomic.Int64 }

func (f *inFlight) work() {
	f.entered.Add(1)
	n := f.now.Add(1)
	for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
	}
	time.Sleep(300 * time.Millisecond) // a handler that ignores cancellation, in real time
	f.now.Add(-1)
}

func (f *inFlight) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	f.work()
	return h(ctx, req)
}

func (f *inFlight) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	f.work()
	return h(srv, ss)
}

// A client that gives every call 40 ms while the handler works 300 ms never
// has more handlers running than a Concurrency rule's limit, through any
// path this package offers: its interceptors hold the slot until the
// handler returns, and Limit (go-grpc-middleware's ratelimit chain), which
// cannot see the handler return, refuses the rule instead of giving the
// slot back when the call's context ends (which let 16 handlers run on a
// limit of 2). 20 goroutines flood one key for 2 s.
func TestDeadlineFloodNeverRunsMoreHandlersThanTheLimit(t *testing.T) {
	onBackends(t, func(t *testing.T, opts ...ceiling.Option) {
		// FailClosed: a decision that times out on a loaded machine must not
		// be admitted by FailLocal's share beside the slots Redis holds (a
		// bound of its own, docs/failure.md); this test is about when a slot
		// comes back.
		opts = append(opts, ceiling.WithFailMode(ceiling.FailClosed))
		l := ceiling.MustNew([]ceiling.Rule{{Name: "calls", Limit: 2, Period: 10 * time.Second, Algorithm: ceiling.Concurrency}}, opts...)
		t.Cleanup(func() { l.Close() })
		g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "calls", Key: ceilinggrpc.Metadata("x-api-key")}},
			ceilinggrpc.WithLogger(slog.New(slog.DiscardHandler)))
		paths := []struct {
			name   string
			limit  bool // through Limit, which must refuse the rule
			unary  grpc.UnaryServerInterceptor
			stream grpc.StreamServerInterceptor
		}{
			{"UnaryServerInterceptor", false, g.UnaryServerInterceptor(), nil},
			{"StreamServerInterceptor", false, nil, g.StreamServerInterceptor()},
			{"ratelimit.UnaryServerInterceptor", true, ratelimit.UnaryServerInterceptor(g), nil},
			{"ratelimit.StreamServerInterceptor", true, nil, ratelimit.StreamServerInterceptor(g)},
		}
		for _, p := range paths {
			t.Run(p.name, func(t *testing.T) {
				t.Parallel()
				f := &inFlight{}
				var s *server
				if p.unary != nil {
					s = serveTCP(t, []grpc.UnaryServerInterceptor{p.unary, f.unary}, nil)
				} else {
					s = serveTCP(t, nil, []grpc.StreamServerInterceptor{p.stream, f.stream})
				}
				ends := floodWithDeadlines(s.client, p.stream != nil, 20, 40*time.Millisecond, 2*time.Second)
				if got := f.max.Load(); got > 2 {
					t.Errorf("%d handlers ran at once on a limit of 2 (codes %v)", got, ends)
				}
				switch entered := f.entered.Load(); {
				case p.limit && entered > 0:
					t.Errorf("%d calls reached the handler through Limit, which must refuse a Concurrency rule", entered)
				case !p.limit && entered == 0:
					t.Errorf("no call reached the handler (codes %v): the flood measured nothing", ends)
				}
			})
		}
	})
}

// floodWithDeadlines has workers call Check (or open Watch, when stream)
// on one key, each call with its own deadline, until the flood's time is
// up, and returns how many calls ended with each code.
func floodWithDeadlines(c healthpb.HealthClient, stream bool, workers int, deadline, flood time.Duration) map[codes.Code]int {
	stop := time.Now().Add(flood)
	var mu sync.Mutex
	got := map[codes.Code]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", "k")
				var err error
				if stream {
					var st healthpb.Health_WatchClient
					if st, err = c.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
						_, err = st.Recv()
					}
				} else {
					_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
				}
				cancel()
				mu.Lock()
				got[status.Code(err)]++
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // a client's pace, not the limiter's time
			}
		})
	}
	wg.Wait()
	return got
}

// Limit refuses every call of a Limiter bound to a Concurrency rule, among
// other rules too, with words that name the rule and the interceptors to
// use, and logs it once; no call reaches the handler. A Limiter bound only
// to rate rules serves Limit as before (TestDropsIntoGoGRPCMiddlewareRatelimit).
func TestLimitRefusesConcurrencyRules(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "api", Limit: 100, Period: time.Minute},
		{Name: "streams", Limit: 5, Period: time.Minute, Algorithm: ceiling.Concurrency},
	})
	t.Cleanup(func() { l.Close() })
	var log bytes.Buffer
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{
		{Name: "api", Key: ceilinggrpc.Metadata("x-api-key")},
		{Name: "streams", Key: ceilinggrpc.ForMethods(ceilinggrpc.Metadata("x-api-key"), watchMethod)},
	}, ceilinggrpc.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	s := serve(t,
		[]grpc.UnaryServerInterceptor{ratelimit.UnaryServerInterceptor(g)},
		[]grpc.StreamServerInterceptor{ratelimit.StreamServerInterceptor(g)})
	for range 3 {
		for _, err := range []error{s.check(t, "x-api-key", "k"), s.watch(t, "x-api-key", "k")} {
			if status.Code(err) != codes.ResourceExhausted ||
				!strings.Contains(err.Error(), `rule "streams" is a Concurrency rule, which Limit cannot serve`) ||
				!strings.Contains(err.Error(), "UnaryServerInterceptor and StreamServerInterceptor") {
				t.Errorf("through the ratelimit chain: %v, want the refusal of the Concurrency rule", err)
			}
		}
	}
	if got := s.handled.Load(); got != 0 {
		t.Errorf("%d calls reached the handler, want none", got)
	}
	if got := strings.Count(log.String(), "level=ERROR"); got != 1 || !strings.Contains(log.String(), "rule=streams") {
		t.Errorf("log %q: want one error naming the rule", log.String())
	}
	// Limit's own answer, outside any chain, is no rate-limit verdict.
	if err := g.Limit(context.Background()); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Limit: %v, want FailedPrecondition", err)
	}
}

package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestDenyCacheDoubtsAWrittenDecisionWhateverElseFailed pins that a
// decision that was written and not answered puts its key in doubt however
// it ended: by its budget while a dial of another connection of the same
// client failed (a connection limit, a SYN dropped), which once made its
// error "unreachable (dial)" and so "never sent"; or by its caller's
// cancellation after the write, with or without such a dial. Its caller,
// whose unit Redis took, then never gets the cached rejection that a later
// decision on the key taught the cache.
func TestDenyCacheDoubtsAWrittenDecisionWhateverElseFailed(t *testing.T) {
	for _, tc := range []struct{ withCancel, dialFails bool }{{false, true}, {true, true}, {true, false}} {
		withCancel := tc.withCancel
		name := "timeout"
		if withCancel {
			name = "caller-cancelled"
		}
		if !tc.dialFails {
			name += "-no-dial-failure"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Shared(t)
			proxy := redistest.NewProxy(t, srv.Addr)
			prefix := redistest.KeyPrefix(t)
			var failDials atomic.Bool
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if failDials.Load() {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused (injected)")}
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}})
			t.Cleanup(func() { c.Close() })
			s := New(c, WithPrefix(prefix))
			direct := New(defaultClient(t, srv.Addr), WithPrefix(prefix), WithDenyCache(0))
			one := backend.Request{Key: "k", Algorithm: backend.FixedWindow, Limit: 1, Period: 24 * time.Hour, Cost: 1}
			decide(t, s, backend.Request{Key: "warm", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1})

			lose := proxy.LoseReplyLate("fcall")
			defer lose()
			sent := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
			defer cancel()
			go func() {
				_, err := s.Decide(ctx, []backend.Request{one})
				sent <- err
			}()
			peek := one
			peek.Cost = 0
			waitFor(t, "the lost decision applied", func() bool { return decide(t, direct, peek)[0].Remaining == 0 })
			if res := decide(t, s, one); res[0].Allowed || res[0].Cached {
				t.Fatalf("a decision after the unit was taken: %+v, want rejected by Redis", res[0])
			}
			failDials.Store(tc.dialFails)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					pctx, pcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer pcancel()
					c.Ping(pctx)
				})
			}
			wg.Wait()
			failDials.Store(false)
			if withCancel {
				cancel()
			}
			err := <-sent
			if err == nil {
				t.Fatal("the decision whose reply was lost answered")
			}
			if !sentUnanswered(err) {
				t.Errorf("the written decision's error %v counts as never sent", err)
			}
			out := make([]backend.Result, 1)
			if s.DecideCached([]backend.Request{one}, out) {
				t.Errorf("the caller of a decision Redis applied got a cached rejection: %+v", out[0])
			}
		})
	}
}

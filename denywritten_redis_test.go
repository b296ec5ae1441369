package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestNoCachedRejectionForAWrittenDecisionAfterAFailedDial pins, through the
// middleware in FailOpen and FailClosed, that a request whose decision
// Redis applied (its reply lost) never gets a cached 429 learnt from a
// later request on its key, even when a dial of the same client failed
// while it was out: its answer is its fail mode's.
func TestNoCachedRejectionForAWrittenDecisionAfterAFailedDial(t *testing.T) {
	inst := redistest.Server(t)
	withLibrary(t, inst.Client(t))
	proxy := redistest.NewProxy(t, inst.Addr)
	var failDials atomic.Bool
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if failDials.Load() {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused (injected)")}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}})
	t.Cleanup(func() { c.Close() })
	for _, mode := range []FailMode{FailOpen, FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			prefix := redistest.KeyPrefix(t)
			l := MustNew([]Rule{{Name: "shop", Key: RemoteAddr, Limit: 1, Period: time.Hour}},
				WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(prefix))), WithFailMode(mode),
				WithTimeout(400*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
			defer l.Close()
			h := l.Handler(okHandler)
			serve := func(addr string) (int, string) {
				req := httptest.NewRequest("GET", "/", nil)
				req.RemoteAddr = addr + ":1234"
				rr := httptest.NewRecorder()
				h.ServeHTTP(rr, req)
				return rr.Code, rr.Header().Get("Retry-After")
			}
			serve("192.0.2.1") // warm: the script is loaded
			lose := proxy.LoseReplyLate("fcall")
			defer lose()
			got := make(chan int, 1)
			go func() { code, _ := serve("198.51.100.7"); got <- code }()
			direct := inst.Client(t)
			waitUntil := time.Now().Add(2 * time.Second)
			for time.Now().Before(waitUntil) {
				keys, _ := direct.Keys(context.Background(), prefix+"*").Result()
				if len(keys) >= 2 {
					break
				}
				time.Sleep(5 * time.Millisecond) // polling redis-server for the lost reply's write
			}
			// another request on the spent key, answered by Redis: 429 (learnt)
			code2, _ := serve("198.51.100.7")
			failDials.Store(true)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer cancel()
					c.Ping(ctx)
				})
			}
			wg.Wait()
			failDials.Store(false)
			code1 := <-got
			lose()
			if code2 != 429 {
				t.Fatalf("%v: the request after the unit was taken got %d, want Redis's 429", mode, code2)
			}
			if code1 == 429 {
				t.Errorf("%v: the request whose decision Redis applied (a unit consumed) got 429, a rejection that consumed", mode)
			}
		})
	}
}

package redistest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// proxyClient is a client through p that never retries, so each test sees
// exactly what the proxy did to one attempt.
func proxyClient(t *testing.T, p *Proxy) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxyDropReplyLosesTheReplyNotTheCommand(t *testing.T) {
	srv := Shared(t)
	p := NewProxy(t, srv.Addr)
	c := proxyClient(t, p)
	ctx := context.Background()
	key := KeyPrefix(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	p.DropReply("incr")
	if err := c.Incr(ctx, key).Err(); err == nil {
		t.Fatal("INCR answered although its reply was to be dropped")
	}
	if got, want := p.Dropped(), 1; got != want {
		t.Fatalf("Dropped() = %d, want %d", got, want)
	}
	// The server ran it once; the next INCR, on a new connection, is answered.
	n, err := c.Incr(ctx, key).Result()
	if err != nil {
		t.Fatalf("INCR after the drop: %v", err)
	}
	if n != 2 {
		t.Fatalf("INCR after a dropped INCR = %d, want 2 (the server ran the first)", n)
	}
}

func TestProxyStallHoldsRepliesUntilResume(t *testing.T) {
	p := NewProxy(t, Shared(t).Addr)
	c := proxyClient(t, p)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := c.Ping(ctx).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered through a stalled proxy")
	}
	p.Resume()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestProxyCutClosesConnections(t *testing.T) {
	p := NewProxy(t, Shared(t).Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	err := conn.Ping(ctx).Err()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PING on a cut connection: err = %v, want a closed connection", err)
	}
}

package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestALoneCallMovesOffADemotedMaster_Attack: a failover that demotes the
// master behind a name that then resolves to the new master (a managed
// Redis's primary endpoint; here a dialer reading the address from a
// variable) answers READONLY on the connections the pool holds; a lone
// decision's READONLY comes from inside batchScript's pcall. The connection
// must still be dropped, so that the next decision dials the new master,
// rather than every single-rule decision failing with ErrReadOnly while
// traffic keeps the connection busy. (It holds.)
func TestALoneCallMovesOffADemotedMaster_Attack(t *testing.T) {
	old, next := redistest.Server(t), redistest.Server(t)
	var addr atomic.Value
	var dials atomic.Int64
	addr.Store(old.Addr)
	client := redis.NewClient(&redis.Options{
		Addr: "redis.internal:6379", ContextTimeoutEnabled: true, PoolSize: 2,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			dials.Add(1)
			return d.DialContext(ctx, network, addr.Load().(string))
		},
	})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	req := backend.Request{Key: "k", Limit: 100, Period: time.Minute, Cost: 1}
	ctx := context.Background()
	if _, err := s.Decide(ctx, []backend.Request{req}); err != nil {
		t.Fatal(err)
	}
	// The failover: the old master turns replica (of a master it cannot
	// reach yet), and the name moves.
	if err := old.Client(t).Do(ctx, "replicaof", "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	addr.Store(next.Addr)
	var readOnly int
	for i := range 20 {
		_, err := s.Decide(ctx, []backend.Request{req})
		if err == nil {
			t.Logf("decided on the new master after %d READONLY answers, %d dials", readOnly, dials.Load())
			return
		}
		if !errors.Is(err, backend.ErrReadOnly) {
			t.Fatalf("decision %d: %v, want ErrReadOnly or success", i, err)
		}
		if !strings.Contains(err.Error(), "READONLY") {
			t.Fatalf("decision %d: %v does not say READONLY", i, err)
		}
		t.Logf("decision %d: %v (dials %d, pool %+v)", i, err, dials.Load(), *client.PoolStats())
		readOnly++
	}
	t.Errorf("every one of %d lone decisions after the failover answered ErrReadOnly: the pool kept its connection to the demoted master", readOnly)
}

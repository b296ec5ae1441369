package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestLostCompanionNeverAdmitsPastTheLimit pins that a Concurrency key
// whose two keys disagree (the companion hash deleted, of another type, or
// a field of it garbage, too small or out of range; or the sorted set
// deleted alone, as eviction under a maxmemory policy other than
// noeviction can) admits no lease past the limit while its leases live,
// and that Reset, which deletes both, still frees the key.
func TestLostCompanionNeverAdmitsPastTheLimit(t *testing.T) {
	srv := redistest.Shared(t)
	c := defaultClient(t, srv.Addr)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		do   func(key, hkey string)
	}{
		{"companion deleted", func(key, hkey string) { c.Del(ctx, hkey) }},
		{"count garbage", func(key, hkey string) { c.HSet(ctx, hkey, "#", "garbage") }},
		{"count negative", func(key, hkey string) { c.HSet(ctx, hkey, "#", "-1000") }},
		{"count zero", func(key, hkey string) { c.HSet(ctx, hkey, "#", "0") }},
		{"count missing", func(key, hkey string) { c.HDel(ctx, hkey, "#") }},
		{"offset huge", func(key, hkey string) { c.HSet(ctx, hkey, "+", "9007199254740991") }},
		{"offset negative", func(key, hkey string) { c.HSet(ctx, hkey, "+", "-9007199254740991") }},
		{"clock garbage", func(key, hkey string) { c.HSet(ctx, hkey, "@", "x") }},
		{"units garbage", func(key, hkey string) { c.HSet(ctx, hkey, "1", "x", "#", "x") }},
		{"companion of another type", func(key, hkey string) { c.Del(ctx, hkey); c.Set(ctx, hkey, "x", 0) }},
		{"sorted set deleted", func(key, hkey string) { c.Del(ctx, key) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(c, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
			lease := func(id int64) backend.Request {
				return backend.Request{Key: "cl", Algorithm: backend.Concurrency, Limit: 3, Period: time.Minute, Cost: 1, Lease: id}
			}
			for i := range int64(3) {
				if res := decide(t, s, lease(i+1)); !res[0].Allowed {
					t.Fatalf("lease %d of 3: %+v", i+1, res[0])
				}
			}
			key := s.prefix + "cl"
			hkey := companionOf(key)
			if n := c.Exists(ctx, key, hkey).Val(); n != 2 {
				t.Fatalf("the key and its companion %q: %d exist, want 2", hkey, n)
			}
			tc.do(key, hkey)
			for i := range int64(4) {
				if res := decide(t, s, lease(100+i)); res[0].Allowed {
					t.Fatalf("lease %d admitted past the limit with 3 live: %+v", 100+i, res[0])
				}
			}
			if err := s.Reset(ctx, "cl"); err != nil {
				t.Fatal(err)
			}
			for i := range int64(3) {
				if res := decide(t, s, lease(200+i)); !res[0].Allowed {
					t.Fatalf("after Reset, lease %d of 3: %+v", i+1, res[0])
				}
			}
		})
	}
}

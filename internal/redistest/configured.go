package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// ServerWithConfig is [Server] with more redis.conf lines, for tests of a
// misconfigured or constrained server: "requirepass s3cret", "replicaof
// 127.0.0.1 6379", "maxmemory 1mb". The server is the test's own and stops
// when the test ends.
func ServerWithConfig(tb testing.TB, lines ...string) *Instance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	inst, err := startInstance(bin, kind{extra: lines})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(inst.Close)
	return inst
}

// Fill makes the server refuse writes for want of memory, as a Redis that
// filled up with maxmemory-policy noeviction does: it stores 4 MiB, then
// sets maxmemory to 1 MiB without eviction. Reads still work.
func (i *Instance) Fill(tb testing.TB) {
	tb.Helper()
	c := i.Client(tb)
	ctx := context.Background()
	value := strings.Repeat("x", 64<<10)
	for n := range 64 {
		if err := c.Set(ctx, "redistest:fill:"+strconv.Itoa(n), value, 0).Err(); err != nil {
			tb.Fatalf("redistest: filling %s: %v", i.Addr, err)
		}
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1mb"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			tb.Fatalf("redistest: CONFIG SET %s on %s: %v", kv[0], i.Addr, err)
		}
	}
}

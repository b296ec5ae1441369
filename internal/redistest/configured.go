package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

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

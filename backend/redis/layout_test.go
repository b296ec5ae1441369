package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// GCRA stores its bare tat, written as Redis writes an integer argument
// (neither script formats it); the "g tat" an earlier version wrote is read.
// Both the lone-GCRA script and decide.lua (a GCRA request beside another)
// are held to it.
func TestGCRALayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		r := backend.Request{Key: "{k}gcra", Algorithm: backend.GCRA, Limit: 4, Period: time.Second, Cost: 1}
		other := backend.Request{Key: "{k}other", Algorithm: backend.FixedWindow, Limit: 4, Period: time.Second, Cost: 1}
		t0 := clock.Now().UnixMicro()
		decide(t, s, r)        // gcra.lua
		decide(t, s, r, other) // decide.lua
		if got, want := client.Get(ctx, prefix+":"+r.Key).Val(), itoa(t0+500_000); got != want {
			t.Errorf("stored %q, want the bare tat %q", got, want)
		}
		// The earlier layout, one unit from full, through each script.
		for _, reqs := range [][]backend.Request{{r}, {r, other}} {
			if err := client.Set(ctx, prefix+":"+r.Key, "g "+itoa(t0+750_000), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if res := decide(t, s, reqs...)[0]; !res.Allowed || res.Remaining != 0 {
				t.Errorf("%d requests on \"g tat\" of 3 units: %+v, want the last unit admitted", len(reqs), res)
			}
		}
	})
}

// The rolling window's value is fixed-width decimals (ALGORITHMS.md):
// "R w last S " and 17 counts, oldest first, the current bucket last.
func TestRollingWindowLayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		r := backend.Request{Key: "roll", Algorithm: backend.RollingWindow, Limit: 10, Period: 16 * time.Second, Cost: 2}
		b0 := clock.Now().UnixMicro() / 1_000_000 // W = 1s
		layout := func(last, sum int64, counts map[int]int64) string {
			var sb strings.Builder
			fmt.Fprintf(&sb, "R %015d %015d %015d ", 1_000_000, last, sum)
			for i := range 17 {
				fmt.Fprintf(&sb, "%010d ", counts[i])
			}
			return sb.String()
		}
		stored := func(label, want string) {
			t.Helper()
			if got := client.Get(ctx, prefix+":"+r.Key).Val(); got != want {
				t.Errorf("%s: stored\n%q, want\n%q", label, got, want)
			}
		}
		decide(t, s, r)
		stored("2 units", layout(b0, 2, map[int]int64{16: 2}))
		clock.Advance(3 * time.Second)
		decide(t, s, r)
		stored("3 buckets later", layout(b0+3, 4, map[int]int64{13: 2, 16: 2}))
		r.Cost = -3
		decide(t, s, r)
		stored("3 refunded", layout(b0+3, 1, map[int]int64{13: 1}))
		clock.Advance(20 * time.Second)
		r.Cost = 1
		decide(t, s, r)
		stored("every bucket left", layout(b0+23, 1, map[int]int64{16: 1}))
	})
}

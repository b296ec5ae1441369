package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// A sliding log is stored as "L k newest runs...": the script reads the
// count from the header instead of parsing every run. This pins the layout
// (a store that parsed and rewrote the runs differently would still pass the
// conformance suite) and that the older "l runs..." layout counts as absent
// rather than being misread.
func TestSlidingLogLayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		r := backend.Request{Key: "otp:to:x", Algorithm: backend.SlidingLog, Limit: 3, Period: time.Minute, Cost: 1}
		t0 := clock.Now().UnixMicro()

		decide(t, s, r)
		clock.Advance(time.Second)
		decide(t, s, r)
		got, err := client.Get(ctx, prefix+":"+r.Key).Result()
		if err != nil {
			t.Fatal(err)
		}
		t1 := t0 + time.Second.Microseconds()
		if want := "L 2 " + itoa(t1) + " " + itoa(t0) + " 1 " + itoa(t1) + " 1"; got != want {
			t.Errorf("stored %q, want %q", got, want)
		}

		// The older layout: three units, which would reject if misread.
		old := "l " + itoa(t1) + " 3"
		if err := client.Set(ctx, prefix+":"+r.Key, old, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if res := decide(t, s, r)[0]; !res.Allowed || res.Remaining != 2 {
			t.Errorf("after an old-layout value: %+v, want admitted with 2 remaining (absent state)", res)
		}
		got, _ = client.Get(ctx, prefix+":"+r.Key).Result()
		if !strings.HasPrefix(got, "L 1 ") {
			t.Errorf("stored %q, want a fresh L layout", got)
		}
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

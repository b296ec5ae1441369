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

// GCRA stores "tat at T": the theoretical arrival time, the now of the
// write (ALGORITHMS.md: a clock behind the write keeps the debt from now)
// and the emission interval (a request under another limit reads the debt
// as units), written alike by the batch script (a lone request) and
// decide.lua (a GCRA request beside another). A bare tat or "tat at",
// which no release wrote, counts as absent.
func TestGCRALayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		r := backend.Request{Key: "{k}gcra", Algorithm: backend.GCRA, Limit: 4, Period: time.Second, Cost: 1}
		other := backend.Request{Key: "{k}other", Algorithm: backend.FixedWindow, Limit: 4, Period: time.Second, Cost: 1}
		t0 := clock.Now().UnixMicro()
		decide(t, s, r)        // batch.lua
		decide(t, s, r, other) // decide.lua
		if got, want := client.Get(ctx, prefix+":"+r.Key).Val(), itoa(t0+500_000)+" "+itoa(t0)+" 250000"; got != want {
			t.Errorf("stored %q, want %q", got, want)
		}
		for _, raw := range []string{itoa(t0 + 1_000_000), itoa(t0+1_000_000) + " " + itoa(t0)} {
			for _, reqs := range [][]backend.Request{{r}, {r, other}} {
				if err := client.Set(ctx, prefix+":"+r.Key, raw, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				if res := decide(t, s, reqs...)[0]; !res.Allowed || res.Remaining != 3 {
					t.Errorf("%d requests on %q, a full bucket: %+v, want it read as absent", len(reqs), raw, res)
				}
			}
		}
	})
}

// rollingValue is a rolling window's value in the layout of ALGORITHMS.md:
// "R2 w last S " and 17 counts, the current bucket's first; counts maps an
// index of the spec (0 the oldest, 16 the current bucket) to its count.
func rollingValue(w, last int64, counts map[int]int64) string {
	var sb strings.Builder
	sum := int64(0)
	for _, n := range counts {
		sum += n
	}
	fmt.Fprintf(&sb, "R2 %015d %015d %015d ", w, last, sum)
	for i := 16; i >= 0; i-- {
		fmt.Fprintf(&sb, "%010d ", counts[i])
	}
	return sb.String()
}

// The rolling window's value is fixed-width decimals (ALGORITHMS.md), written
// alike by the batch script (a lone request) and by decide.lua (a
// rolling-window request beside another); a value of another layout counts
// as absent.
func TestRollingWindowLayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		for _, script := range []string{"batch.lua", "decide.lua"} {
			t.Run(script, func(t *testing.T) {
				ctx := context.Background()
				clock := newFakeClock()
				s := New(client, WithPrefix(prefix+script), WithClock(clock.Now), WithDenyCache(0))
				r := backend.Request{Key: "{k}roll", Algorithm: backend.RollingWindow, Limit: 10, Period: 16 * time.Second, Cost: 2}
				call := func() {
					t.Helper()
					reqs := []backend.Request{r}
					if script == "decide.lua" {
						reqs = append(reqs, backend.Request{Key: "{k}other", Algorithm: backend.FixedWindow, Limit: 4, Period: time.Second})
					}
					decide(t, s, reqs...)
				}
				key := prefix + script + ":" + r.Key
				stored := func(label, want string) {
					t.Helper()
					if got := client.Get(ctx, key).Val(); got != want {
						t.Errorf("%s: stored\n%q, want\n%q", label, got, want)
					}
				}
				b0 := clock.Now().UnixMicro() / 1_000_000 // W = 1s
				call()
				stored("2 units", rollingValue(1_000_000, b0, map[int]int64{16: 2}))
				call()
				stored("2 more in the same bucket", rollingValue(1_000_000, b0, map[int]int64{16: 4}))
				clock.Advance(3 * time.Second)
				call()
				stored("3 buckets later", rollingValue(1_000_000, b0+3, map[int]int64{13: 4, 16: 2}))
				r.Cost = -3
				call()
				stored("3 refunded", rollingValue(1_000_000, b0+3, map[int]int64{13: 3}))
				clock.Advance(20 * time.Second)
				r.Cost = 1
				call()
				stored("every bucket left", rollingValue(1_000_000, b0+23, map[int]int64{16: 1}))

				// The previous layout ("R ", the counts oldest first), which no
				// release wrote, counts as absent.
				old := "R " + rollingValue(1_000_000, b0+23, map[int]int64{10: 5, 16: 4})[3:]
				if err := client.Set(ctx, key, old, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				call()
				stored("the previous layout replaced", rollingValue(1_000_000, b0+23, map[int]int64{16: 1}))
			})
		}
	})
}

// An admission into the bucket a rolling window was last written in, whose
// count is already above 0, rewrites S and that count in place and keeps
// the key's expiry (it depends only on the bucket); any other admission
// sets the whole value and the expiry of the new bucket. On Redis's own
// clock (no WithClock, whose minimum TTL is set on every write), with
// values stored under a deliberately short TTL of 5 minutes.
func TestRollingWindowKeepsExpiryInPlace(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		const w = int64(time.Hour / time.Microsecond) // a period of 16 hours
		r := backend.Request{Key: "roll", Algorithm: backend.RollingWindow, Limit: 100, Period: 16 * time.Hour, Cost: 1}
		key := prefix + ":" + r.Key
		for _, c := range []struct {
			name    string
			value   func(b int64) string
			want    map[int]int64
			inPlace bool
		}{
			{"the bucket's count above 0", func(b int64) string { return rollingValue(w, b, map[int]int64{10: 2, 16: 3}) }, map[int]int64{10: 2, 16: 4}, true},
			{"the bucket's count 0", func(b int64) string { return rollingValue(w, b, map[int]int64{10: 2}) }, map[int]int64{10: 2, 16: 1}, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				for attempt := 0; ; attempt++ {
					now, err := client.Time(ctx).Result()
					if err != nil {
						t.Fatal(err)
					}
					b := now.UnixMicro() / w
					if err := client.Set(ctx, key, c.value(b), 5*time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
					if res := decide(t, s, r)[0]; !res.Allowed {
						t.Fatalf("rejected: %+v", res)
					}
					got := client.Get(ctx, key).Val()
					if !strings.HasPrefix(got, fmt.Sprintf("R2 %015d %015d ", w, b)) && attempt == 0 {
						continue // the hour ended meanwhile: once more
					}
					if want := rollingValue(w, b, c.want); got != want {
						t.Fatalf("stored\n%q, want\n%q", got, want)
					}
					ttl := client.PTTL(ctx, key).Val()
					end := time.Duration((b+17)*w-now.UnixMicro()) * time.Microsecond // the new bucket's expiry
					switch {
					case c.inPlace && ttl > 5*time.Minute:
						t.Errorf("TTL %v after an admission in place, want the 5m it had", ttl)
					case !c.inPlace && (ttl > end+time.Second || ttl < end-10*time.Second):
						t.Errorf("TTL %v, want the bucket's expiry, %v", ttl, end)
					}
					return
				}
			})
		}
	})
}

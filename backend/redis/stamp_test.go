package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The lead's scenario of issue 23 (COMMON.md): limit 10 per 60s; A reserves
// 5 at 0s, B takes 5 at 4..8s, A settles 0 at 50s (a refund of 5 with A's
// stamp), then C asks for 5 at 50s and D for 5 at 64s. A's reservation is
// used 0, so the real units are B's, C's and D's: never more than 10 in any
// 60s window. A refund off the newest units gave back B's and admitted 15.
// FixedWindow reserves at 59s and settles at 62s, B taking its 5 at
// 60..62s.
func TestStampedSettlementGivesBackOnlyItsUnits(t *testing.T) {
	type admission struct {
		at time.Duration
		n  int64
	}
	for _, c := range []struct {
		alg                backend.Algorithm
		reserve, settle, b time.Duration // A's reservation and settlement, B's first unit
		step               time.Duration // between B's units
	}{
		{backend.SlidingLog, 0, 50 * time.Second, 4 * time.Second, time.Second},
		{backend.RollingWindow, 0, 50 * time.Second, 4 * time.Second, time.Second},
		{backend.FixedWindow, 59 * time.Second, 62 * time.Second, 60 * time.Second, 500 * time.Millisecond},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
				clock := newFakeClock()
				t0 := clock.Now()
				s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
				at := func(d time.Duration) {
					clock.mu.Lock()
					clock.now = t0.Add(d)
					clock.mu.Unlock()
				}
				r := backend.Request{Key: "llm", Algorithm: c.alg, Limit: 10, Period: time.Minute, Cost: 5}
				var real []admission // the units really used
				at(c.reserve)
				a := decide(t, s, r)[0]
				if !a.Allowed || a.Stamp == 0 {
					t.Fatalf("A's reservation: %+v, want admitted with a stamp", a)
				}
				one := r
				one.Cost = 1
				for i := range 5 {
					d := c.b + time.Duration(i)*c.step
					at(d)
					if res := decide(t, s, one)[0]; res.Allowed {
						real = append(real, admission{d, 1})
					}
				}
				at(c.settle)
				settle := r
				settle.Cost, settle.Stamp = -5, a.Stamp
				if res := decide(t, s, settle)[0]; !res.Allowed || res.Stamp != 0 {
					t.Fatalf("A's settlement: %+v, want allowed without a stamp", res)
				}
				for _, d := range []time.Duration{c.settle, 64 * time.Second} {
					at(d)
					if res := decide(t, s, r)[0]; res.Allowed {
						real = append(real, admission{d, 5})
					}
				}
				for _, end := range real {
					var n int64
					for _, u := range real {
						if u.at <= end.at && u.at > end.at-time.Minute {
							n += u.n
						}
					}
					if n > 10 {
						t.Fatalf("%d real units in the 60s ending at %v (admitted: %v)", n, end.at, real)
					}
				}
			})
		})
	}
}

// A cross-slot call rejected on one slot is undone on the other with the
// inverse of its admissions when that slot's key was written meanwhile (so
// it cannot be put back byte for byte): the refund carries the stamp each
// admission returned. For GCRA that is the TAT it stored, so the units come
// back; the call's instant as stamp (what an earlier version sent) names no
// outstanding units and gave back nothing.
func TestClusterUndoInvertsWithTheAdmissionsStamps(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	ctx := context.Background()
	g := backend.Request{Key: "{a}g", Algorithm: backend.GCRA, Limit: 10, Period: 10 * time.Second, Cost: 4}
	other := backend.Request{Key: "{b}o", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Second, Cost: 1}
	groups := s.slotGroups([]backend.Request{g, other})
	if len(groups) != 2 {
		t.Fatalf("slot groups %v, want two", groups)
	}
	keys := [][]string{{s.prefix + g.Key}, {s.prefix + other.Key}}
	sub := [][]backend.Request{{g}, {other}}
	replies, errs := s.runGroups(ctx, keys, sub, true, false)
	if errs[0] != nil || errs[1] != nil || !replies[0].results[0].Allowed {
		t.Fatalf("the call's groups: %v, %v, %+v", errs[0], errs[1], replies[0].results)
	}
	// Another client takes 1 unit meanwhile: the key cannot be put back.
	one := g
	one.Cost = 1
	decide(t, s, one)
	replies[1].rejected = true // as if the other slot had rejected the call
	s.refund(ctx, keys, sub, replies, errs)
	peek := g
	peek.Cost = 0
	if res := decide(t, s, peek)[0]; res.Remaining != 9 {
		t.Errorf("after the undo: %+v, want 9 remaining (only the other client's unit taken)", res)
	}
}

// A sliding log's dead records never outweigh twice its live ones
// (ALGORITHMS.md: r <= 2l after every write): 200 single units at 200
// instants, a refund of 100, then, once 50 more have expired, a 50-unit
// admission leaves 51 live records, and the value at most 102. (Counting
// only the records before head, as an earlier version did, left all 200.)
func TestSlidingLogCompactsDeadRecordsOnBothSides(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		ctx := context.Background()
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		r := backend.Request{Key: "log", Algorithm: backend.SlidingLog, Limit: 1000, Period: time.Second, Cost: 1}
		for range 200 {
			decide(t, s, r)
			clock.Advance(time.Millisecond)
		}
		r.Cost = -100
		decide(t, s, r) // at 200ms: the units of 100ms..199ms go back
		clock.Advance(849 * time.Millisecond)
		r.Cost = 50 // at 1.049s: the units of 0..49ms have expired
		if res := decide(t, s, r)[0]; !res.Allowed || res.Remaining != 900 {
			t.Fatalf("the 50-unit admission: %+v, want admitted with 900 remaining", res)
		}
		v, err := client.Get(ctx, prefix+":"+r.Key).Result()
		if err != nil {
			t.Fatal(err)
		}
		state, err := parseLog(v)
		if err != nil {
			t.Fatal(err)
		}
		records := (len(v) - 59) / 34
		if live := len(state.Log); live != 51 || records > 2*live {
			t.Errorf("%d records stored for %d live ones, want at most twice as many: header %q", records, live, v[:58])
		}
	})
}

// A Concurrency decision reads and writes the leases it names, never every
// lease of the key (issue 23.7): acquiring, renewing and releasing a lease
// and a rejection send Redis the same commands whether the key holds 10
// leases or 1000. (The earlier layout, one string of every lease, was
// parsed and rewritten whole.) BenchmarkConcurrencyLeases measures the time.
func TestConcurrencyCostsTheSameAt10And1000Leases(t *testing.T) {
	srv := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	count := func(live int) map[string]int64 {
		key := "c" + itoa(int64(live))
		s := New(client, WithDenyCache(0))
		lease := func(id, cost int64) backend.Request {
			return backend.Request{Key: key, Algorithm: backend.Concurrency, Limit: int64(live) + 1, Period: time.Minute, Cost: cost, Lease: id}
		}
		for i := range live {
			decide(t, s, lease(int64(i+1), 1))
		}
		if typ := client.Type(context.Background(), s.prefix+key).Val(); typ != "zset" {
			t.Fatalf("a Concurrency key is a %s, want a sorted set of its leases", typ)
		}
		before := commandCalls(t, client)
		decide(t, s, lease(1_000_000, 1))     // acquires the last unit
		decide(t, s, lease(1_000_001, 1))     // rejected: the key is full
		decide(t, s, lease(int64(live/2), 1)) // renews
		decide(t, s, lease(1_000_000, -1))    // releases
		after := commandCalls(t, client)
		diff := map[string]int64{}
		for cmd, n := range after {
			if d := n - before[cmd]; d > 0 && cmd != "info" {
				diff[cmd] = d
			}
		}
		return diff
	}
	few, many := count(10), count(1000)
	if len(few) != len(many) {
		t.Fatalf("commands at 10 leases %v, at 1000 %v", few, many)
	}
	for cmd, n := range few {
		if many[cmd] != n {
			t.Errorf("%s: %d calls at 10 leases, %d at 1000 (all: %v, %v)", cmd, n, many[cmd], few, many)
		}
	}
}

// A Concurrency key's companion hash shares its hash slot whether or not
// the key has a hash tag of its own, so that a script on Redis Cluster
// reaches both.
func TestConcurrencyKeysShareASlotOnCluster(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	for _, prefix := range []string{redistest.KeyPrefix(t), "{" + redistest.KeyPrefix(t) + "}"} {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		r := backend.Request{Key: "streams:u1", Algorithm: backend.Concurrency, Limit: 1, Period: time.Minute, Cost: 1, Lease: 7}
		if res := decide(t, s, r)[0]; !res.Allowed {
			t.Fatalf("prefix %q: the first lease: %+v", prefix, res)
		}
		r.Lease = 8
		if res := decide(t, s, r)[0]; res.Allowed {
			t.Errorf("prefix %q: a second lease over a limit of 1: %+v", prefix, res)
		}
		if got, want := slot(companion(s.prefix+r.Key)), slot(s.prefix+r.Key); got != want {
			t.Errorf("prefix %q: companion in slot %d, key in %d", prefix, got, want)
		}
	}
}

// companion is the hash beside a Concurrency key's sorted set of leases
// (lib.lua's companion, written out again): the key's own hash tag keeps both in one Cluster
// slot, or else the whole key as the companion's tag.
func companion(key string) string {
	if start := strings.IndexByte(key, '{'); start >= 0 {
		if end := strings.IndexByte(key[start+1:], '}'); end > 0 {
			return key + "#n"
		}
	}
	return "{" + key + "}#n"
}

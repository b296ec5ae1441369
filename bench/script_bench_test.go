package bench

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	credis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// BenchmarkScriptServerTime is the Redis CPU one decision's script costs,
// read from INFO commandstats on a redis-server of its own (the usec of
// EVALSHA, EVAL and FCALL over their calls, each script's Redis calls
// included), reported as srv-us/op. commandstats times each call by the
// clock, so a server descheduled on a busy machine inflates it; cpu-us/op
// is the server main thread's CPU time per decision (INFO cpu), which a
// busy machine does not inflate but which includes reading the request and
// writing the reply. Compare figures of one run; take the lowest of a few
// (-count) on a loaded machine. It is the figure the scripts are held
// to: the one-rule GCRA script against redis_rate's, and a sliding log
// admission at a steady log of 10 and of 1000 entries against GCRA's.
// Wall time is the client's round trip and says little here.
//
//	go test ./bench -run '^$' -bench ScriptServerTime -benchtime 20000x
func BenchmarkScriptServerTime(b *testing.B) {
	srv := redistest.Server(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true})
	b.Cleanup(func() { c.Close() })
	// 100 keys at 1000 per minute: each key is back within milliseconds,
	// long before its TTL (a key that expires between two visits costs its
	// re-creation, which would be measured instead of the script), and
	// none reaches its limit in 20,000 decisions.
	ks := keys(100)
	const limit = 1000

	ceilingOne := func(alg backend.Algorithm) func(b *testing.B) func(i int) error {
		return func(b *testing.B) func(i int) error {
			s := credis.New(c, credis.WithPrefix(prefix(b)), credis.WithDenyCache(0))
			reqs := []backend.Request{{Algorithm: alg, Limit: limit, Period: time.Minute, Cost: 1}}
			return func(i int) error {
				reqs[0].Key = ks[i%len(ks)]
				_, err := s.Decide(ctx, reqs)
				return err
			}
		}
	}
	// slidingLog admits one unit per call on one key whose period holds
	// entries units: the fake clock advances a millisecond a call, so the
	// log stays at entries units once full (filled before timing).
	slidingLog := func(entries int) func(b *testing.B) func(i int) error {
		return func(b *testing.B) func(i int) error {
			var mu sync.Mutex
			now := time.Now()
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			s := credis.New(c, credis.WithPrefix(prefix(b)), credis.WithDenyCache(0), credis.WithClock(clock))
			reqs := []backend.Request{{Key: "log", Algorithm: backend.SlidingLog, Limit: int64(2 * entries), Period: time.Duration(entries) * time.Millisecond, Cost: 1}}
			step := func(int) error {
				mu.Lock()
				now = now.Add(time.Millisecond)
				mu.Unlock()
				res, err := s.Decide(ctx, reqs)
				if err == nil && !res[0].Allowed {
					err = fmt.Errorf("a sliding log admission was refused: %+v", res[0])
				}
				return err
			}
			for range entries {
				if err := step(0); err != nil {
					b.Fatal(err)
				}
			}
			return step
		}
	}
	// rollingMoved decides a rolling window (1000 per minute: buckets of
	// 3.75 s) on 100 keys under a fake clock that advances buckets/100 of a
	// bucket a call, so each key is back after that many buckets: its
	// counts move on (12) or it is written afresh (20, past the 16 kept),
	// as on many keys, where a key is rarely seen twice in one bucket.
	rollingMoved := func(buckets int) func(b *testing.B) func(i int) error {
		return func(b *testing.B) func(i int) error {
			var mu sync.Mutex
			now := time.Now()
			step := time.Minute / 16 * time.Duration(buckets) / time.Duration(len(ks))
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			s := credis.New(c, credis.WithPrefix(prefix(b)), credis.WithDenyCache(0), credis.WithClock(clock))
			reqs := []backend.Request{{Algorithm: backend.RollingWindow, Limit: limit, Period: time.Minute, Cost: 1}}
			return func(i int) error {
				mu.Lock()
				now = now.Add(step)
				mu.Unlock()
				reqs[0].Key = ks[i%len(ks)]
				_, err := s.Decide(ctx, reqs)
				return err
			}
		}
	}
	cases := []struct {
		name string
		new  func(b *testing.B) func(i int) error
	}{
		{"redisrate", func(b *testing.B) func(i int) error {
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: limit, Burst: limit, Period: time.Minute}
			p := prefix(b)
			return func(i int) error {
				_, err := l.Allow(ctx, p+":"+ks[i%len(ks)], lim)
				return err
			}
		}},
		// ceiling's scripts through the Store (FCALL, or EVALSHA on a
		// server without functions), one request each: the comparison of
		// script with script. The server time per call also moves with
		// the client's scheduling on a busy machine.
		{"ceiling-gcra", ceilingOne(backend.GCRA)},
		{"ceiling-rolling", ceilingOne(backend.RollingWindow)},
		{"ceiling-rolling-moved12", rollingMoved(12)},
		{"ceiling-rolling-moved20", rollingMoved(20)},
		{"ceiling-slidinglog-10", slidingLog(10)},
		{"ceiling-slidinglog-1000", slidingLog(1000)},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			step := tc.new(b)
			if err := step(0); err != nil { // loads the script
				b.Fatal(err)
			}
			calls0, usec0 := scriptStats(b, c)
			cpu0 := serverCPU(b, c)
			i := 0
			for b.Loop() {
				if err := step(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			cpu := serverCPU(b, c) - cpu0
			calls, usec := scriptStats(b, c)
			if calls-calls0 < int64(b.N) {
				b.Fatalf("%d script calls for %d decisions", calls-calls0, b.N)
			}
			b.ReportMetric(float64(usec-usec0)/float64(calls-calls0), "srv-us/op")
			b.ReportMetric(cpu/float64(b.N), "cpu-us/op")
		})
	}
}

// scriptStats sums the calls and usec of the script commands in INFO
// commandstats.
func scriptStats(tb testing.TB, c *redis.Client) (calls, usec int64) {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, fields, ok := strings.Cut(line, ":")
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_evalsha_ro", "cmdstat_fcall_ro":
		default:
			continue
		}
		if !ok {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case k != "calls" && k != "usec":
				continue
			case err != nil:
				tb.Fatalf("INFO commandstats line %q: %v", line, err)
			case k == "calls":
				calls += n
			default:
				usec += n
			}
		}
	}
	return calls, usec
}

// serverCPU is the redis-server main thread's CPU time so far, in µs.
func serverCPU(tb testing.TB, c *redis.Client) float64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatalf("INFO cpu: %v", err)
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys_main_thread" && k != "used_cpu_user_main_thread") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("INFO cpu line %q: %v", line, err)
		}
		total += f * 1e6
		found++
	}
	if found != 2 {
		tb.Fatalf("INFO cpu has no main-thread figures (Redis before 7?): %q", info)
	}
	return total
}

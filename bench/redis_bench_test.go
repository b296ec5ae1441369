package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/cputime"
	"github.com/redis/go-redis/v9"
)

// redisKeys is the pool of keys the Redis benchmarks cycle through.
const redisKeys = 10_000

// goroutines is the concurrency of the Redis throughput benchmark.
const goroutines = 64

// redisFixture is one library's limiter on its own client, checked.
type redisFixture struct {
	decider func() redisDecider
	count   *counter
	admin   *redis.Client
	prefix  string // its keys' prefix, which names a ceiling limiter's fallbacks
}

// newRedisFixture checks lib under n rules, then builds it on a client of
// its own.
func newRedisFixture(top *testing.B, lib redisLib, addr string, n int) *redisFixture {
	checkRedis(top, lib, addr, n, 1000)
	c, cnt := newClient(top, addr)
	p := prefix(top)
	return &redisFixture{decider: lib.new(top, c, p, hugeRules(n)), count: cnt, admin: redisFor(top, addr), prefix: p}
}

// redisKeysFor is the pool of n keys lib is timed on: addresses with a
// port for a middleware keyed by RemoteAddr.
func redisKeysFor(lib redisLib, n int) []string {
	if lib.addrs {
		return addrs(n)
	}
	return keys(n)
}

// hugeRules are n rules no benchmark reaches, at three periods.
func hugeRules(n int) []rule {
	return []rule{{huge, time.Second}, {huge, time.Minute}, {huge, time.Hour}}[:n]
}

// BenchmarkRedis is one decision on a local redis-server, one rule and
// three rules on one request: latency serial, and throughput from 64
// goroutines. It reports the commands the client sent (cmds/op), its round
// trips (trips/op) and the calls Redis executed, those inside scripts
// included (srvcalls/op, from INFO commandstats).
func BenchmarkRedis(top *testing.B) {
	addr := redisAddr(top)
	for _, n := range []int{1, 3} {
		for _, mode := range []string{"serial", "parallel64"} {
			for _, lib := range redisLibs {
				ks := redisKeysFor(lib, redisKeys)
				top.Run(fmt.Sprintf("rules=%d/%s/%s", n, mode, lib.name), func(b *testing.B) {
					f := setup(b, top, func() *redisFixture { return newRedisFixture(top, lib, addr, n) })
					if mode == "serial" {
						redisSerial(b, f, ks)
					} else {
						redisParallel(b, f, ks)
					}
				})
			}
		}
	}
}

// measure runs timed, which returns its rejections and errors, between
// two readings of the counters and reports them per decision. A ceiling
// limiter's admissions by its fail mode count as errors: the backend did
// not decide them.
func measure(b *testing.B, f *redisFixture, timed func() (rejected, errs int64)) {
	cmds0, trips0 := f.count.cmds.Load(), f.count.trips.Load()
	srv0, fb0 := serverCalls(b, f.admin), fallbacks(f.prefix)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Now()
	rejected, errs := timed()
	b.StopTimer()
	cputime.Report(b, cpu)
	srv := serverCalls(b, f.admin) - srv0
	errs += fallbacks(f.prefix) - fb0
	verdict(b, int(rejected), int(errs))
	n := float64(b.N)
	b.ReportMetric(float64(f.count.cmds.Load()-cmds0)/n, "cmds/op")
	b.ReportMetric(float64(f.count.trips.Load()-trips0)/n, "trips/op")
	b.ReportMetric(float64(srv)/n, "srvcalls/op")
}

// tally counts a decision that is not an admission.
func tally(ok bool, err error, rejected, errs *int64) {
	switch {
	case err != nil:
		*errs++
	case !ok:
		*rejected++
	}
}

func redisSerial(b *testing.B, f *redisFixture, ks []string) {
	measure(b, f, func() (rejected, errs int64) {
		decide := f.decider()
		i := 0
		for range b.N {
			ok, err := decide(ctx, ks[i])
			tally(ok, err, &rejected, &errs)
			if i++; i == len(ks) {
				i = 0
			}
		}
		return rejected, errs
	})
}

func redisParallel(b *testing.B, f *redisFixture, ks []string) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((goroutines + procs - 1) / procs)
	measure(b, f, func() (int64, int64) {
		var rejected, errs, start atomic.Int64
		t0 := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			decide := f.decider()
			i := int(start.Add(7919)) % len(ks)
			var rej, e int64
			for pb.Next() {
				ok, err := decide(ctx, ks[i])
				tally(ok, err, &rej, &e)
				if i++; i == len(ks) {
					i = 0
				}
			}
			rejected.Add(rej)
			errs.Add(e)
		})
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "decisions/s")
		return rejected.Load(), errs.Load()
	})
}

// exactLibs are the Redis libraries of the exactness experiment, ceiling
// under each of its algorithms.
func exactLibs() []redisLib {
	var libs []redisLib
	for _, lib := range redisLibs {
		if !lib.variant {
			libs = append(libs, lib)
		}
	}
	return append(libs,
		redisLib{name: "ceiling-slidinglog", algo: "sliding log", new: ceilingRedis(backend.SlidingLog)},
		redisLib{name: "ceiling-fixedwindow", algo: "fixed window", new: ceilingRedis(backend.FixedWindow)},
		redisLib{name: "ceiling-gcra", algo: "GCRA", new: ceilingRedis(backend.GCRA)},
	)
}

// BenchmarkExact is the exactness experiment: limit 100 per minute, 1000
// concurrent decisions on one key from 4 instances (each its own client
// and limiter) on one Redis. It reports how many were admitted (exactly
// 100 is correct), rejected, and failed with an error. Run it with
// -benchtime=1x: every iteration is a fresh key.
func BenchmarkExact(top *testing.B) {
	addr := redisAddr(top)
	for _, lib := range exactLibs() {
		top.Run(lib.name, func(b *testing.B) {
			var sum exactOutcome
			runs := 0
			for b.Loop() {
				out := runExact(b, lib, addr)
				sum.admitted += out.admitted
				sum.rejected += out.rejected
				sum.errors += out.errors
				sum.elapsed += out.elapsed
				runs++
			}
			r := float64(runs)
			b.ReportMetric(float64(sum.admitted)/r, "admitted")
			b.ReportMetric(float64(sum.rejected)/r, "rejected")
			b.ReportMetric(float64(sum.errors)/r, "errors")
			b.ReportMetric(float64(sum.elapsed.Milliseconds())/r, "ms")
		})
	}
}

// attackRequests is the flood of the attack benchmark.
const attackRequests = 10_000

// BenchmarkAttack is a flood from one key that is already rejected: the
// key spends its limit of 10 per minute, then sends 10,000 more requests.
// It reports the commands the client sent and the calls Redis executed for
// the 10,000, and the time per request. Run it with -benchtime=1x.
func BenchmarkAttack(top *testing.B) {
	addr := redisAddr(top)
	for _, lib := range redisLibs {
		if lib.variant {
			continue
		}
		top.Run(lib.name, func(b *testing.B) {
			c, cnt := newClient(b, addr)
			admin := redisFor(b, addr)
			decide := lib.new(b, c, prefix(b), []rule{{enforceLimit, time.Minute}})()
			var cmds, srv int64
			var elapsed time.Duration
			runs := 0
			for b.Loop() {
				key := "attacker" + itoa(runs)
				for i := range enforceLimit + 1 {
					ok, err := decide(ctx, key)
					if err != nil || ok != (i < enforceLimit) {
						b.Fatalf("%s: request %d of the attacker: admitted %v, err %v; want the first %d admitted", lib.name, i, ok, err, enforceLimit)
					}
				}
				cmds0, srv0 := cnt.cmds.Load(), serverCalls(b, admin)
				t0 := time.Now()
				for i := range attackRequests {
					if ok, err := decide(context.Background(), key); ok || err != nil {
						b.Fatalf("%s: flood request %d: admitted %v, err %v", lib.name, i, ok, err)
					}
				}
				elapsed += time.Since(t0)
				cmds += cnt.cmds.Load() - cmds0
				srv += serverCalls(b, admin) - srv0
				runs++
			}
			r := float64(runs)
			b.ReportMetric(float64(cmds)/r, "cmds/10k")
			b.ReportMetric(float64(srv)/r, "srvcalls/10k")
			b.ReportMetric(float64(elapsed.Nanoseconds())/r/attackRequests, "ns/req")
		})
	}
}

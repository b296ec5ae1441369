package bench

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/cputime"
)

// huge is a limit no benchmark reaches: every timed decision is an
// admission, which the benchmarks verify.
const huge = 1_000_000_000

// BenchmarkDecide is one in-memory decision (one key, one rule), on one key
// and over 100k keys, serial and from every core. ceiling's row is its
// public path, the middleware; ceiling-decide and ceiling-store show what
// Limiter.Decide and the store alone cost in the same run. It reports the
// process's CPU time per decision (cpu-ns/op) beside the wall time: on a
// machine shared with other work it moves less.
func BenchmarkDecide(top *testing.B) {
	for _, nk := range []int{1, 100_000} {
		bare, withPorts := keys(nk), addrs(nk)
		for _, mode := range []string{"serial", "parallel"} {
			for _, lib := range memLibs {
				ks := bare
				if lib.addrs {
					ks = withPorts
				}
				top.Run(fmt.Sprintf("keys=%s/%s/%s", count(nk), mode, lib.name), func(b *testing.B) {
					l := setup(b, top, func() memLimiter {
						checkMem(b, lib, ks)
						l := lib.new(huge, time.Minute, 0)
						top.Cleanup(l.close)
						allow := l.worker()
						for _, k := range ks {
							if ok, err := allow(k); !ok || err != nil {
								b.Fatalf("filling %s: key %q rejected (err %v)", lib.name, k, err)
							}
						}
						return l
					})
					if mode == "serial" {
						decideSerial(b, l, ks)
					} else {
						decideParallel(b, l, ks)
					}
				})
			}
		}
	}
}

func decideSerial(b *testing.B, l memLimiter, ks []string) {
	allow := l.worker()
	var rejected, errs int
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Now()
	for range b.N {
		ok, err := allow(ks[i])
		switch {
		case err != nil:
			errs++
		case !ok:
			rejected++
		}
		if i++; i == len(ks) {
			i = 0
		}
	}
	b.StopTimer()
	cputime.Report(b, cpu)
	verdict(b, rejected, errs)
}

// verdict fails b if any timed decision was a rejection (the benchmark
// would have timed the wrong path), and reports errors: a limiter that
// fails under contention is part of the result.
func verdict(b *testing.B, rejected, errs int) {
	b.Helper()
	if rejected != 0 {
		b.Fatalf("%d of %d timed decisions were rejections: the benchmark timed the wrong path", rejected, b.N)
	}
	b.ReportMetric(float64(errs)/float64(b.N), "errors/op")
}

func decideParallel(b *testing.B, l memLimiter, ks []string) {
	var rejected, errs, start atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Now()
	b.RunParallel(func(pb *testing.PB) {
		allow := l.worker()
		i := int(start.Add(7919)) % len(ks)
		var rej, e int64
		for pb.Next() {
			ok, err := allow(ks[i])
			switch {
			case err != nil:
				e++
			case !ok:
				rej++
			}
			if i++; i == len(ks) {
				i = 0
			}
		}
		rejected.Add(rej)
		errs.Add(e)
	})
	b.StopTimer()
	cputime.Report(b, cpu)
	verdict(b, int(rejected.Load()), int(errs.Load()))
}

// count writes 100000 as 100k.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return itoa(n/1_000_000) + "M"
	case n >= 1000 && n%1000 == 0:
		return itoa(n/1000) + "k"
	}
	return itoa(n)
}

package bench

import (
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// The boundary experiment: limit boundaryLimit per boundaryPeriod. The
// attacker spends the limit, probes every boundaryProbe until a request is
// admitted again (a window boundary, or a token refilled), then, one period
// later, sends a burst boundaryDelta before that instant and another
// boundaryDelta after it. A fixed window admits nearly 2× the limit in
// those 2×boundaryDelta; a rolling window or a token bucket about 1×.
const (
	boundaryLimit  = 50
	boundaryPeriod = time.Second
	boundaryDelta  = 50 * time.Millisecond
	boundaryProbe  = 2 * time.Millisecond
)

// boundaryLib is a limiter under test: memory or Redis.
type boundaryLib struct {
	name string
	new  func(tb testing.TB) (allowFunc, func())
}

func boundaryLibs(tb testing.TB) []boundaryLib {
	var libs []boundaryLib
	for _, lib := range memLibs {
		if lib.variant {
			continue
		}
		libs = append(libs, boundaryLib{lib.name, func(testing.TB) (allowFunc, func()) {
			l := lib.new(boundaryLimit, boundaryPeriod, 0)
			return l.worker(), l.close
		}})
	}
	for _, algo := range []backend.Algorithm{backend.SlidingLog, backend.SlidingWindow, backend.FixedWindow, backend.GCRA} {
		libs = append(libs, boundaryLib{"ceiling-" + algo.String(), func(testing.TB) (allowFunc, func()) {
			l := ceilingMem(algo, boundaryLimit, boundaryPeriod, 0)
			return l.worker(), l.close
		}})
	}
	addr := redisAddr(tb)
	for _, lib := range redisLibs {
		if lib.variant {
			continue
		}
		libs = append(libs, boundaryLib{lib.name + "-redis", func(tb testing.TB) (allowFunc, func()) {
			c, _ := newClient(tb, addr)
			d := lib.new(tb, c, prefix(tb), []rule{{boundaryLimit, boundaryPeriod}})()
			return func(key string) (bool, error) { return d(ctx, key) }, func() {}
		}})
	}
	return libs
}

// boundaryOutcome is what the attacker got through around the boundary.
type boundaryOutcome struct {
	before, after int
	err           string
}

// runBoundary plays the attacker against one limiter.
func runBoundary(allow allowFunc) boundaryOutcome {
	burst := func(n int) (int, error) {
		admitted := 0
		for range n {
			ok, err := allow("attacker")
			if err != nil {
				return admitted, err
			}
			if ok {
				admitted++
			}
		}
		return admitted, nil
	}
	if got, err := burst(boundaryLimit + 5); err != nil || got != boundaryLimit {
		return boundaryOutcome{err: "first burst admitted " + itoa(got) + " of " + itoa(boundaryLimit+5) + " (want the limit)"}
	}
	deadline := time.Now().Add(3 * boundaryPeriod)
	var b time.Time
	for {
		ok, err := allow("attacker")
		if err != nil {
			return boundaryOutcome{err: err.Error()}
		}
		if ok {
			b = time.Now()
			break
		}
		if time.Now().After(deadline) {
			return boundaryOutcome{err: "no request admitted for 3 periods"}
		}
		time.Sleep(boundaryProbe)
	}
	var out boundaryOutcome
	var err error
	time.Sleep(time.Until(b.Add(boundaryPeriod - boundaryDelta)))
	if out.before, err = burst(boundaryLimit); err != nil {
		return boundaryOutcome{err: err.Error()}
	}
	time.Sleep(time.Until(b.Add(boundaryPeriod + boundaryDelta)))
	if out.after, err = burst(boundaryLimit); err != nil {
		return boundaryOutcome{err: err.Error()}
	}
	return out
}

// BenchmarkBoundary reports, for each limiter, how many requests the
// attacker got through in the 100ms around a boundary (admitted) and that
// as a multiple of the limit (x-limit). All limiters are attacked at once
// so that the whole experiment takes about two periods. Run it with
// -benchtime=1x; ns/op is meaningless.
func BenchmarkBoundary(top *testing.B) {
	libs := boundaryLibs(top)
	results := make([]boundaryOutcome, len(libs))
	var once sync.Once
	run := func() {
		var wg sync.WaitGroup
		for i, lib := range libs {
			allow, closer := lib.new(top)
			wg.Go(func() {
				defer closer()
				results[i] = runBoundary(allow)
			})
		}
		wg.Wait()
	}
	for i, lib := range libs {
		top.Run(lib.name, func(b *testing.B) {
			once.Do(run)
			out := results[i]
			if out.err != "" {
				b.Fatalf("%s: %s", lib.name, out.err)
			}
			for b.Loop() {
			}
			n := out.before + out.after
			b.ReportMetric(float64(n), "admitted")
			b.ReportMetric(float64(n)/boundaryLimit, "x-limit")
		})
	}
}

package memory

import (
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/cputime"
)

// benchRules are three rules as a request might carry them: a per-second
// GCRA, a per-minute sliding window and a per-day fixed window.
func benchRules(key string) []backend.Request {
	return []backend.Request{
		{Key: "sec:" + key, Algorithm: backend.GCRA, Limit: 1_000_000_000, Period: time.Second, Cost: 1},
		{Key: "min:" + key, Algorithm: backend.SlidingWindow, Limit: 1_000_000_000, Period: time.Minute, Cost: 1},
		{Key: "day:" + key, Algorithm: backend.FixedWindow, Limit: 1_000_000_000, Period: 24 * time.Hour, Cost: 1},
	}
}

// benchKeys returns n distinct keys shaped like ceiling's stored keys.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("api:%016x%016x", uint64(i)*0x9e3779b97f4a7c15, uint64(i))
	}
	return keys
}

// benchDecide runs DecideInto over keys (each request set built once), after
// filling the store with every key and checking it holds them.
func benchDecide(b *testing.B, nKeys, nRules int, parallel bool) {
	s := New(WithMaxKeys(4<<20), WithSweepInterval(0))
	defer s.Close()
	keys := benchKeys(nKeys)
	sets := make([][]backend.Request, nKeys)
	for i, k := range keys {
		sets[i] = benchRules(k)[:nRules]
		if err := s.DecideInto(ctx, sets[i], make([]backend.Result, nRules)); err != nil {
			b.Fatal(err)
		}
	}
	if got, want := s.Len(), nKeys*nRules; got != want {
		b.Fatalf("store holds %d keys, want %d", got, want)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		res := make([]backend.Result, nRules)
		for i := 0; b.Loop(); i++ {
			if err := s.DecideInto(ctx, sets[i%nKeys], res); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	var worker atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		res := make([]backend.Result, nRules)
		i := int(worker.Add(1)) * 7919
		for pb.Next() {
			if err := s.DecideInto(ctx, sets[i%nKeys], res); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func BenchmarkMemory(b *testing.B) {
	for _, rules := range []int{1, 3} {
		for _, keys := range []int{1, 100_000} {
			for _, par := range []bool{false, true} {
				mode := "serial"
				if par {
					mode = "parallel"
				}
				b.Run(fmt.Sprintf("rules=%d/keys=%d/%s", rules, keys, mode), func(b *testing.B) {
					benchDecide(b, keys, rules, par)
				})
			}
		}
	}
}

// BenchmarkMemoryDecide is Decide, which allocates its results slice, for
// comparison with the DecideInto path above.
func BenchmarkMemoryDecide(b *testing.B) {
	s := New(WithSweepInterval(0))
	defer s.Close()
	reqs := benchRules("k")[:1]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Decide(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemoryIdleKeys measures the heap one idle key holds under a
// limit of 10 per minute, and what is left once the keys are back to full
// and swept, for GCRA (one value per key) and the rolling window (17
// counts per key, 8-bit for such a limit): a million keys in a Store whose
// bound is twice that (its tables, doubling, are under half full), and
// 900,000 in one of the default bound, 86% full (its tables stop growing
// at the size the bound needs, 4/5 full at the bound). It reports
// bytes/key and left-bytes/key; its ns/op is meaningless.
func BenchmarkMemoryIdleKeys(b *testing.B) {
	for _, alg := range []backend.Algorithm{backend.GCRA, backend.RollingWindow} {
		for _, c := range []struct{ n, bound int }{{1_000_000, 2 * DefaultMaxKeys}, {900_000, DefaultMaxKeys}} {
			b.Run(fmt.Sprintf("%v/keys=%d/bound=%d", alg, c.n, c.bound), func(b *testing.B) {
				for b.Loop() {
					idleKeys(b, alg, c.n, c.bound)
				}
			})
		}
	}
}

func idleKeys(b *testing.B, alg backend.Algorithm, n, bound int) {
	clock := time.Unix(1_700_000_000, 0)
	s := New(WithClock(func() time.Time { return clock }), WithMaxKeys(bound), WithSweepInterval(0))
	defer s.Close()
	before := heapInUse()
	reqs := []backend.Request{{Algorithm: alg, Limit: 10, Period: time.Minute, Cost: 1}}
	res := make([]backend.Result, 1)
	for i := range n {
		reqs[0].Key = "ip:" + strconv.Itoa(i)
		if err := s.DecideInto(ctx, reqs, res); err != nil {
			b.Fatal(err)
		}
	}
	if got := s.Len(); got != n || s.Evictions() != 0 {
		b.Fatalf("store holds %d keys, want %d (%d evicted)", got, n, s.Evictions())
	}
	held := heapInUse()
	clock = clock.Add(2 * time.Minute) // every key is back to full
	if got := s.sweep(); got != n {
		b.Fatalf("sweep deleted %d keys, want %d", got, n)
	}
	after := heapInUse()
	b.ReportMetric(float64(held-before)/float64(n), "bytes/key")
	b.ReportMetric(float64(int64(after)-int64(before))/float64(n), "left-bytes/key")
}

// BenchmarkMemorySlidingLog is one admission on a sliding log held at a
// steady number of live entries: the clock moves P/entries per decision,
// so each admission expires one entry and appends one. An O(1) log costs
// the same at 10 entries and at 10,000.
func BenchmarkMemorySlidingLog(b *testing.B) {
	for _, entries := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) {
			now := time.Unix(1_700_000_000, 0)
			s := New(WithClock(func() time.Time { return now }), WithSweepInterval(0))
			defer s.Close()
			reqs := []backend.Request{{Key: "log", Algorithm: backend.SlidingLog, Limit: int64(2 * entries), Period: time.Duration(entries) * time.Millisecond, Cost: 1}}
			res := make([]backend.Result, 1)
			step := func() {
				now = now.Add(time.Millisecond)
				if err := s.DecideInto(ctx, reqs, res); err != nil || !res[0].Allowed {
					b.Fatalf("%+v, %v", res[0], err)
				}
			}
			for range 2 * entries {
				step()
			}
			if got := 2*int64(entries) - res[0].Remaining; got != int64(entries) {
				b.Fatalf("the log holds %d entries, want %d", got, entries)
			}
			b.ReportAllocs()
			for b.Loop() {
				step()
			}
		})
	}
}

// BenchmarkMemoryRollingWindow is one admission on a rolling window (the
// default algorithm), alone on its key and among 100,000 keys, with the
// clock moving a bucket every 16 decisions so that the window shifts as in
// steady traffic.
func BenchmarkMemoryRollingWindow(b *testing.B) {
	for _, nKeys := range []int{1, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", nKeys), func(b *testing.B) {
			now := time.Unix(1_700_000_000, 0)
			s := New(WithClock(func() time.Time { return now }), WithMaxKeys(4<<20), WithSweepInterval(0))
			defer s.Close()
			keys := benchKeys(nKeys)
			reqs := []backend.Request{{Algorithm: backend.RollingWindow, Limit: backend.MaxLimit, Period: time.Second, Cost: 1}}
			res := make([]backend.Result, 1)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%16 == 0 {
					now = now.Add(time.Second / 16)
				}
				reqs[0].Key = keys[i%nKeys]
				if err := s.DecideInto(ctx, reqs, res); err != nil || !res[0].Allowed {
					b.Fatalf("%+v, %v", res[0], err)
				}
				i++
			}
		})
	}
}

// BenchmarkMemoryFlood is a store at its key bound under a flood of fresh
// keys: every decision inserts a key and evicts one (the eviction policy's
// cost per decision), with keys of every algorithm in each shard.
func BenchmarkMemoryFlood(b *testing.B) {
	const bound = 1 << 16
	for _, alg := range []backend.Algorithm{backend.RollingWindow, backend.GCRA, backend.SlidingLog} {
		b.Run(alg.String(), func(b *testing.B) {
			s := New(WithMaxKeys(bound), WithSweepInterval(0), WithLogger(slog.New(slog.DiscardHandler)))
			defer s.Close()
			keys := benchKeys(4 * bound)
			reqs := []backend.Request{{Algorithm: alg, Limit: 3, Period: 15 * time.Minute, Cost: 1}}
			res := make([]backend.Result, 1)
			for i := range bound {
				reqs[0].Key = keys[i]
				if err := s.DecideInto(ctx, reqs, res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				reqs[0].Key = keys[bound+i%(3*bound)]
				if err := s.DecideInto(ctx, reqs, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMemoryAlgorithm is one admission of one rule through DecideInto
// on the process clock, under the rolling window (the default) and under
// GCRA, alone on its key and among 100,000 keys (each decided once before
// timing), with the limit and period of the root module's PublicPath
// benchmark: the rolling window's cost beside the one-value algorithm's.
func BenchmarkMemoryAlgorithm(b *testing.B) {
	for _, alg := range []backend.Algorithm{backend.RollingWindow, backend.GCRA} {
		for _, nKeys := range []int{1, 100_000} {
			b.Run(fmt.Sprintf("%v/keys=%d", alg, nKeys), func(b *testing.B) {
				s := New(WithSweepInterval(0))
				defer s.Close()
				keys := benchKeys(nKeys)
				reqs := []backend.Request{{Algorithm: alg, Limit: backend.MaxLimit, Period: time.Second, Cost: 1}}
				res := make([]backend.Result, 1)
				decide := func(i int) {
					reqs[0].Key = keys[i]
					if err := s.DecideInto(ctx, reqs, res); err != nil || !res[0].Allowed {
						b.Fatalf("%+v, %v", res[0], err)
					}
				}
				for i := range nKeys {
					decide(i)
				}
				b.ReportAllocs()
				i := 0
				cpu := cputime.Now()
				for b.Loop() {
					decide(i)
					if i++; i == nKeys {
						i = 0
					}
				}
				cputime.Report(b, cpu)
			})
		}
	}
}

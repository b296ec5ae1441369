package bench

import (
	"runtime"
	"testing"
	"time"
)

// keysHeld is the number of distinct keys of the memory benchmark;
// keysIdle, of its idle half, fewer so that the run stays short (what is
// left is reported per key either way).
const (
	keysHeld = 1_000_000
	keysIdle = 100_000
)

// idlePeriod is the period, and the idle time after which a library may
// forget a key where it lets one say so, of the idle half of the memory
// benchmark; idleWait is how long that half leaves the keys alone.
const (
	idlePeriod = time.Second
	idleWait   = 3 * time.Second
)

// BenchmarkKeys1M measures the heap each in-memory store holds for a
// million distinct keys (bytes/key), and, for 100k keys, what is left of it
// once every key has been idle for longer than its period and the library's own sweeping,
// with one more decision on a fresh key for libraries that sweep lazily
// (idle-bytes/key; near zero means idle keys are freed). Run it with
// -benchtime=1x; ns/op is meaningless.
func BenchmarkKeys1M(top *testing.B) {
	for _, lib := range memLibs {
		if lib.variant && lib.algo == memLibs[0].algo {
			continue // the same store and algorithm as ceiling's row: the same bytes
		}
		top.Run(lib.name, func(b *testing.B) {
			var held, left float64
			runs := 0
			for b.Loop() {
				held += heapPerKey(b, lib, keysHeld, time.Hour, 0, 0)
				left += heapPerKey(b, lib, keysIdle, idlePeriod, idlePeriod, idleWait)
				runs++
			}
			b.ReportMetric(held/float64(runs), "bytes/key")
			b.ReportMetric(left/float64(runs), "idle-bytes/key")
		})
	}
}

// heapPerKey fills a fresh limiter of lib with n keys under a limit
// of 1 per period (each admitted once: distinct; the last admitted again:
// rejected, its state kept), waits wait, and returns the heap it holds per
// key.
func heapPerKey(b *testing.B, lib memLib, n int, period, idle, wait time.Duration) float64 {
	before := heap()
	l := lib.new(1, period, idle)
	allow := l.worker()
	for i := range n {
		if ok, err := allow(ip(i)); !ok || err != nil {
			b.Fatalf("%s: key %d rejected (err %v) under a limit of 1: keys are not distinct", lib.name, i, err)
		}
	}
	if ok, _ := allow(ip(n - 1)); ok {
		b.Fatalf("%s: key %d admitted twice under a limit of 1: its state was not kept", lib.name, n-1)
	}
	if wait > 0 {
		time.Sleep(wait)
		allow(ip(n)) // a fresh key: libraries that sweep on a call do it now
	}
	after := heap()
	runtime.KeepAlive(allow)
	l.close()
	return float64(int64(after)-int64(before)) / float64(n)
}

// heap is the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

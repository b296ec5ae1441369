package ceiling

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// A timeout says that the answer did not come in time, not why: Redis may
// have been slow, or this process too busy to run the goroutine that reads
// the answer (a flood of requests whose key functions burn CPU). A yield of
// the CPU that takes long, or the Go scheduler's record of how long
// runnable goroutines waited for a CPU, says the process, not the backend,
// was slow: such a timeout does not count against the backend until a
// patient confirmation fails too (Limiter.confirm).

// schedLatencies is the runtime metric: how long goroutines were runnable
// before they ran.
const schedLatencies = "/sched/latencies:seconds"

// lagMeter compares the scheduler's latency histogram now with a reading
// from half a second to a few seconds ago. Answered calls keep a baseline
// (one reading every lagShift at most, a few microseconds), so that the
// first timeout of a starved spell already has one to compare with.
type lagMeter struct {
	next      atomic.Int64 // Unix ns before which answered calls take no reading
	slowYield atomic.Int64 // Unix ns of the last yield that showed a starved process
	mu        sync.Mutex
	sample    []metrics.Sample
	old       lagReading // the baseline
	young     lagReading // becomes the baseline once lagShift old
}

type lagReading struct {
	counts []uint64
	at     time.Time
}

// lagShift is the least age of the baseline, so that a burst of timeouts
// microseconds apart still compares a meaningful stretch of time; lagWindow
// is the most, beyond which a reading says nothing of now.
const (
	lagShift  = 500 * time.Millisecond
	lagWindow = 5 * time.Second
	lagMinAge = 50 * time.Millisecond
)

// The runtime samples a small fraction of goroutine runs into the
// histogram (a few dozen a second on a busy process), so the test is a
// share: since the baseline, at least an eighth of the sampled runs, and at
// least two, waited the threshold or more. A healthy process has next to
// none; a starved one, measured, a fifth to a half.
const lagMinSlow = 2

// tick keeps the baseline fresh; answered calls call it.
func (m *lagMeter) tick(now time.Time) {
	if now.UnixNano() < m.next.Load() || !m.mu.TryLock() {
		return
	}
	defer m.mu.Unlock()
	m.read(now)
}

// read takes a reading, shifting the baseline when the younger one is
// lagShift old, and returns the histogram. m.mu is held.
func (m *lagMeter) read(now time.Time) *metrics.Float64Histogram {
	if m.sample == nil {
		m.sample = []metrics.Sample{{Name: schedLatencies}}
	}
	metrics.Read(m.sample)
	m.next.Store(now.Add(lagShift).UnixNano())
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	h := m.sample[0].Value.Float64Histogram()
	if m.young.at.IsZero() || now.Sub(m.young.at) >= lagShift {
		m.old, m.young = m.young, lagReading{counts: append(m.old.counts[:0], h.Counts...), at: now}
	}
	return h
}

// starved reports whether this process is, or lately was, too busy to run
// its goroutines within a timeout: a yield of the CPU took a tenth of it or
// more, now or within yieldMemory, or many goroutines waited half of it or
// more for a CPU since the baseline (the histogram).
//
// Both are needed. The runtime samples about one goroutine run in eight
// into the histogram, and records a wait only once the goroutine runs, so
// in the first few hundred milliseconds of a starved spell it holds a dozen
// samples, too few to tell (measured: 1 slow of 13 on a process whose
// yields took 150–800 ms). A yield waits in the scheduler's global run
// queue, where a goroutine woken by the network poller (the one that reads
// a backend's reply) waits too, so its latency is the one that matters,
// measured now; it misses only a spell that ended before the timeout was
// judged, which the histogram still holds.
func (m *lagMeter) starved(timeout time.Duration) bool {
	now := time.Now()
	if now.UnixNano()-m.slowYield.Load() < int64(yieldMemory) {
		return true
	}
	if m.histogramStarved(now, timeout/2) {
		return true
	}
	runtime.Gosched()
	after := time.Now()
	if after.Sub(now) >= timeout/10 {
		m.slowYield.Store(after.UnixNano())
		return true
	}
	return false
}

// yieldMemory is how long a slow yield makes the process count as starved:
// one yield can be quick by luck.
const yieldMemory = time.Second

// histogramStarved reports whether, since the baseline, many goroutines
// waited threshold or more for a CPU.
func (m *lagMeter) histogramStarved(now time.Time, threshold time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.read(now)
	if h == nil {
		return false
	}
	base := m.old
	if base.at.IsZero() || now.Sub(base.at) > lagWindow {
		base = m.young // a spell right after the start: the only reading there is
	}
	if now.Sub(base.at) < lagMinAge || now.Sub(base.at) > lagWindow || len(base.counts) != len(h.Counts) {
		return false
	}
	var slow, total uint64
	for i, c := range h.Counts {
		total += c - base.counts[i]
		// Buckets[i] is the lower bound of bucket i.
		if h.Buckets[i] >= threshold.Seconds() {
			slow += c - base.counts[i]
		}
	}
	return slow >= lagMinSlow && 8*slow >= total
}

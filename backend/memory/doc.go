// Package memory is ceiling's embedded backend: rate-limit state in
// process memory, decided exactly, all or nothing, with no I/O.
//
// It implements the integer arithmetic of backend/ALGORITHMS.md, the same
// as the Redis backend, and passes the same conformance suite
// (package backendtest). What each algorithm promises, and when to pick it:
//
//   - [backend.RollingWindow] (the default): never more than the limit in
//     any rolling period, in 17 bucket counts per key whatever the limit.
//     Counts are as wide as the key's limit needs: a key's slot (state and
//     digest) takes 48 bytes under a limit below 255, 64 below 65,535, 104
//     above or for a period over about 19 hours.
//   - [backend.GCRA] (token bucket): a smooth rate with a burst, three
//     8-byte values per key (the arrival time, when it was written, for a
//     clock that steps back, and the emission interval, for a limit that
//     changes): a 40-byte slot.
//     Pick it for APIs: "10 per second, burst 20". It is a
//     rate, not a count: "30 per minute, burst 30" admits up to 59 in the
//     first rolling minute.
//   - [backend.SlidingLog]: exactly "at most N in any rolling window". One
//     entry per distinct admission instant, so O(N) per key: pick it when N
//     is small and the bound must be exact (3 OTPs per 15 minutes).
//   - [backend.SlidingWindow] (counter of two weighted windows): O(1), close
//     to a rolling count with evenly spread traffic, but if a whole window's
//     limit arrived at its very end, the next window admits up to L·x/P by x
//     into it: nearly 2L in one rolling period at worst.
//   - [backend.FixedWindow]: the cheapest; admits L at the last instant of a
//     window and L more at the first of the next, 2L in a moment.
//
// A Store is one process's view: several instances behind a load balancer
// each enforce their own limit (N instances admit up to N×L). Use the Redis
// backend to share a limit.
//
// Tables are between 2/5 and 4/5 full, and 4/5 full once a Store nears its
// key bound, so a key holds its slot's size to twice that in heap: a
// million GCRA keys about 67 MB before their slot grew to 40 bytes, rolling windows under small limits 100 MB
// (BenchmarkMemoryIdleKeys); 900,000 keys in a Store of the default bound
// about 42 and 70 MB.
//
// Memory is bounded: keys are stored as 128-bit digests under per-Store
// random seeds (no key strings are kept; collisions cannot be aimed), keys
// whose state is back to full are deleted on their next write or by the
// janitor ([WithSweepInterval]), tables are rebuilt smaller once they empty,
// and [WithMaxKeys] caps the number of keys. At the cap a new key evicts
// the sampled key whose removal gives back the least quota (one at rest,
// else the one holding the fewest units), so a flood of fresh keys evicts
// its own kind rather than a key that spent its limit; an eviction that
// gives units back is counted ([Store.Evictions], reported by the limiter's
// health report and metrics) and logged once per burst. A sliding log
// also holds its entries, at most one per admission in its window.
//
// The fast path is [Store.DecideInto] (see [backend.DecideInto]): up to
// eight rules per call without allocating.
package memory

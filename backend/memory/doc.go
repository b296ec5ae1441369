// Package memory is ceiling's embedded backend: rate-limit state in
// process memory, decided exactly, all or nothing, with no I/O.
//
// It implements the integer arithmetic of backend/ALGORITHMS.md, as the
// Redis backend does, and passes the same conformance suite (package
// backendtest). What each algorithm promises:
//
//   - [backend.RollingWindow] (the default): never more than the limit in
//     any rolling period, in a fixed number of bucket counts per key, each
//     as wide as the key's limit needs.
//   - [backend.GCRA] (token bucket): a smooth rate with a burst, in three
//     values per key. It is a rate, not a count: "30 per minute, burst 30"
//     admits up to 59 in the first rolling minute.
//   - [backend.SlidingLog]: exactly "at most N in any rolling window", one
//     entry per distinct admission instant: for small N.
//   - [backend.SlidingWindow]: two weighted windows, close to a rolling
//     count for even traffic, nearly twice the limit at worst.
//   - [backend.FixedWindow]: the cheapest; twice the limit across a window
//     boundary.
//
// A Store is one process's view: N instances each enforcing their own
// limit admit up to N times it. Use the Redis backend to share a limit.
//
// Memory is bounded: keys are stored as 128-bit digests under per-Store
// random seeds (no key strings are kept; collisions cannot be aimed), keys
// back to full are deleted on their next write or by the janitor
// ([WithSweepInterval]), tables shrink once they empty, and [WithMaxKeys]
// caps the number of keys. At the cap a new key evicts the sampled key
// whose removal gives back the least quota, so a flood of fresh keys evicts
// its own kind; an eviction that gives units back is counted
// ([Store.Evictions]) and logged once per burst. BENCHMARKS.md has the
// bytes per key.
//
// [Store.DecideInto] decides a few rules per call without allocating.
package memory

// Package memory is ceiling's embedded backend: rate-limit state in
// process memory, decided exactly, all or nothing, with no I/O.
//
// It implements the integer arithmetic of backend/ALGORITHMS.md for every
// [backend.Algorithm], as the Redis backend does, and passes the same
// conformance suite (package backendtest). A Store is one process's view:
// N instances each enforcing their own limit admit up to N times it. Use
// the Redis backend to share a limit.
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

// Package bench measures ceiling against the Go rate limiters people use
// today, on the same work in the same run: in-memory decisions, whole
// middleware, Redis decisions, exactness across instances, memory per key,
// the window-boundary burst and the cost of a flood from a rejected key.
// ceiling is timed as a user runs it (the middleware with a key function
// and its headers; Limiter.Decide without HTTP) beside its store alone, so
// that what the limiter adds to the store is in every table.
//
// It is a module of its own so that none of the peers ever becomes a
// dependency of ceiling. Its plain tests (`go test`) check, quickly, that
// every adapter enforces the limit it is given and that ceiling is exact;
// the numbers come from the benchmarks, which run.sh runs against a
// redis-server of its own and turns into the tables of BENCHMARKS.md at the
// repository root.
package bench

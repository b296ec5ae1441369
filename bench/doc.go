// Package bench measures ceiling against the Go rate limiters people use
// today, on the same work in the same run: in-memory decisions, whole
// middleware, Redis decisions, exactness across instances, memory per key,
// the window-boundary burst and the cost of a flood from a rejected key.
//
// It is a module of its own so that none of the peers ever becomes a
// dependency of ceiling. Its plain tests (`go test`) check, quickly, that
// every adapter enforces the limit it is given and that ceiling is exact;
// the numbers come from the benchmarks, which run.sh runs against a
// redis-server of its own and turns into the tables of BENCHMARKS.md at the
// repository root.
package bench

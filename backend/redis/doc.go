// Package redis is ceiling's Redis backend: a [backend.Backend] on any
// go-redis v9 [redis.UniversalClient] (a single node, Sentinel failover or
// Redis Cluster), so that every instance of a service shares one exact
// limit.
//
// Each decision is one run of a Lua function (FCALL; the library is loaded
// where a node has none, and a server without functions gets EVALSHA): it
// reads every rule's state, takes the time from the server's TIME, decides
// with the arithmetic of backend/ALGORITHMS.md (lib.lua, each algorithm
// once) and writes all or nothing, with each key's expiry. On Cluster a request's keys are grouped
// by hash slot, one script per slot in parallel, and the slots that
// consumed are refunded if another rejects.
//
// Decisions made at the same time share round trips; a lone decision is
// sent by its caller. Decide returns by its context's deadline whatever
// Redis does, a decision takes effect at most once (go-redis never sends a
// script again after a lost reply), and errors wrap the kind of failure
// (backend.ErrUnreachable, ErrAuth, ErrReadOnly, ErrOutOfMemory). A deny
// cache ([WithDenyCache]) answers keys known to be rejected without a
// round trip. It needs Redis 6.2 or newer. README.md beside this file
// covers connecting and the details.
package redis

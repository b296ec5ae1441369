// Package redis is ceiling's Redis backend: a [backend.Backend] on any
// go-redis v9 [redis.UniversalClient] (a single node, Sentinel failover, or
// Redis Cluster), so that every instance of a service shares one exact
// limit.
//
// Each decision is one Lua script, run with EVALSHA (reloaded transparently
// after SCRIPT FLUSH, a restart or a failover): it reads the state of every
// rule of the request, takes the time from the server's TIME (so instances
// with skewed clocks agree), decides with the arithmetic of
// backend/ALGORITHMS.md, and writes all or nothing, setting each written
// key's expiry in the same script so idle keys disappear by themselves. (A
// call of one GCRA, one rolling-window or one sliding-log request, the most
// common, runs gcra.lua, rolling.lua or slidinglog.lua, the same arithmetic
// without the general script's bookkeeping, at about half its Redis CPU;
// every other call runs decide.lua.) On
// Redis Cluster the keys of a request are grouped by hash slot, one script
// per slot sent in parallel; if any slot rejects, the slots that consumed
// are refunded, so no CROSSSLOT error ever reaches the caller.
//
// Decisions made at the same time share round trips: while the store's
// round trips to a node are all in flight, the decisions that arrive wait
// and go out together in the next pipelined write, each still decided on
// its own, all or nothing; a lone decision is written at once, by its
// caller when the client keeps its context's deadline
// (ContextTimeoutEnabled). Decide
// returns by its context's deadline whatever Redis does, and a decision or
// a refund takes effect at most once: go-redis never sends a script again
// after a lost reply, whatever the client's MaxRetries. Errors wrap the
// kind of failure their cause shows (backend.ErrUnreachable, ErrAuth,
// ErrReadOnly, ErrOutOfMemory).
//
// Keys are stored as prefix:{tag}:rule (see [WithPrefix]); ceiling passes
// {tag}:rule, the tag a fixed-length digest of the key value that holds no
// raw identifier and no byte a client sent, and that puts every rule of
// one value in one Cluster slot. A deny cache (see [WithDenyCache])
// answers keys that are known to be rejected without a round trip.
//
// The script needs Redis 6.2 or newer (or a compatible server running Lua
// scripts with effects replication, the default since Redis 5); it does not
// call redis.replicate_commands.
//
// See README.md beside this file for connecting to Redis, Sentinel and
// Cluster.
package redis

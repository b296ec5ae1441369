package redis

import (
	"context"
	"fmt"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// scriptOp is one run of script on keys with args, bound for the node of
// its first key.
func scriptOp(ctx context.Context, script *redis.Script, keys []string, args []any) op {
	return op{script: script, key: keys[0], cmd: evalSha(ctx, script, keys, args)}
}

// evalSha is the EVALSHA command of script on keys with args.
func evalSha(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return redis.NewCmd(ctx, append(a, args...)...)
}

// eval runs script once on keys with args, sharing a round trip with the
// decisions made at the same time, and returns its reply, or an error
// wrapping the kind of failure.
func (s *Store) eval(ctx context.Context, script *redis.Script, keys []string, args []any) (any, error) {
	w, ops := newWaiter(ctx, 1)
	ops[0] = scriptOp(ctx, script, keys, args)
	if err := s.call(ctx, w, ops, false); err != nil {
		w.release(false)
		return nil, s.classify(err)
	}
	v, err := ops[0].cmd.Result()
	w.release(true)
	return v, s.classify(err)
}

// runGroups runs the decide script once per group, every group in the same
// round trip per node (the nodes in parallel), and decodes each group's
// reply. detached groups are sent even when ctx ends first (a refund must
// land whoever waits for it), with a round trip of at least refundTimeout.
func (s *Store) runGroups(ctx context.Context, keys [][]string, reqs [][]backend.Request, stamps [][]int64, withPeeks, detached bool) ([]reply, []error) {
	w, ops := newWaiter(ctx, len(reqs))
	for g := range reqs {
		var st []int64
		if stamps != nil {
			st = stamps[g]
		}
		ops[g] = scriptOp(ctx, decideScript, keys[g], s.args(reqs[g], st, withPeeks))
	}
	err := s.call(ctx, w, ops, detached)
	replies := make([]reply, len(reqs))
	errs := make([]error, len(reqs))
	for g := range reqs {
		if err != nil {
			errs[g] = fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs[g]), s.classify(err))
			continue
		}
		v, e := ops[g].cmd.Result()
		if e != nil {
			errs[g] = fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs[g]), s.classify(e))
			continue
		}
		replies[g], errs[g] = decode(v, reqs[g], withPeeks)
	}
	w.release(err == nil)
	return replies, errs
}

// runPipelined decides each group of a cross-slot request with one script
// per group; see runGroups.
func (s *Store) runPipelined(ctx context.Context, keys [][]string, reqs [][]backend.Request, stamps [][]int64, withPeeks bool) ([]reply, []error) {
	return s.runGroups(ctx, keys, reqs, stamps, withPeeks, false)
}

// settle sends a refund's groups, detached from ctx: Decide waits for them
// only until ctx ends, and they are sent and applied (once) either way.
func (s *Store) settle(ctx context.Context, keys [][]string, reqs [][]backend.Request, stamps [][]int64) {
	s.runGroups(ctx, keys, reqs, stamps, false, true)
}

// del deletes keys, stored keys all, on the pipeliners of their nodes (one
// DEL per key on Cluster, where a DEL over several slots is refused), and
// returns by ctx's deadline like a decision.
func (s *Store) del(ctx context.Context, keys []string) error {
	n := 1
	if s.cluster != nil {
		n = len(keys)
	}
	w, ops := newWaiter(ctx, n)
	if s.cluster == nil {
		args := make([]any, 0, 1+len(keys))
		args = append(args, "del")
		for _, k := range keys {
			args = append(args, k)
		}
		ops[0] = op{key: keys[0], cmd: redis.NewCmd(ctx, args...)}
	} else {
		for i, k := range keys {
			ops[i] = op{key: k, cmd: redis.NewCmd(ctx, "del", k)}
		}
	}
	if err := s.call(ctx, w, ops, false); err != nil {
		w.release(false)
		return s.classify(err)
	}
	defer w.release(true)
	for _, o := range ops {
		if err := o.cmd.Err(); err != nil {
			return s.classify(err)
		}
	}
	return nil
}

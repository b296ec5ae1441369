package redis

import (
	"context"
	"fmt"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// scriptOp is one run of script on keys with args, bound for the node of
// its first key.
func (s *Store) scriptOp(ctx context.Context, script *redis.Script, keys []string, args []any) op {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(s.command(a, script), len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return op{script: script, key: keys[0], cmd: redis.NewCmd(ctx, append(a, args...)...)}
}

// runGroups runs decideScript once per group, the groups of one node in
// one round trip (the nodes in parallel), and decodes each reply. detached
// groups (a refund, which must land) are sent even when ctx ends first,
// with a round trip of at least refundTimeout.
func (s *Store) runGroups(ctx context.Context, keys [][]string, reqs [][]backend.Request, withPeeks, detached bool) ([]reply, []error) {
	w, ops := newWaiter(ctx, len(reqs))
	for g := range reqs {
		ops[g] = s.scriptOp(ctx, decideScript, withOnceKeys(keys[g], reqs[g]), s.args(reqs[g], withPeeks))
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

// del deletes stored keys (one DEL per key on Cluster, where a DEL over
// several slots is refused), returning by ctx's deadline like a decision.
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

package redis

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed batch.lua
var batchSource string

// batchScript decides several lone decisions (calls of one GCRA, one
// rolling-window or one sliding-log request) of a batch in one run: see
// batch.lua.
var batchScript = redis.NewScript(gcraSource + rollingSource + slidingLogSource + batchSource)

// trip is one command of a round trip: an op's own, or a run of
// batchScript deciding several ops.
type trip struct {
	cmd    *redis.Cmd
	script *redis.Script // nil: not a script
	ops    []*op         // the ops it answers, in order
	shared bool          // cmd is batchScript's: its reply holds each op's
}

// shareable reports whether o is a lone decision that may share a run of
// batchScript: gcra.lua's, rolling.lua's or slidinglog.lua's, without a
// request id.
func shareable(o *op) bool {
	return !o.retry && (o.script == gcraScript || o.script == rollingScript || o.script == slidingLogScript)
}

// trips groups ops into the commands of one round trip: each run of
// consecutive shareable ops (of one hash slot, on Cluster) is one command
// of batchScript; every other op is its own command. Decisions keep their
// order.
func (s *Store) trips(ctx context.Context, ops []*op) []trip {
	trips := make([]trip, 0, len(ops))
	for i := 0; i < len(ops); {
		j := i + 1
		if shareable(ops[i]) {
			for j < len(ops) && shareable(ops[j]) && (s.cluster == nil || slot(ops[j].key) == slot(ops[i].key)) {
				j++
			}
		}
		if j-i > 1 {
			trips = append(trips, trip{cmd: batchCmd(ctx, ops[i:j]), script: batchScript, ops: ops[i:j], shared: true})
		} else {
			trips = append(trips, trip{cmd: ops[i].cmd, script: ops[i].script, ops: ops[i:j]})
		}
		i = j
	}
	return trips
}

// batchCmd is the EVALSHA of batchScript deciding ops, lone decisions all,
// from their own commands' arguments: evalsha, sha, 1, key, then the ARGV
// of decide.lua for one request (now, minimum TTL, peeks, algorithm,
// limit, period, burst, cost, force, shadow, stamp).
func batchCmd(ctx context.Context, ops []*op) *redis.Cmd {
	a := make([]any, 0, 4+8*len(ops))
	a = append(a, "evalsha", batchScript.Hash(), len(ops))
	for _, o := range ops {
		a = append(a, o.key)
	}
	a = append(a, ops[0].cmd.Args()[5])
	for _, o := range ops {
		x := o.cmd.Args()
		force, _ := x[12].(int)
		shadow, _ := x[13].(int)
		a = append(a, x[4], x[7], x[8], x[9], x[10], x[11], force+2*shadow)
	}
	return redis.NewCmd(ctx, a...)
}

// answer gives each op of t its reply: a shared command's reply holds one
// per op, in order.
func (t *trip) answer() {
	if !t.shared {
		t.ops[0].cmd = t.cmd
		return
	}
	v, err := t.cmd.Result()
	replies, ok := v.([]any)
	if err == nil && (!ok || len(replies) != len(t.ops)) {
		err = fmt.Errorf("%w: a batch of %d decisions answered %T of %d", errReply, len(t.ops), v, len(replies))
	}
	for i, o := range t.ops {
		switch {
		case err != nil:
			o.cmd.SetErr(err)
		default:
			if e, isErr := replies[i].(error); isErr {
				o.cmd.SetErr(e)
			} else {
				o.cmd.SetVal(replies[i])
			}
		}
	}
}

// send sends ops in one round trip, then re-sends with EVAL, in one more,
// the scripts a node did not have cached.
func (s *Store) send(ctx context.Context, ops []*op) {
	trips := s.trips(ctx, ops)
	s.roundTrip(ctx, trips)
	var again []trip
	for i := range trips {
		if t := &trips[i]; t.script != nil && isNoScript(t.cmd.Err()) {
			t.cmd = redis.NewCmd(ctx, evalArgs(t.script, t.cmd)...)
			again = append(again, *t)
		}
	}
	if len(again) > 0 {
		s.roundTrip(ctx, again)
	}
	for i := range trips {
		trips[i].answer()
	}
}

// roundTrip writes trips' commands at once and reads their replies.
func (s *Store) roundTrip(ctx context.Context, trips []trip) {
	if len(trips) == 1 {
		s.client.Process(ctx, noRetry{trips[0].cmd}) // the error is the cmd's
		return
	}
	pipe := s.client.Pipeline()
	for _, t := range trips {
		pipe.Process(ctx, noRetry{t.cmd})
	}
	pipe.Exec(ctx) // errors are read per command
}

// evalArgs are the arguments of cmd, an EVALSHA of script, as an EVAL of
// its source, which also loads it into the node's script cache.
func evalArgs(script *redis.Script, cmd *redis.Cmd) []any {
	var src sourceOf
	script.Eval(context.Background(), &src, nil)
	args := append([]any(nil), cmd.Args()...)
	args[0], args[1] = "eval", src.src
	return args
}

// sourceOf is a redis.Scripter that runs nothing: handed to Script.Eval, it
// learns the script's source.
type sourceOf struct {
	redis.Scripter
	src string
}

func (s *sourceOf) Eval(_ context.Context, src string, _ []string, _ ...any) *redis.Cmd {
	s.src = src
	return nil
}

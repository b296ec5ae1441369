package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// trip is one command of a round trip: an op's own, or a run of
// batchScript deciding several lone calls.
type trip struct {
	cmd    *redis.Cmd
	script *redis.Script // nil: not a script
	ops    []*op         // the ops it answers, in order
	shared bool          // cmd is batchScript's: its reply holds each op's
}

// shareable reports whether o is a lone call not yet built.
func shareable(o *op) bool {
	return o.cmd == nil && o.script == batchScript
}

// trips appends one round trip's commands: each run of consecutive
// shareable ops (of one slot, on Cluster) is one run of batchScript, every
// other op its own command, in order.
func (s *Store) trips(ctx context.Context, ops []*op, trips []trip) []trip {
	for i := 0; i < len(ops); {
		j := i + 1
		if shareable(ops[i]) {
			for j < len(ops) && shareable(ops[j]) && (s.cluster == nil || slot(ops[j].key) == slot(ops[i].key)) {
				j++
			}
		}
		cmd := ops[i].cmd
		if cmd == nil {
			cmd = s.batchCmd(ctx, ops[i:j])
		}
		trips = append(trips, trip{cmd: cmd, script: ops[i].script, ops: ops[i:j], shared: j-i > 1})
		i = j
	}
	return trips
}

// batchCmd is batchScript's command deciding ops, lone calls all.
func (s *Store) batchCmd(ctx context.Context, ops []*op) *redis.Cmd {
	a := make([]any, 0, 5+6*len(ops)+4*min(len(ops), 4))
	return redis.NewCmd(ctx, s.batchArgs(s.command(a, batchScript), ops)...)
}

// answer gives each op of t its command, and where its answer starts in
// a shared command's reply.
func (t *trip) answer() {
	for i, o := range t.ops {
		o.cmd = t.cmd
		if t.shared {
			o.at = loneFields * i
		}
	}
}

// send sends ops in one round trip, then re-sends with EVAL the calls a
// node could not run, and on Cluster those answered TRYAGAIN. It reports
// whether a node lacked the library and ran a call's EVAL, for the caller
// to load the library once the calls are answered.
func (s *Store) send(ctx context.Context, ops []*op) (lost bool) {
	var buf [1]trip // a lone call's, without an allocation
	trips := s.trips(ctx, ops, buf[:0])
	s.roundTrip(ctx, trips)
	all := make([]int, len(trips))
	for i := range all {
		all[i] = i
	}
	lost = s.load(ctx, trips, all)
	lost = s.tryAgain(ctx, trips) || lost
	for i := range trips {
		trips[i].answer()
	}
	return lost
}

// load re-sends, in one round trip, those of trips[at] a node could not
// run, each as an EVAL of its script's source (which the node then caches
// as a script): a script it does not have, a function it does not have or
// refuses, or a function refused whole for want of memory or replicas,
// where a script runs until its first write. A node that lacks the library
// and may not run EVAL either gets the library at once, and the function
// again. load reports whether a node lacks the library and ran a call's
// EVAL, for the caller to load the library once the calls are answered.
func (s *Store) load(ctx context.Context, trips []trip, at []int) (lost bool) {
	var again, missing []int // indices into trips, whose pointers would move them to the heap
	for _, i := range at {
		t := &trips[i]
		err := t.cmd.Err()
		if t.script == nil || err == nil {
			continue
		}
		switch {
		case isNoScript(err):
		case redis.HasErrorPrefix(err, "Function not found"):
			missing = append(missing, i)
		case redis.HasErrorPrefix(err, "OOM") || redis.HasErrorPrefix(err, "NOREPLICAS"):
			if t.cmd.Name() != "fcall" {
				continue // a script's answer: it ran up to a write
			}
		case refusesFunctions(err):
			s.refuseFunctions(err)
		default:
			continue
		}
		t.cmd = redis.NewCmd(ctx, withHead(t.cmd, "eval", source(t.script))...)
		again = append(again, i)
	}
	s.resend(ctx, trips, again)
	again = again[:0]
	for _, i := range missing {
		t := &trips[i]
		switch err := t.cmd.Err(); {
		case err == nil:
			lost = true
		case redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(strings.ToLower(err.Error()), "eval"):
			if s.loadLibrary(ctx) {
				t.cmd = redis.NewCmd(ctx, withHead(t.cmd, s.command(nil, t.script)...)...)
				again = append(again, i)
			}
		}
	}
	s.resend(ctx, trips, again)
	return lost
}

// resend sends trips[at] again, in one round trip.
func (s *Store) resend(ctx context.Context, trips []trip, at []int) {
	if len(at) == 0 {
		return
	}
	again := make([]trip, len(at))
	for j, i := range at {
		again[j] = trips[i]
	}
	s.roundTrip(ctx, again)
}

// loadLibrary loads the function library where a node had none (a
// restart, FUNCTION FLUSH, a node new to the Cluster): into the one node,
// or into every Cluster master (the node that answered may be the target
// of a slot's migration, which the slot map does not name yet), skipping
// those another caller is loading it into. It reports whether every load
// it sent succeeded. Each is sent once: go-redis would resend it on
// READONLY, past the call's bound. A node that refuses it makes the Store
// send EVALSHA for a while; a failure of another kind is logged, sampled,
// and leaves the load to the next caller that finds the library missing.
func (s *Store) loadLibrary(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	if s.cluster == nil {
		return s.loadInto(ctx, s.client, "")
	}
	var failed atomic.Bool
	err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		if !s.loadInto(ctx, n, n.Options().Addr) {
			failed.Store(true)
		}
		return nil
	})
	return err == nil && !failed.Load()
}

// loadInto loads the library into node, whose address is addr, unless a
// caller is loading it there, and reports whether it did.
func (s *Store) loadInto(ctx context.Context, node interface {
	Process(context.Context, redis.Cmder) error
}, addr string) bool {
	if _, busy := s.loading.LoadOrStore(addr, struct{}{}); busy {
		return false
	}
	defer s.loading.Delete(addr)
	cmd := redis.NewCmd(ctx, "function", "load", "replace", library)
	_ = node.Process(ctx, noRetry{cmd})
	switch err := cmd.Err(); {
	case refusesFunctions(err):
		s.refuseFunctions(err)
	case err != nil:
		s.logReply(fmt.Errorf("loading the function library: %w", err))
	}
	return cmd.Err() == nil
}

// loadTimeout bounds a library load, within the call's own bound: a load
// whose reply is lost holds up the call that found the library missing no
// longer than that.
const loadTimeout = time.Second

// refusesFunctions reports an error that says a server will not run the
// library: it does not know FCALL or FUNCTION (before Redis 7, or a
// compatible server without them), the user may not call them, or it
// could not register the library. Each names the command it refused, so
// that no error of a function that ran (and must not run again) is taken
// for one.
func refusesFunctions(err error) bool {
	if err == nil || !isReply(err) {
		return false
	}
	msg := strings.ToLower(err.Error())
	named := strings.Contains(msg, "fcall") || strings.Contains(msg, "function")
	return strings.Contains(msg, "registering functions") ||
		(named && (strings.Contains(msg, "unknown command") || strings.HasPrefix(msg, "noperm")))
}

// scriptsFor is how long a Store sends EVALSHA after a server refused
// functions: an ACL may change, a library lost may be loaded again by
// someone allowed to, a server may be upgraded.
const scriptsFor = time.Minute

// refuseFunctions makes the Store send EVALSHA for scriptsFor, and says so.
func (s *Store) refuseFunctions(err error) {
	now := time.Now().UnixNano()
	if old := s.scriptsUntil.Load(); now < old || !s.scriptsUntil.CompareAndSwap(old, now+int64(scriptsFor)) {
		return // already refused, by this call or another
	}
	if l := s.logs.Load(); l != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: Redis refused functions; sending EVALSHA, which costs Redis more CPU per decision, for "+scriptsFor.String(),
			slog.String("err", err.Error()))
	}
}

// tryAgainPause is the first pause before re-sending a command answered
// TRYAGAIN (each further one doubles), tryAgainFor how long it goes on
// when ctx has no deadline.
const (
	tryAgainPause = 5 * time.Millisecond
	tryAgainFor   = time.Second
)

// tryAgain re-sends, after a pause, the commands a Cluster node answered
// TRYAGAIN, while ctx's deadline leaves time for the next pause (and
// reports a node that lacked the library, as load): a slot
// half moved by a resharding refuses a script over keys on both sides
// without running it (so re-sending cannot apply it twice), and the move
// completes within milliseconds. The doubling pauses keep a slot left half
// moved cheap for its node.
func (s *Store) tryAgain(ctx context.Context, trips []trip) (lost bool) {
	if s.cluster == nil {
		return false
	}
	end, ok := ctx.Deadline()
	if !ok {
		end = time.Now().Add(tryAgainFor)
	}
	for pause := tryAgainPause; ; pause *= 2 {
		var idx []int
		for i := range trips {
			if redis.HasErrorPrefix(trips[i].cmd.Err(), "TRYAGAIN") {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 || time.Until(end) < 2*pause {
			return lost
		}
		timer := time.NewTimer(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
		if ctx.Err() != nil {
			return lost
		}
		again := make([]trip, len(idx))
		for j, i := range idx {
			t := &trips[i]
			t.cmd = redis.NewCmd(ctx, t.cmd.Args()...)
			again[j] = *t
		}
		s.roundTrip(ctx, again)
		lost = s.load(ctx, trips, idx) || lost
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

// withHead is cmd's arguments, a run of a script, with head (a command
// and what names the script) in place of its first two.
func withHead(cmd *redis.Cmd, head ...any) []any {
	return append(head, cmd.Args()[2:]...)
}

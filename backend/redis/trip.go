package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
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

// send sends ops in one round trip, then re-sends with EVAL the scripts a
// node did not have cached, and on Cluster those answered TRYAGAIN.
func (s *Store) send(ctx context.Context, ops []*op) {
	var buf [1]trip // a lone call's, without an allocation
	trips := s.trips(ctx, ops, buf[:0])
	s.roundTrip(ctx, trips)
	all := make([]int, len(trips))
	for i := range all {
		all[i] = i
	}
	s.load(ctx, trips, all)
	s.tryAgain(ctx, trips)
	for i := range trips {
		trips[i].answer()
	}
}

// load re-sends, in one round trip, those of trips[at] a node could not
// run, each as an EVAL of its script's source (which the node then caches
// as a script). A node without the library, whose EVAL it then ran, gets
// the library loaded; a server that refuses FCALL itself makes the Store
// send EVALSHA instead.
func (s *Store) load(ctx context.Context, trips []trip, at []int) {
	var again []trip
	var lost *trip // a call whose node has no library
	for _, i := range at {
		t := &trips[i]
		err := t.cmd.Err()
		if t.script == nil || err == nil {
			continue
		}
		switch {
		case isNoScript(err):
		case redis.HasErrorPrefix(err, "Function not found"):
			lost = t
		case refusesFunctions(err):
			s.refuseFunctions(err)
		default:
			continue
		}
		t.cmd = redis.NewCmd(ctx, evalArgs(t.script, t.cmd)...)
		again = append(again, *t)
	}
	if len(again) > 0 {
		s.roundTrip(ctx, again)
	}
	if lost != nil && lost.cmd.Err() == nil {
		s.loadLibrary(ctx, lost.ops[0].key)
	}
}

// loadLibrary loads the function library into the node of key, which had
// none (a restart, FUNCTION FLUSH, a node new to the Cluster) and ran an
// EVAL just now, unless another caller is loading it there. It is sent
// once: go-redis would resend it on READONLY, past the call's bound. A
// node that refuses it makes the Store send EVALSHA; a failure of another
// kind is logged, sampled, and leaves the load to the next caller that
// finds the library missing.
func (s *Store) loadLibrary(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	var node interface {
		Process(context.Context, redis.Cmder) error
	} = s.client
	addr := "" // the one node's, without Cluster
	if s.cluster != nil {
		n, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return
		}
		node, addr = n, n.Options().Addr
	}
	if _, busy := s.loading.LoadOrStore(addr, struct{}{}); busy {
		return
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

// refuseFunctions makes the Store send EVALSHA from now on, and says so
// once.
func (s *Store) refuseFunctions(err error) {
	if l := s.logs.Load(); s.scriptsOnly.CompareAndSwap(false, true) && l != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: Redis refused functions; sending EVALSHA, which costs Redis more CPU per decision",
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
// TRYAGAIN, while ctx's deadline leaves time for the next pause: a slot
// half moved by a resharding refuses a script over keys on both sides
// without running it (so re-sending cannot apply it twice), and the move
// completes within milliseconds. The doubling pauses keep a slot left half
// moved cheap for its node.
func (s *Store) tryAgain(ctx context.Context, trips []trip) {
	if s.cluster == nil {
		return
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
			return
		}
		timer := time.NewTimer(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		again := make([]trip, len(idx))
		for j, i := range idx {
			t := &trips[i]
			t.cmd = redis.NewCmd(ctx, t.cmd.Args()...)
			again[j] = *t
		}
		s.roundTrip(ctx, again)
		s.load(ctx, trips, idx)
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

// evalArgs are cmd's arguments, an FCALL or EVALSHA of script, as an EVAL
// of its source, which also loads it into the node's script cache.
func evalArgs(script *redis.Script, cmd *redis.Cmd) []any {
	args := append([]any(nil), cmd.Args()...)
	args[0], args[1] = "eval", source(script)
	return args
}

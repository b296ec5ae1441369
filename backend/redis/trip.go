package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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
// node could not run, and on Cluster those answered TRYAGAIN.
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
// as a script): a script it does not have, a function it does not have or
// refuses, or a function refused whole, before it ran, for want of memory,
// of replicas or of a working disk, where a script runs until its first
// write (the Store then sends EVALSHA for loadTimeout). A node that lacked
// the library gets it in the background; one that may not run EVAL either
// gets it at once, and the function again.
func (s *Store) load(ctx context.Context, trips []trip, at []int) {
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
		case underPressure(err):
			if t.cmd.Name() != "fcall" {
				continue // a script's answer: it ran up to a write
			}
			s.useScripts(loadTimeout) // which answer what writes nothing meanwhile
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
	lost := false
	for _, i := range missing {
		t := &trips[i]
		switch err := t.cmd.Err(); {
		case err == nil:
			lost = true
		case redis.HasErrorPrefix(err, "NOPERM") && strings.Contains(strings.ToLower(err.Error()), "'eval'"):
			if s.loadNow(ctx, t.ops[0].key) {
				t.cmd = redis.NewCmd(ctx, withHead(t.cmd, s.command(nil, t.script)...)...)
				again = append(again, i)
			}
		}
	}
	s.resend(ctx, trips, again)
	if lost {
		go s.loadSoon()
	}
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

// processor is a client, or one node of a Cluster client.
type processor interface {
	Process(context.Context, redis.Cmder) error
}

// loadSoon loads the library, off every call's path, where a call found a
// node without it (a restart, FUNCTION FLUSH, a node new to the Cluster)
// and ran its EVAL: into the one node, or into every Cluster master, since
// the node may be the target of a slot's migration, which the slot map
// does not name for that slot yet.
func (s *Store) loadSoon() {
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	if s.cluster == nil {
		s.loadInto(ctx, s.client, "", false)
		return
	}
	_ = s.cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		s.loadInto(ctx, n, n.Options().Addr, false)
		return nil
	})
}

// loadNow loads the library into the node of key, or waits for the load
// another caller runs there, for a call that needs the function answered
// now (its user may not run EVAL); it reports whether the library is
// there.
func (s *Store) loadNow(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	var node processor = s.client
	addr := ""
	if s.cluster != nil {
		n, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return false
		}
		node, addr = n, n.Options().Addr
	}
	return s.loadInto(ctx, node, addr, true)
}

// loadInto loads the library into node, whose address is addr, and reports
// whether it is there. It is sent once (go-redis would resend it on
// READONLY), one load at a time per node: a caller that finds one in
// flight waits for it when wait is set, or leaves it. After a failure, no
// load is sent to the node for loadTimeout (scriptsFor after a refusal);
// it is logged, sampled. A server that cannot hold the library at all (no
// FUNCTION, a library it cannot register) makes the Store send EVALSHA for
// scriptsFor; a user refused FUNCTION leaves the library to someone who
// may load it.
func (s *Store) loadInto(ctx context.Context, node processor, addr string, wait bool) bool {
	mine, other := s.loads.start(addr, time.Now())
	if mine == nil {
		if other == nil || !wait {
			return false
		}
		select {
		case <-other:
			return s.loads.loaded(addr)
		case <-ctx.Done():
			return false
		}
	}
	cmd := redis.NewCmd(ctx, "function", "load", "replace", library)
	_ = node.Process(ctx, noRetry{cmd})
	err := cmd.Err()
	pause := time.Duration(0)
	switch {
	case err == nil:
	case refusesFunctions(err):
		pause = scriptsFor
		if !redis.HasErrorPrefix(err, "NOPERM") {
			s.refuseFunctions(err)
		} else {
			s.logReply(fmt.Errorf("loading the function library: %w", err))
		}
	default:
		pause = loadTimeout
		if underPressure(err) {
			s.useScripts(loadTimeout)
		}
		s.logReply(fmt.Errorf("loading the function library: %w", err))
	}
	s.loads.end(addr, err == nil, pause)
	return err == nil
}

// libraryLoads is a Store's loads of the library, per node address.
type libraryLoads struct {
	mu    sync.Mutex
	nodes map[string]*libraryLoad
}

type libraryLoad struct {
	done  chan struct{} // closed when the load in flight ends; nil: none
	after time.Time     // no load before then
	ok    bool          // the last load succeeded
}

// start claims addr's next load at now: mine, to close with end, or, when
// a load is in flight, nil and its done (nil too when a failure holds the
// next load back).
func (l *libraryLoads) start(addr string, now time.Time) (mine, other chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nodes == nil {
		l.nodes = make(map[string]*libraryLoad)
	}
	n := l.nodes[addr]
	if n == nil {
		n = &libraryLoad{}
		l.nodes[addr] = n
	}
	switch {
	case n.done != nil:
		return nil, n.done
	case now.Before(n.after):
		return nil, nil
	}
	n.done = make(chan struct{})
	return n.done, nil
}

// end records the outcome of addr's load and holds the next back for
// pause.
func (l *libraryLoads) end(addr string, ok bool, pause time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[addr]
	close(n.done)
	n.done, n.ok, n.after = nil, ok, time.Now().Add(pause)
}

// loaded reports whether addr's last load succeeded.
func (l *libraryLoads) loaded(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodes[addr] != nil && l.nodes[addr].ok
}

// loadTimeout bounds a library load (within the call's own bound, for a
// call that waits for it), and holds a node's next load back after one
// failed.
const loadTimeout = time.Second

// refusesFunctions reports an error that says a server will not run the
// library: it does not know FCALL or FUNCTION (before Redis 7, or a
// compatible server without them), the user may not call them, or it
// could not register the library. Redis gives each before it runs
// anything, naming the command; an error raised inside a function starts
// with ERR and is none of them, so a call that ran is never sent again.
func refusesFunctions(err error) bool {
	if err == nil || !isReply(err) {
		return false
	}
	msg := strings.ToLower(err.Error())
	named := func(cmd string) bool { return strings.Contains(msg, "'"+cmd) || strings.Contains(msg, "`"+cmd) }
	refused := strings.HasPrefix(msg, "err unknown command") || strings.HasPrefix(msg, "noperm")
	return strings.HasPrefix(msg, "err error registering functions") || refused && (named("fcall") || named("function"))
}

// scriptsFor is how long a Store sends EVALSHA after a server refused
// functions: an ACL may change, a library lost may be loaded again by
// someone allowed to, a server may be upgraded.
const scriptsFor = time.Minute

// refuseFunctions makes the Store send EVALSHA for scriptsFor, and says so.
func (s *Store) refuseFunctions(err error) {
	if !s.useScripts(scriptsFor) {
		return // already refused, by this call or another
	}
	if l := s.logs.Load(); l != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: Redis refused functions; sending EVALSHA, which costs Redis more CPU per decision, for "+scriptsFor.String(),
			slog.String("err", err.Error()))
	}
}

// useScripts makes the Store send EVALSHA for d from now, unless it does
// already, and reports whether it did not.
func (s *Store) useScripts(d time.Duration) bool {
	now := time.Now().UnixNano()
	for {
		// again when command cleared a window that had passed meanwhile
		old := s.scriptsUntil.Load()
		if now < old {
			return false
		}
		if s.scriptsUntil.CompareAndSwap(old, now+int64(d)) {
			return true
		}
	}
}

// underPressure reports a refusal Redis gives a function whole, before it
// runs, and a script only at its first write: out of memory, too few
// replicas, a failed snapshot.
func underPressure(err error) bool {
	return redis.HasErrorPrefix(err, "OOM") || redis.HasErrorPrefix(err, "NOREPLICAS") || redis.HasErrorPrefix(err, "MISCONF")
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

// withHead is cmd's arguments, a run of a script, with head (a command
// and what names the script) in place of its first two.
func withHead(cmd *redis.Cmd, head ...any) []any {
	return append(head, cmd.Args()[2:]...)
}

package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

//go:embed lib.lua
var libSource string

//go:embed decide.lua
var decideSource string

//go:embed batch.lua
var batchSource string

// withLib is script src with lib.lua in place of its line "-- lib.lua",
// which follows the lines that name the algorithms its call uses: the
// library defines the functions of those only.
func withLib(src string) string { return strings.Replace(src, "\n-- lib.lua\n", "\n"+libSource, 1) }

// batchScript decides independent decisions of one request each, in turn
// (see batch.lua): a lone call is a batch of one.
var batchScript = redis.NewScript(withLib(batchSource))

// decideScript decides the requests of one call all or nothing. It runs as
// EVALSHA first; go-redis falls back to EVAL (which also reloads the script
// cache) on NOSCRIPT: after SCRIPT FLUSH, a restart, or a failover to a
// replica that never saw the script.
var decideScript = redis.NewScript(withLib(decideSource))

// fakeClockMinTTL is the shortest TTL, in ms, of a key written under
// WithClock (see there).
const fakeClockMinTTL = 60_000

// argsPerRequest is how many ARGV values the script reads per request.
const argsPerRequest = 9

// reply is one run of the decide script.
type reply struct {
	now      int64 // the script's clock, µs
	rejected bool  // some request was rejected, so nothing was written
	results  []backend.Result
	// peeks, when asked for, are the requests' results had the call been
	// rejected elsewhere: admitted requests report their unchanged state.
	peeks []backend.Result
	// undo, with the peeks, is what the call did to each request's key (or
	// lease), to put it back if another slot rejects the call.
	undo []keyUndo
	// added reports, with the peeks, which Concurrency acquisitions added a
	// lease (a renewal did not), and which settlements with a Once the call
	// applied (a repeat it was not): an inverse undoes only those.
	added []bool
}

// args encodes reqs as decideScript's ARGV. stamps is nil or holds, per
// request, the stamp of the admission a refund undoes, in place of its
// Request.Stamp; withPeeks asks the script for the peeks of a reply.
func (s *Store) args(reqs []backend.Request, stamps []int64, withPeeks bool) []any {
	args := make([]any, 0, 3+argsPerRequest*len(reqs))
	if s.clock == nil {
		args = append(args, "", 0)
	} else {
		args = append(args, s.clock().UnixMicro(), fakeClockMinTTL)
	}
	args = append(args, flag(withPeeks))
	for i, r := range reqs {
		stamp := r.Stamp
		if stamps != nil {
			stamp = stamps[i]
		}
		burst := r.Burst
		if r.Algorithm == backend.Concurrency {
			burst = r.Lease // the script reads a lease id where a burst would be
		}
		args = append(args, int(r.Algorithm), r.Limit, r.Period.Microseconds(), burst, r.Cost, flag(r.Force), flag(r.Shadow), stamp, r.Once)
	}
	return args
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// run decides reqs, stored under keys, all or nothing in one run of
// decideScript (a call of one request runs runLone instead).
func (s *Store) run(ctx context.Context, keys []string, reqs []backend.Request, stamps []int64) (reply, error) {
	v, err := s.eval(ctx, decideScript, keys, s.args(reqs, stamps, false))
	if err != nil {
		return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
	}
	return decode(v, reqs, false)
}

// loneScript is the script that decides reqs: batchScript for a call of
// one request (a batch of one, which a batch may share with other lone
// calls), decideScript for every other call. A call whose stamps override
// its requests' is a Cluster undo, sent with decideScript.
func loneScript(reqs []backend.Request, stamps []int64) *redis.Script {
	if len(reqs) == 1 && stamps == nil {
		return batchScript
	}
	return decideScript
}

// loneCall is a call of one request, decided by batchScript: its command
// is built only when it is sent alone, and a batch may decide it with other
// lone calls in one run.
type loneCall struct {
	req backend.Request
	now int64 // µs, under WithClock; -1: the server's TIME
}

// runLone decides req, a call of one request, into res.
func (s *Store) runLone(ctx context.Context, script *redis.Script, req backend.Request, res *backend.Result) (rejected bool, err error) {
	w, ops := newWaiter(ctx, 1)
	o := &ops[0]
	*o = op{script: script, key: s.prefix + req.Key, lone: loneCall{req: req, now: -1}}
	if s.clock != nil {
		o.lone.now = s.clock().UnixMicro()
	}
	if err := s.call(ctx, w, ops, false); err != nil {
		w.release(false)
		return false, fmt.Errorf("ceiling/backend/redis: deciding key %q: %w", req.Key, s.classify(err))
	}
	rejected, err = o.decodeLone(res)
	w.release(true)
	if err != nil {
		return false, fmt.Errorf("ceiling/backend/redis: deciding key %q: %w", req.Key, s.classify(err))
	}
	return rejected, nil
}

// loneCmd is the command of o, a lone call sent alone: batchScript's run
// of one decision.
func (s *Store) loneCmd(ctx context.Context, o *op) *redis.Cmd {
	ops := [1]*op{o}
	return s.batchCmd(ctx, ops[:])
}

// loneFields is how many values batchScript answers per decision.
const loneFields = 7

// batchArgs encodes ops, lone calls all, as batchScript's KEYS and ARGV,
// after the command's first values: the rules they use, each once, then
// per call its rule, clock, cost, flags, lease (Concurrency) or stamp, and
// once (see batch.lua).
func (s *Store) batchArgs(a []any, ops []*op) []any {
	var rules [4]*backend.Request // the first ops of distinct rules, in order
	distinct := rules[:0]
	index := func(r *backend.Request) int {
		for i, d := range distinct {
			if d.Algorithm == r.Algorithm && d.Limit == r.Limit && d.Period == r.Period && d.Burst == r.Burst {
				return i + 1
			}
		}
		distinct = append(distinct, r)
		return len(distinct)
	}
	for _, o := range ops {
		index(&o.lone.req)
	}
	minTTL := 0
	if s.clock != nil {
		minTTL = fakeClockMinTTL
	}
	a = append(a, len(ops))
	for _, o := range ops {
		a = append(a, o.key)
	}
	a = append(a, minTTL, len(distinct))
	for _, r := range distinct {
		a = append(a, int(r.Algorithm), r.Limit, r.Period.Microseconds(), r.Burst)
	}
	for _, o := range ops {
		var now any = ""
		if o.lone.now >= 0 {
			now = o.lone.now
		}
		r := &o.lone.req
		x := r.Stamp
		if r.Algorithm == backend.Concurrency {
			x = r.Lease
		}
		a = append(a, index(r), now, r.Cost, flag(r.Force)+2*flag(r.Shadow), x, r.Once)
	}
	return a
}

// decodeLone reads o's answer, {rejected, allowed, remaining, reset µs,
// retry µs, next µs, stamp} from o.at (0: 1) in batchScript's reply {now,
// then 7 values per decision}, into res, checking its shape: a server or
// proxy answering something else is an error naming what it sent.
func (o *op) decodeLone(res *backend.Result) (rejected bool, err error) {
	v, err := o.cmd.Result()
	if err != nil {
		return false, err
	}
	at := max(o.at, 1)
	arr, ok := v.([]any)
	if !ok || len(arr) < at+loneFields || (len(arr)-1)%loneFields != 0 {
		return false, fmt.Errorf("%w: %T of %d elements, want an array of %d", errReply, v, len(arr), at+loneFields)
	}
	if e, ok := arr[at].(error); ok {
		return false, e // this decision failed alone, in a shared script
	}
	var f [loneFields]int64
	for i := range f {
		n, ok := arr[at+i].(int64)
		if !ok {
			return false, fmt.Errorf("%w: element %d is %T, want an integer", errReply, at+i, arr[at+i])
		}
		f[i] = n
	}
	*res = result(&o.lone.req, f[1:])
	return f[0] == 1, nil
}

// result is req's result from a script's fields for it: allowed,
// remaining, reset µs, retry µs (-1 never), next µs, stamp.
func result(req *backend.Request, f []int64) backend.Result {
	res := backend.Result{
		Allowed:    f[0] == 1,
		Limit:      req.Limit,
		Remaining:  f[1],
		ResetAfter: time.Duration(f[2]) * time.Microsecond,
		RetryAfter: time.Duration(f[3]) * time.Microsecond,
		NextAfter:  time.Duration(f[4]) * time.Microsecond,
	}
	if f[3] < 0 {
		res.RetryAfter = backend.Never
	}
	if req.Algorithm != backend.Concurrency && req.Cost > 0 && res.Allowed {
		res.Stamp = f[5] // a lease id names a Concurrency admission's units
	}
	return res
}

// describe names a call's keys for an error message.
func describe(reqs []backend.Request) string {
	if len(reqs) == 1 {
		return fmt.Sprintf("key %q", reqs[0].Key)
	}
	return fmt.Sprintf("key %q and %d more", reqs[0].Key, len(reqs)-1)
}

var errReply = errors.New("unexpected decide script reply")

// decode checks decideScript's reply shape instead of trusting it: a server
// or proxy answering something else is an error naming what it sent, not a
// panic.
func decode(v any, reqs []backend.Request, withPeeks bool) (reply, error) {
	per := 6
	if withPeeks {
		per = 9
	}
	arr, ok := v.([]any)
	if !ok {
		return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w: %T, want an array", describe(reqs), errReply, v)
	}
	head := 2 + per*len(reqs)
	want := head
	if withPeeks {
		want += undoFields * len(reqs)
	}
	if got := len(arr); got != want {
		return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w: %d elements, want %d", describe(reqs), errReply, got, want)
	}
	var buf [16]int64
	ints := buf[:0]
	if head > len(buf) {
		ints = make([]int64, 0, head)
	}
	ints = ints[:head]
	for i, e := range arr[:head] {
		n, ok := e.(int64)
		if !ok {
			return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w: element %d is %T, want an integer", describe(reqs), errReply, i, e)
		}
		ints[i] = n
	}
	r := reply{now: ints[0], rejected: ints[1] == 1, results: make([]backend.Result, len(reqs))}
	if withPeeks {
		r.peeks, r.added = make([]backend.Result, len(reqs)), make([]bool, len(reqs))
		var err error
		if r.undo, err = decodeUndo(arr[head:]); err != nil {
			return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
		}
	}
	for i := range reqs {
		f := ints[2+per*i : 2+per*(i+1)]
		r.results[i] = result(&reqs[i], f)
		if withPeeks {
			res := r.results[i]
			res.Remaining, res.ResetAfter, res.NextAfter = f[6], time.Duration(f[7])*time.Microsecond, time.Duration(f[8])*time.Microsecond
			res.Stamp = 0
			r.peeks[i] = res
			r.added[i] = (reqs[i].Algorithm == backend.Concurrency || reqs[i].Once != 0) && f[5] >= 1
		}
	}
	return r, nil
}

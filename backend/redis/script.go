package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

//go:embed decide.lua
var decideSource string

//go:embed div.lua
var divSource string

//go:embed gcra.lua
var gcraSource string

//go:embed rolling.lua
var rollingSource string

//go:embed slidinglog.lua
var slidingLogSource string

//go:embed lone.lua
var loneSource string

// gcraScript decides a call of one GCRA request, the most common one, at
// about half the Redis CPU of decideScript (see gcra.lua).
var gcraScript = redis.NewScript(divSource + gcraSource + loneSource)

// rollingScript decides a call of one rolling-window request, the default
// algorithm's common call, without decideScript's bookkeeping (see
// rolling.lua).
var rollingScript = redis.NewScript(divSource + rollingSource + loneSource)

// slidingLogScript decides a call of one sliding-log request without
// decideScript's bookkeeping (see slidinglog.lua).
var slidingLogScript = redis.NewScript(slidingLogSource + loneSource)

// decideScript runs as EVALSHA first; go-redis falls back to EVAL (which
// also reloads the script cache) on NOSCRIPT: after SCRIPT FLUSH, a
// restart, or a failover to a replica that never saw the script.
var decideScript = redis.NewScript(decideSource)

// fakeClockMinTTL is the shortest TTL, in ms, of a key written under
// WithClock (see there).
const fakeClockMinTTL = 60_000

// argsPerRequest is how many ARGV values the script reads per request.
const argsPerRequest = 8

// reply is one run of the decide script.
type reply struct {
	now      int64 // the script's clock, µs
	rejected bool  // some request was rejected, so nothing was written
	results  []backend.Result
	// peeks, when asked for, are the requests' results had the call been
	// rejected elsewhere: admitted requests report their unchanged state.
	peeks []backend.Result
	// undo, with the peeks, is each request's key before and after the
	// script, to put it back if another slot rejects the call.
	undo []keyUndo
}

// args encodes reqs as the script's ARGV. stamps is nil or holds, per
// request, the instant of the consumption a refund undoes; withPeeks asks
// the script for the peeks of a reply.
func (s *Store) args(reqs []backend.Request, stamps []int64, withPeeks bool) []any {
	args := make([]any, 0, 3+argsPerRequest*len(reqs))
	if s.clock == nil {
		args = append(args, "", 0)
	} else {
		args = append(args, s.clock().UnixMicro(), fakeClockMinTTL)
	}
	args = append(args, flag(withPeeks))
	for i, r := range reqs {
		stamp := int64(0)
		if stamps != nil {
			stamp = stamps[i]
		}
		burst := r.Burst
		if r.Algorithm == backend.Concurrency {
			burst = r.Lease // the script reads a lease id where a burst would be
		}
		args = append(args, int(r.Algorithm), r.Limit, r.Period.Microseconds(), burst, r.Cost, flag(r.Force), flag(r.Shadow), stamp)
	}
	return args
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// run decides reqs, stored under keys, in one run of decideScript (a call
// of one request with a script of its own runs runLone instead).
func (s *Store) run(ctx context.Context, keys []string, reqs []backend.Request, stamps []int64) (reply, error) {
	v, err := s.eval(ctx, decideScript, keys, s.args(reqs, stamps, false))
	if err != nil {
		return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
	}
	return decode(v, reqs, false)
}

// loneScript is the script that decides reqs: a call of one GCRA, one
// rolling-window or one sliding-log request (not a refund's undo) runs a
// script of its own, every other call decideScript.
func loneScript(reqs []backend.Request, stamps []int64) *redis.Script {
	if len(reqs) == 1 && stamps == nil {
		switch reqs[0].Algorithm {
		case backend.GCRA:
			return gcraScript
		case backend.RollingWindow:
			return rollingScript
		case backend.SlidingLog:
			return slidingLogScript
		}
	}
	return decideScript
}

// loneCall is a call of one request that a script of its own decides
// (loneScript): its command is built only when it is sent alone, and a
// batch may decide it with other lone calls in one run of batchScript.
type loneCall struct {
	req backend.Request
	now int64 // µs, under WithClock; -1: the server's TIME
}

// runLone decides req, a call of script's own, into res.
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

// loneCmd is the command of o, a lone call sent alone: its script with
// decide.lua's ARGV for one request.
func (s *Store) loneCmd(ctx context.Context, o *op) *redis.Cmd {
	r := &o.lone.req
	var now any = ""
	minTTL := 0
	if o.lone.now >= 0 {
		now, minTTL = o.lone.now, fakeClockMinTTL
	}
	return redis.NewCmd(ctx, "evalsha", o.script.Hash(), 1, o.key, now, minTTL, 0,
		int(r.Algorithm), r.Limit, r.Period.Microseconds(), r.Burst, r.Cost, flag(r.Force), flag(r.Shadow), 0)
}

// decodeLone reads o's answer, {rejected, allowed, remaining, reset µs,
// retry µs, next µs} from o.at in its command's reply (from 1 in its own
// script's {now, ...}), into res, checking its shape: a server or proxy
// answering something else is an error naming what it sent.
func (o *op) decodeLone(res *backend.Result) (rejected bool, err error) {
	v, err := o.cmd.Result()
	if err != nil {
		return false, err
	}
	at := max(o.at, 1)
	arr, ok := v.([]any)
	// Its own script answers 7 values; a shared one 1 + 6 per decision.
	if !ok || len(arr) < at+6 || (o.at == 0 && len(arr) != 7) || (len(arr)-1)%6 != 0 {
		return false, fmt.Errorf("%w: %T of %d elements, want an array of %d", errReply, v, len(arr), max(at+6, 7))
	}
	if e, ok := arr[at].(error); ok {
		return false, e // this decision failed alone, in a shared script
	}
	var f [6]int64
	for i := range f {
		n, ok := arr[at+i].(int64)
		if !ok {
			return false, fmt.Errorf("%w: element %d is %T, want an integer", errReply, at+i, arr[at+i])
		}
		f[i] = n
	}
	*res = backend.Result{
		Allowed:    f[1] == 1,
		Limit:      o.lone.req.Limit,
		Remaining:  f[2],
		ResetAfter: time.Duration(f[3]) * time.Microsecond,
		RetryAfter: time.Duration(f[4]) * time.Microsecond,
		NextAfter:  time.Duration(f[5]) * time.Microsecond,
	}
	if f[4] < 0 {
		res.RetryAfter = backend.Never
	}
	return f[0] == 1, nil
}

// describe names a call's keys for an error message.
func describe(reqs []backend.Request) string {
	if len(reqs) == 1 {
		return fmt.Sprintf("key %q", reqs[0].Key)
	}
	return fmt.Sprintf("key %q and %d more", reqs[0].Key, len(reqs)-1)
}

var errReply = errors.New("unexpected decide script reply")

// decode checks the reply's shape instead of trusting it: a server or proxy
// answering something else is an error naming what it sent, not a panic.
func decode(v any, reqs []backend.Request, withPeeks bool) (reply, error) {
	per := 5
	if withPeeks {
		per = 8
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
		r.peeks = make([]backend.Result, len(reqs))
		var err error
		if r.undo, err = decodeUndo(arr[head:]); err != nil {
			return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
		}
	}
	for i, req := range reqs {
		f := ints[2+per*i : 2+per*(i+1)]
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
		r.results[i] = res
		if withPeeks {
			res.Remaining, res.ResetAfter, res.NextAfter = f[5], time.Duration(f[6])*time.Microsecond, time.Duration(f[7])*time.Microsecond
			r.peeks[i] = res
		}
	}
	return r, nil
}

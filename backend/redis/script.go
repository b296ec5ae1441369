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

// withLib is src with lib.lua in place of its line "-- lib.lua".
func withLib(src string) string { return strings.Replace(src, "\n-- lib.lua\n", "\n"+libSource, 1) }

// batchScript decides independent calls of one request each (batch.lua);
// decideScript, the requests of one call all or nothing (decide.lua).
var (
	batchSrc, decideSrc       = withLib(batchSource), withLib(decideSource)
	batchScript, decideScript = redis.NewScript(batchSrc), redis.NewScript(decideSrc)
)

// source is the source of script, one of the two.
func source(script *redis.Script) string {
	if script == batchScript {
		return batchSrc
	}
	return decideSrc
}

// The two scripts are also the functions of one Redis function library
// (Redis 7), which defines lib.lua's functions once, on its first call,
// rather than on every run as a script does: a decision costs Redis less
// CPU. The library is named after its source, so that instances of
// several versions share a Redis. A Store calls the functions (FCALL),
// loads the library where a node answers that it has none, and sends
// EVALSHA for a while after a refusal (a server without functions, or a
// user not allowed them): see load.
var (
	libraryName, library      = libraryOf(batchSource, decideSource)
	batchFunc, decideFunc any = libraryName + "_batch", libraryName + "_decide"
)

// libraryOf is the function library of the batch and decide scripts, and
// its name: lib.lua with every algorithm, then each script's part after
// it, as a function. Redis 7.0 gives a library's code the standard Lua
// libraries only when a function runs, so it is built then.
func libraryOf(batch, decide string) (name, source string) {
	body := func(src string) string {
		_, b, ok := strings.Cut(src, "\n-- lib.lua\n")
		if !ok {
			panic("ceiling/backend/redis: a script without its line \"-- lib.lua\"")
		}
		return b
	}
	code := "local function build()\n" +
		"local uses = { ['0'] = true, ['1'] = true, ['2'] = true, ['3'] = true, ['4'] = true, ['5'] = true }\n" +
		libSource +
		"return function(KEYS, ARGV)\n" + body(batch) + "\nend, function(KEYS, ARGV)\n" + body(decide) + "\nend\nend\n" +
		"local batch, decide\n" +
		"redis.register_function(NAME .. '_batch', function(KEYS, ARGV)\n" +
		"  if not batch then batch, decide = build() end\n  return batch(KEYS, ARGV)\nend)\n" +
		"redis.register_function(NAME .. '_decide', function(KEYS, ARGV)\n" +
		"  if not batch then batch, decide = build() end\n  return decide(KEYS, ARGV)\nend)\n"
	name = "ceiling_" + redis.NewScript(code).Hash()[:16]
	return name, "#!lua name=" + name + "\nlocal NAME = '" + name + "'\n" + code
}

// command is the start of script's command: FCALL of its function, or,
// for a while after a server refused functions, EVALSHA of its hash.
func (s *Store) command(a []any, script *redis.Script) []any {
	batch := script == batchScript
	scripts := false
	if u := s.scriptsUntil.Load(); u != 0 {
		// cleared once past, so that the hot path reads no clock
		if scripts = time.Now().UnixNano() < u; !scripts {
			s.scriptsUntil.CompareAndSwap(u, 0)
		}
	}
	switch {
	case !scripts && batch:
		return append(a, "fcall", batchFunc)
	case !scripts:
		return append(a, "fcall", decideFunc)
	case batch:
		return append(a, "evalsha", batchSha)
	}
	return append(a, "evalsha", decideSha)
}

// The scripts' hashes, boxed once rather than per command.
var batchSha, decideSha any = batchScript.Hash(), decideScript.Hash()

// fakeClockMinTTL is the shortest TTL, in ms, of a key written under
// WithClock.
const fakeClockMinTTL = 60_000

// reply is one run of the decide script.
type reply struct {
	now      int64 // the script's clock, µs
	rejected bool  // some request was rejected, so nothing was written
	results  []backend.Result
	// With the peeks asked for: the results had the call been rejected
	// elsewhere, what it did to each key (or lease) to put it back, and
	// which Concurrency acquisitions added a lease and which settlements
	// with a Once it applied (an inverse undoes only those).
	peeks []backend.Result
	undo  []keyUndo
	added []bool
}

// args encodes reqs as decideScript's ARGV; withPeeks asks the script for
// the peeks of a reply.
func (s *Store) args(reqs []backend.Request, withPeeks bool) []any {
	args := make([]any, 0, 3+9*len(reqs))
	if s.clock == nil {
		args = append(args, "", 0)
	} else {
		args = append(args, s.clock().UnixMicro(), fakeClockMinTTL)
	}
	args = append(args, flag(withPeeks))
	for _, r := range reqs {
		burst := r.Burst
		if r.Algorithm == backend.Concurrency {
			burst = r.Lease // the script reads a lease id where a burst would be
		}
		args = append(args, int(r.Algorithm), r.Limit, r.Period.Microseconds(), burst, r.Cost, flag(r.Force), flag(r.Shadow), r.Stamp, r.Once)
	}
	return args
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// run decides reqs all or nothing in one run of decideScript.
func (s *Store) run(ctx context.Context, reqs []backend.Request) (reply, error) {
	replies, errs := s.runGroups(ctx, [][]string{s.keys(reqs)}, [][]backend.Request{reqs}, false, false)
	return replies[0], errs[0]
}

// loneCall is a call of one request, decided by batchScript with the lone
// calls sent beside it (its command is built only when sent alone).
type loneCall struct {
	req backend.Request
	now int64 // µs, under WithClock; -1: the server's TIME
}

// runLone decides req, a call of one request, into res.
func (s *Store) runLone(ctx context.Context, req backend.Request, res *backend.Result) (rejected bool, err error) {
	w, ops := newWaiter(ctx, 1)
	o := &ops[0]
	*o = op{script: batchScript, key: s.prefix + req.Key, lone: loneCall{req: req, now: -1}}
	if s.clock != nil {
		o.lone.now = s.clock().UnixMicro()
	}
	err = s.call(ctx, w, ops, false)
	answered := err == nil
	if answered {
		rejected, err = o.decodeLone(res)
	}
	w.release(answered)
	if err != nil {
		return false, fmt.Errorf("ceiling/backend/redis: deciding key %q: %w", req.Key, s.classify(err))
	}
	return rejected, nil
}

// loneFields is how many values batchScript answers per decision.
const loneFields = 7

// batchArgs appends batchScript's KEYS and ARGV for ops, lone calls all
// (see batch.lua): the rules they use, each once, then per call its rule,
// clock, cost, flags, lease (Concurrency) or stamp, and once.
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
	n := len(ops) // the keys: each decision's, then its once record (see withOnceKeys)
	for _, o := range ops {
		if o.lone.req.Once != 0 {
			n++
		}
	}
	a = append(a, n)
	for _, o := range ops {
		a = append(a, o.key)
	}
	for _, o := range ops {
		if o.lone.req.Once != 0 {
			a = append(a, onceKeyOf(o.key, o.lone.req.Once))
		}
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

// decodeLone reads o's answer from o.at in batchScript's reply,
// loneFields values per decision: rejected, then result's.
func (o *op) decodeLone(res *backend.Result) (rejected bool, err error) {
	v, err := o.cmd.Result()
	if err != nil {
		return false, err
	}
	at := o.at
	arr, ok := v.([]any)
	if !ok || len(arr) < at+loneFields || len(arr)%loneFields != 0 {
		return false, fmt.Errorf("%w: %T of %d elements, want an array of %d", errReply, v, len(arr), at+loneFields)
	}
	if e, ok := arr[at].(error); ok {
		return false, e // this decision failed alone, in a shared script
	}
	var f [loneFields]int64
	if err := ints(f[:], arr, at); err != nil {
		return false, err
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

// decode reads decideScript's reply, checking its shape: what a server or
// proxy answers instead is an error naming it, not a panic.
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
	f := buf[:0]
	if head > len(buf) {
		f = make([]int64, 0, head)
	}
	f = f[:head]
	if err := ints(f, arr, 0); err != nil {
		return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
	}
	r := reply{now: f[0], rejected: f[1] == 1, results: make([]backend.Result, len(reqs))}
	if withPeeks {
		r.peeks, r.added = make([]backend.Result, len(reqs)), make([]bool, len(reqs))
		var err error
		if r.undo, err = decodeUndo(arr[head:]); err != nil {
			return reply{}, fmt.Errorf("ceiling/backend/redis: deciding %s: %w", describe(reqs), err)
		}
	}
	for i := range reqs {
		g := f[2+per*i : 2+per*(i+1)]
		r.results[i] = result(&reqs[i], g)
		if withPeeks {
			res := r.results[i]
			res.Remaining, res.ResetAfter, res.NextAfter = g[6], time.Duration(g[7])*time.Microsecond, time.Duration(g[8])*time.Microsecond
			res.Stamp = 0
			r.peeks[i] = res
			r.added[i] = (reqs[i].Algorithm == backend.Concurrency || reqs[i].Once != 0) && g[5] >= 1
		}
	}
	return r, nil
}

// ints reads arr[at:at+len(dst)] into dst, naming an element that is not
// an integer.
func ints(dst []int64, arr []any, at int) error {
	for i := range dst {
		n, ok := arr[at+i].(int64)
		if !ok {
			return fmt.Errorf("%w: element %d is %T, want an integer", errReply, at+i, arr[at+i])
		}
		dst[i] = n
	}
	return nil
}

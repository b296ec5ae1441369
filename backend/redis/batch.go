package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// maxBatch bounds the scripts of one pipelined write, and maxLanes the
// round trips in flight to one node at once: a decision that finds a lane
// free is written at once, and one that finds every lane taken waits for
// the first to come back and goes out with whatever queued meanwhile.
const (
	maxBatch = 64
	maxLanes = 4
)

// op is one command of a call (a script run of a decision, a DEL of a
// reset), queued for a round trip.
type op struct {
	script *redis.Script // nil: not a script, never re-sent as EVAL
	key    string        // its first key, which names its node
	cmd    *redis.Cmd    // nil until sent for a lone call (see loneCall)
	w      *waiter
	lone   loneCall // a call of one request of a script of its own
	at     int      // a lone call's answer starts at cmd's reply[at] (0: 1)
}

// flight is one batch's round trip, cancelled once the caller of every op
// in it has given up (and none is detached): go-redis re-dials a refused
// connection and waits for a pooled one while its context lasts, and a
// decision whose caller was told it failed must not reach a Redis that
// comes back later.
type flight struct {
	cancel  context.CancelFunc
	waiting atomic.Int32 // callers that have not given up
}

// waiter is a decision waiting for its ops' replies.
type waiter struct {
	ctx    context.Context // for values: the round trip runs on its own deadline
	budget time.Duration   // how long the caller waits for a reply once written; 0: unbounded
	// detached ops are sent even after the caller stopped waiting, with a
	// round trip of at least refundTimeout: a refund must land whoever
	// waits for it.
	detached bool

	n         int32        // its ops
	pending   atomic.Int32 // ops not yet answered
	unclaimed atomic.Int32 // ops no round trip has taken yet
	written   atomic.Int64 // UnixNano of the latest write of one of its ops
	gone      atomic.Bool  // the caller stopped waiting
	done      chan struct{}
	mu        sync.Mutex    // orders gone with flights
	flights   []*flight     // the round trips that took its ops
	node      *pipeliner    // the node its (first) op was queued for
	one       [1]op         // the ops of a one-script decision
	self      [maxBatch]*op // the batches of a decision its caller sends itself
	wd        writeDeadline // the context of such a batch's round trip
}

var waiters = sync.Pool{New: func() any { return &waiter{done: make(chan struct{}, 1)} }}

// newWaiter returns a waiter for n ops; ops[:n] are its ops.
func newWaiter(ctx context.Context, n int) (*waiter, []op) {
	w := waiters.Get().(*waiter)
	w.ctx = ctx
	ops := w.one[:]
	if n > 1 {
		ops = make([]op, n)
	}
	return w, ops
}

// release returns w to the pool, unless a round trip may still hold it: a
// waiter whose caller left before every reply came is left to the
// collector.
func (w *waiter) release(answered bool) {
	if !answered {
		return
	}
	w.one[0] = op{}
	w.ctx, w.budget, w.detached, w.node, w.wd = nil, 0, false, nil, writeDeadline{}
	w.gone.Store(false)
	w.mu.Lock()
	clear(w.flights)
	w.flights = w.flights[:0]
	w.mu.Unlock()
	waiters.Put(w)
}

// starvedWait is how long after it was called a caller waits, at most,
// while this process is visibly too busy to run the goroutine that reads its
// reply (see waitStarved), or one and a half budgets if that is longer; a
// slow yield of the CPU makes the process count as starved for
// starvedMemory, since one yield can be quick by luck.
const (
	starvedWait   = 2 * time.Second
	starvedMemory = time.Second
)

// starvedLimit is how long after entry a caller with budget waits, at
// most, on a starved process.
func starvedLimit(budget time.Duration) time.Duration {
	return max(starvedWait, budget+budget/2)
}

// errNotSent is the cause of a timeout when no round trip took the
// decision by its deadline: this process was too busy, or every round trip
// to the node was in flight and none came back. It is not Redis's fault
// ([backend.ErrNotSent]).
var errNotSent = fmt.Errorf("%w: every round trip to the node in flight", backend.ErrNotSent)

// errStuck is the cause of a timeout of a call that was not sent because
// every round trip to its node was in flight and none came back for longer
// than the call's budget: the node does not answer, which is Redis's
// fault, though the call itself never reached it.
var errStuck = errors.New("not sent: no round trip to the node came back")

// errWritten marks the error of a call a round trip took one of whose ops
// (it was written, or may still be by a round trip that other callers
// wait for) and that was not answered: Redis may have applied it, whatever
// else failed meanwhile (a dial of another connection, the caller's
// cancellation), so sentUnanswered counts it as sent.
var errWritten = errors.New("written, not answered")

// taken reports whether a round trip took one of w's ops, which may then
// have been applied.
func (w *waiter) taken() bool {
	return w.written.Load() != 0 || w.unclaimed.Load() < w.n
}

// call sends ops (whose cmds are ready) and waits until every one is
// answered. It returns early only when ctx is cancelled, or once the
// budget has run out: what ctx's deadline left at entry, counted from when
// the ops were written, so that time this process spent before the write
// (a busy CPU, a long queue of its own) is not blamed on Redis, and only if
// this process is not too starved to have read a reply that came
// (waitStarved). A reply that is there when the budget runs out is used.
// A call whose deadline passed before it was written fails with
// [backend.ErrNotSent]. When call returns another error, the ops may still
// take effect (at most once), and their cmds must not be read.
func (s *Store) call(ctx context.Context, w *waiter, ops []op, detached bool) error {
	if err := ctx.Err(); err != nil && !detached {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: the deadline passed before the call: %w", backend.ErrNotSent, err)
		}
		return err
	}
	entry := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		w.budget = max(dl.Sub(entry), time.Nanosecond)
	}
	w.detached = detached
	w.n = int32(len(ops))
	w.pending.Store(int32(len(ops)))
	w.unclaimed.Store(int32(len(ops)))
	w.written.Store(0)
	// The caller sends its op itself when the round trip then returns by
	// the call's bound: the client keeps the budget's deadline, or there is
	// no bound (no budget, and a context that cannot be cancelled).
	bound := (s.inline && w.budget > 0) || (w.budget == 0 && ctx.Done() == nil)
	b, err := s.enqueue(ctx, w, ops, bound && !detached && len(ops) == 1 && !s.starvedLately(entry))
	if err != nil {
		w.giveUp()
		return err
	}
	if b != nil {
		return s.callInline(w, b, entry)
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	if w.answered() { // the reply and the deadline came together
		return nil
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		w.giveUp()
		if w.taken() {
			return fmt.Errorf("%w: %w", errWritten, err)
		}
		return err
	}
	if s.cluster != nil {
		s.healCluster()
	}
	if s.waitStarved(w, entry) {
		return nil
	}
	// An answer that comes once the caller gave up may be the round trip's
	// cancellation, which giving up caused: only one from a round trip
	// that others still wait for is the reply.
	cancelled := w.giveUp()
	if afterGiveUp != nil {
		afterGiveUp()
	}
	if !cancelled && w.answered() {
		return nil
	}
	return s.timeoutError(w, entry)
}

// callInline sends the lone op of w on the caller's goroutine, which
// took a lane of b, the op's node: a decision made while the node has a
// lane free pays no hand-over to another goroutine. It writes what b has
// queued, its own op among it, and reads the replies; then, if decisions
// queued meanwhile, it starts a goroutine that sends them (and what queues
// behind them) for as long as the queue holds any, or else gives the lane
// back. The round trip's deadline is the budget counted from the write,
// which the client keeps (Store.inline), so it returns by it as call does,
// but a cancellation of the caller's context before that is not noticed
// (call takes this path only with a deadline, or with neither a deadline
// nor a context that can end), and a reply this process is too starved to read
// in time is lost where call would wait for it (call takes this path only
// when no yield showed the process starved lately).
func (s *Store) callInline(w *waiter, b *pipeliner, entry time.Time) error {
	batch := w.self[:0]
	for w.pending.Load() > 0 {
		b.mu.Lock()
		batch = b.take(batch[:0])
		b.mu.Unlock()
		if len(batch) == 0 {
			break // a caller that took a lane at the same time sends w's op
		}
		s.exec(batch, w)
		b.back.Store(time.Now().UnixNano())
	}
	clear(batch)
	b.handOn()
	<-w.done // exec's signal, for the waiter that is not there
	if err := w.one[0].cmd.Err(); err != nil && timedOut(err) &&
		time.Now().UnixNano() >= w.written.Load()+int64(w.budget) {
		late := time.Since(time.Unix(0, w.written.Load()+int64(w.budget))) >= w.budget/10
		if s.cluster != nil {
			s.healCluster()
		}
		// The socket's deadline ended the read, however late this
		// goroutine came to it: on a process that was too busy to run it
		// (the deadline's wake-up came late, or a yield is slow now), or
		// while Redis replied to another round trip since the write (it
		// runs, as in waitStarved), the reply may have come in time and
		// been dropped unread, and the next calls wait for theirs
		// (starvedLately).
		ran := s.replied.Load() > w.written.Load()
		if starved, _ := s.starved(w.budget); starved || late || ran {
			s.slowYield.Store(time.Now().UnixNano())
			return fmt.Errorf("%w (%w: no reply read within %v of the write): %w", backend.ErrUnread, errWritten, w.budget, context.DeadlineExceeded)
		}
		return s.timeoutError(w, entry)
	}
	return nil
}

// timedOut reports whether err is a round trip's deadline: the network's or
// the context's.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// starvedLately reports whether a yield showed this process starved
// within starvedMemory before now.
func (s *Store) starvedLately(now time.Time) bool {
	return now.UnixNano()-s.slowYield.Load() < int64(starvedMemory)
}

// waitStarved waits, once the caller's deadline has passed, for as long as
// the call may still be answered without blaming Redis for this process's
// delays, and reports whether every op was answered.
//
// Written ops get their whole budget from the write. Past that (or while
// the ops still wait for a round trip), the caller asks whether this
// process is starved (Store.starved): if it is, a reply may well have come
// that the sending goroutine has not been able to run to read, or the round trips
// ahead of the ops may be held up the same way, so the caller waits as
// long as its yield took (at least half the budget) and asks again, up to
// starvedLimit(budget) after the call began. Ops a round trip took but has not written
// yet are waited for the same way without asking, since only this
// process's slowness stands in between. On a process that runs its
// goroutines promptly, a call to a frozen or slow Redis fails at its
// budget.
func (s *Store) waitStarved(w *waiter, entry time.Time) bool {
	if w.wait(time.Until(entry.Add(w.budget))) {
		return true // ctx's deadline came before the budget
	}
	limit := entry.Add(starvedLimit(w.budget))
	for {
		var late bool
		if wr := w.written.Load(); wr != 0 {
			due := time.Unix(0, wr).Add(w.budget)
			if w.wait(time.Until(due)) {
				return true
			}
			// A wake-up that came well past its time says the process
			// was not running (its threads waited for a CPU), which a
			// yield, quick once it runs again, does not show.
			late = time.Since(due) >= w.budget/10
		}
		left := time.Until(limit)
		if left <= 0 {
			return false
		}
		if w.unclaimed.Load() == 0 && w.written.Load() == 0 {
			if w.wait(min(w.budget/2, left)) {
				return true
			}
			continue
		}
		starved, took := s.starved(w.budget)
		if w.answered() {
			return true
		}
		if late && !starved {
			starved = true
			s.slowYield.Store(time.Now().UnixNano())
		}
		// Redis replied to a round trip since this call was taken: it
		// runs, and this call's reply is most likely waiting for this
		// process to read it. A frozen Redis replies to none.
		if wr := w.written.Load(); !starved && wr != 0 && s.replied.Load() > wr {
			starved = true
		}
		if !starved {
			// A prompt process: Redis, not this process, is slow, unless
			// the reply came and the scheduler has not polled the network
			// for it yet, which a busy process does only every few ms.
			return w.wait(min(w.budget/10, time.Until(limit)))
		}
		if w.wait(min(max(took, w.budget/2), time.Until(limit))) {
			return true
		}
	}
}

// starved yields the CPU and reports whether this process is too
// busy to run its goroutines promptly, and how long the yield took. A
// yielding goroutine waits in the scheduler's global run queue, which is
// where a sender whose reply has come waits too (the network poller hands
// ready goroutines to it), while a caller woken by its deadline's timer
// jumps that queue: on a process whose CPUs are taken by other work, the
// caller wakes in time and finds no reply, though one came and is unread.
// A yield that takes a tenth of the budget or more (of up to three), or
// another that did within starvedMemory, says the process is starved; on a
// process that runs its goroutines promptly a yield takes microseconds.
func (s *Store) starved(budget time.Duration) (bool, time.Duration) {
	var took time.Duration
	for range yields {
		start := time.Now()
		runtime.Gosched()
		now := time.Now()
		took = max(took, now.Sub(start))
		if took >= budget/10 {
			s.slowYield.Store(now.UnixNano())
			return true, took
		}
	}
	return s.starvedLately(time.Now()), took
}

// yields is how many times starved yields before it calls the process
// prompt: a goroutine that yields can, by luck, be picked at once on a
// starved process (the scheduler takes one from its global queue every
// 61 turns), and on a prompt one three yields cost a microsecond.
const yields = 3

// wait waits up to d for every op of w to be answered, and reports
// whether they were.
func (w *waiter) wait(d time.Duration) bool {
	if d <= 0 {
		return w.answered()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return w.answered()
	}
}

// giveUp records that the caller stopped waiting: its ops still queued are
// never sent, and a round trip that took them and still waits to send them
// gives up too once no other caller waits for it. It reports whether it
// cancelled a round trip.
func (w *waiter) giveUp() (cancelled bool) {
	w.mu.Lock()
	w.gone.Store(true)
	fs := w.flights
	w.flights = nil
	w.mu.Unlock()
	for _, f := range fs {
		if f.waiting.Add(-1) == 0 {
			f.cancel()
			cancelled = true
		}
	}
	return cancelled
}

// board counts w as waiting for f, unless it has given up; exec calls it
// for each waiter of the batch before sending.
func (w *waiter) board(f *flight) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone.Load() || (len(w.flights) > 0 && w.flights[len(w.flights)-1] == f) {
		return
	}
	w.flights = append(w.flights, f)
	f.waiting.Add(1)
}

// answered reports, without blocking, whether every op of w was answered,
// taking the token the last answer left.
func (w *waiter) answered() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// timeoutError says why a call ran out of budget: a dial that failed since
// the call began makes it unreachable (the dial's own retries can outlast
// the budget, and "timed out" would hide a refused connection); otherwise
// it is a timeout, waiting for a reply or for a round trip to be free. A
// call a round trip took is marked errWritten either way: a failed dial,
// perhaps of another connection, does not make it unsent.
func (s *Store) timeoutError(w *waiter, entry time.Time) error {
	dial := s.dials.since(entry)
	switch {
	case !w.taken() && dial != nil:
		return unreachable(dial)
	case !w.taken():
		// Not sent: this process's delay, unless the round trips that
		// held every lane were Redis's, none coming back for a budget.
		// Redis replying to any round trip meanwhile clears it.
		if b := w.node; b != nil && time.Since(time.Unix(0, b.back.Load())) > w.budget &&
			time.Since(time.Unix(0, s.replied.Load())) > w.budget {
			return fmt.Errorf("%w within %v: %w", errStuck, w.budget, context.DeadlineExceeded)
		}
		return fmt.Errorf("%w within %v: %w", errNotSent, w.budget, context.DeadlineExceeded)
	case dial != nil:
		return fmt.Errorf("%w (%w: no reply within %v of the write)", unreachable(dial), errWritten, w.budget)
	}
	return fmt.Errorf("%w: no reply within %v of the write: %w", errWritten, w.budget, context.DeadlineExceeded)
}

// pipeliner queues the ops bound for one Redis node while its lanes (the
// round trips in flight, at most maxLanes) are taken. There is no worker:
// a caller that finds a lane free sends the queue itself (callInline), or,
// when it cannot bound its own wait (a client that ignores its context's
// deadline, a call of several ops, a detached refund), starts a goroutine
// for that one lane, which sends the queue until it is empty and ends.
type pipeliner struct {
	s     *Store
	mu    sync.Mutex
	queue []*op
	lanes int // round trips in flight or about to be
	max   int // lanes at most (tests set 1)
	// back is the UnixNano of the latest round trip to the node that came
	// back: a decision that found no lane free while none came back for
	// longer than its budget waited on a node that does not answer.
	back atomic.Int64
}

func newPipeliner(s *Store) *pipeliner {
	return &pipeliner{s: s, max: maxLanes}
}

// enqueue queues the ops of w on the pipeliners of their nodes, the ops
// bound for one node together, so that they share its round trip, and
// makes sure each is sent: a node with a lane free gets a goroutine that
// sends its queue, except that when mayInline (w has one op) the lane is
// the caller's, and enqueue returns its pipeliner for callInline.
func (s *Store) enqueue(ctx context.Context, w *waiter, ops []op, mayInline bool) (*pipeliner, error) {
	for i := range ops {
		ops[i].w = w
	}
	if s.cluster == nil {
		w.node = s.pipe
		if s.pipe.enqueue(ops, nil) {
			if mayInline {
				return s.pipe, nil
			}
			go s.pipe.flush()
		}
		return nil, nil
	}
	bs := make([]*pipeliner, len(ops))
	for i := range ops {
		b, err := s.pipelinerFor(ctx, ops[i].key)
		if err != nil {
			return nil, err
		}
		bs[i] = b
	}
	w.node = bs[0]
	for i, b := range bs {
		if b != nil && b.enqueue(ops[i:], bs[i:]) {
			if mayInline {
				return b, nil
			}
			go b.flush()
		}
	}
	return nil, nil
}

// enqueue queues ops (those of them whose bs entry is b, clearing it, when
// bs is not nil) and reports whether the caller took a lane, which it must
// use to send the queue: otherwise a round trip in flight will.
func (b *pipeliner) enqueue(ops []op, bs []*pipeliner) (lane bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range ops {
		if bs == nil || bs[i] == b {
			b.queue = append(b.queue, &ops[i])
			if bs != nil {
				bs[i] = nil
			}
		}
	}
	if b.lanes < b.max {
		b.lanes++
		return true
	}
	return false
}

// handOn gives back a lane whose round trip came back: to a goroutine
// that sends what queued meanwhile, or for good if nothing did.
func (b *pipeliner) handOn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) > 0 {
		go b.flush()
		return
	}
	b.lanes--
}

// flush sends b's queue, a batch per round trip, until it is empty, then
// gives its lane back.
func (b *pipeliner) flush() {
	var batch []*op
	for {
		b.mu.Lock()
		batch = b.take(batch[:0])
		if len(batch) == 0 {
			b.lanes--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.s.exec(batch, nil)
		b.back.Store(time.Now().UnixNano())
		clear(batch)
	}
}

// take moves up to maxBatch ops from the queue into batch (more if the
// last decision taken has more ops for this node: they share a round
// trip), dropping the ones whose caller already gave up (they are never
// sent). b.mu is held.
func (b *pipeliner) take(batch []*op) []*op {
	n := 0
	for n < len(b.queue) && (len(batch) < maxBatch || b.queue[n].w == batch[len(batch)-1].w) {
		o := b.queue[n]
		n++
		if o.w.gone.Load() && !o.w.detached {
			continue
		}
		o.w.unclaimed.Add(-1)
		batch = append(batch, o)
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// errNoKey is a bug: an op built without its key (use scriptOp), which on
// Cluster would queue it for the wrong node.
var errNoKey = errors.New("ceiling/backend/redis: an op without a key cannot be routed")

// pipelinerFor returns the pipeliner of the node that holds key.
func (s *Store) pipelinerFor(ctx context.Context, key string) (*pipeliner, error) {
	if s.cluster == nil {
		return s.pipe, nil
	}
	if key == "" {
		return nil, errNoKey
	}
	node, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, s.classify(err)
	}
	addr := node.Options().Addr
	if b, ok := s.nodes.Load(addr); ok {
		return b.(*pipeliner), nil
	}
	b, _ := s.nodes.LoadOrStore(addr, newPipeliner(s))
	return b.(*pipeliner), nil
}

// noRetry is a command go-redis must not send twice: it retries a command
// whose reply was lost (MaxRetries, 3 by default), and a decision or a
// refund that ran once and is run again takes effect twice. Only a command
// known not to have reached the server (a dial that failed, a MOVED or ASK
// redirection on Cluster) is sent again.
type noRetry struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command after it was written.
func (noRetry) NoRetry() bool { return true }

// exec sends one batch in one round trip (a pipeline of its scripts, or
// the lone script) with a deadline of its own, counted from the write,
// then re-sends with EVAL the scripts a node did not have cached, and
// wakes every waiter whose ops are all answered. self is the waiter of a
// caller that sends the batch itself (callInline), nil for a goroutine
// that sends a queue: the caller's deadline is its budget.
func (s *Store) exec(batch []*op, self *waiter) {
	inline := self != nil
	if beforeWrite != nil {
		beforeWrite()
	}
	now := time.Now()
	var budget time.Duration
	bounded, detached := true, false
	for _, o := range batch {
		w := o.w
		for old := w.written.Load(); old < now.UnixNano() && !w.written.CompareAndSwap(old, now.UnixNano()); old = w.written.Load() {
		}
		switch {
		case w.detached:
			budget = max(budget, w.budget, refundTimeout)
			detached = true
		case w.budget <= 0:
			bounded = false
		default:
			budget = max(budget, w.budget)
		}
	}
	if inline {
		// The caller that sends the batch returns by its own bound: a
		// waiter without one that queued into it gets an error once that
		// bound passed, rather than hold the caller past it.
		bounded = budget > 0
	}
	var ctx context.Context
	switch {
	case !bounded && inline:
		self.wd = writeDeadline{Context: self.ctx}
		ctx = &self.wd
	case !bounded: // neither deadline nor Done: the waiters wait as long as it takes
		ctx = &writeDeadline{Context: batch[0].w.ctx}
	case inline: // the caller is its own waiter, held until exec returns
		self.wd = writeDeadline{Context: self.ctx, at: now.Add(budget), done: doneUnlessPast(self.ctx, now)}
		ctx = &self.wd
	default:
		// The waiters' patience with a starved process, and half the
		// budget again, let a reply that came in time be read by a process
		// slow to schedule this goroutine; the waiters have their own
		// deadlines. The round trip is cancelled as soon as none of them
		// waits any more (flight), so a decision whose caller gave up is
		// not sent late, when a Redis that was down comes back.
		c, cancel := context.WithDeadline(context.WithoutCancel(batch[0].w.ctx), now.Add(starvedLimit(budget)+budget/2))
		defer cancel()
		ctx = c
		if !detached {
			f := &flight{cancel: cancel}
			for _, o := range batch {
				o.w.board(f)
			}
			if f.waiting.Load() == 0 {
				cancel() // every caller gave up since the batch was taken
			}
		}
	}
	s.send(ctx, batch)
	heal, replied := false, false
	for _, o := range batch {
		if err := o.cmd.Err(); err != nil {
			s.logReply(err)
			heal = heal || (s.cluster != nil && stale(err))
		}
		replied = replied || !timedOut(o.cmd.Err())
	}
	if replied {
		s.replied.Store(time.Now().UnixNano())
	}
	for _, o := range batch {
		if o.w.pending.Add(-1) == 0 {
			o.w.done <- struct{}{}
		}
	}
	if heal {
		s.healCluster()
	}
}

// writeDeadline is the context of a round trip its caller sends itself
// (callInline), or of one with no deadline (then with no Done either):
// the caller's, for its values, with the deadline of the
// budget counted from the write, which go-redis sets on the connection
// (ContextTimeoutEnabled). It starts no timer of its own, as
// context.WithDeadline would for every decision: go-redis reads Done only
// while it waits for a pooled connection or a dial, and there the
// caller's Done serves, unless the caller's deadline had already passed
// at the write (a process too busy to run the caller in time), when it
// has none and the pool's own timeout bounds that wait.
type writeDeadline struct {
	context.Context
	at   time.Time
	done <-chan struct{}
}

func (c *writeDeadline) Deadline() (time.Time, bool) { return c.at, !c.at.IsZero() }
func (c *writeDeadline) Done() <-chan struct{}       { return c.done }

func (c *writeDeadline) Err() error {
	select {
	case <-c.done:
		return c.Context.Err()
	default:
		return nil
	}
}

// doneUnlessPast is ctx's Done, unless ctx's deadline is before now.
func doneUnlessPast(ctx context.Context, now time.Time) <-chan struct{} {
	if dl, ok := ctx.Deadline(); ok && dl.Before(now) {
		return nil
	}
	return ctx.Done()
}

// afterGiveUp, when set by a test, runs once a caller gave up: it stands
// for a cancelled round trip answering before the caller looks.
var afterGiveUp func()

// beforeWrite, when set by a test, runs before a batch is written: it
// stands for a process too busy to run the sending goroutine at once.
var beforeWrite func()

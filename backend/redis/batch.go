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
// round trips in flight to one node: a decision that finds a lane free is
// written at once; one that finds none goes out with the next batch.
const (
	maxBatch = 64
	maxLanes = 4
)

// op is one command of a call (a decision's script, a reset's DEL).
type op struct {
	script *redis.Script // nil: not a script, never re-sent as EVAL
	key    string        // its first key, which names its node
	cmd    *redis.Cmd    // nil until sent, for a lone call
	w      *waiter
	lone   loneCall // a call of one request (see loneCall)
	at     int      // a lone call's answer starts at cmd's reply[at]
}

// flight is one batch's round trip, cancelled once every caller waiting
// for it gave up: go-redis re-dials while its context lasts, and a
// decision whose caller was told it failed must not reach a Redis that
// comes back later.
type flight struct {
	cancel  context.CancelFunc
	waiting atomic.Int32 // callers that have not given up
}

// waiter is a call waiting for its ops' replies.
type waiter struct {
	ctx    context.Context // for values: the round trip has its own deadline
	budget time.Duration   // how long the caller waits once written; 0: unbounded
	// detached ops are sent even after the caller left, with a round trip
	// of at least refundTimeout: a refund must land.
	detached bool

	n         int32        // its ops
	pending   atomic.Int32 // ops not yet answered
	unclaimed atomic.Int32 // ops no round trip has taken yet
	written   atomic.Int64 // UnixNano of the latest write of one of its ops
	gone      atomic.Bool  // the caller stopped waiting
	done      chan struct{}
	mu        sync.Mutex    // orders gone with flights
	flights   []*flight     // the round trips that took its ops
	node      *pipeliner    // the node of its first op
	one       [1]op         // the ops of a one-script call
	self      [maxBatch]*op // the batches its caller sends itself
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

// release returns w to the pool once every reply came (answered): a round
// trip may still hold it otherwise.
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

// starvedWait is how long after it was called a caller waits at most
// while this process is too busy to run the goroutine that reads its reply
// (waitStarved), or one and a half budgets if longer; a slow yield makes
// the process count as starved for starvedMemory.
const (
	starvedWait   = 2 * time.Second
	starvedMemory = time.Second
)

func starvedLimit(budget time.Duration) time.Duration {
	return max(starvedWait, budget+budget/2)
}

// errNotSent: no round trip took the call by its deadline, this process's
// delay, not Redis's ([backend.ErrNotSent]).
var errNotSent = fmt.Errorf("%w: every round trip to the node in flight", backend.ErrNotSent)

// errStuck: the call was not sent because a round trip to its node is
// overdue and the node replied to nothing since (pipeliner.stuck): the
// node does not answer.
var errStuck = errors.New("not sent: no round trip to the node came back")

// errWritten marks a call a round trip took and that was not answered:
// Redis may have applied it (sentUnanswered).
var errWritten = errors.New("written, not answered")

// taken reports whether a round trip took one of w's ops.
func (w *waiter) taken() bool {
	return w.written.Load() != 0 || w.unclaimed.Load() < w.n
}

// call sends ops (whose cmds are ready) and waits until every one is
// answered, or ctx is cancelled, or the budget ran out: what ctx's
// deadline left at entry, counted from the write, and only if this process
// is not too starved to have read a reply that came (waitStarved). A call
// whose deadline passed before the write fails with [backend.ErrNotSent].
// After another error the ops may still take effect (at most once), and
// their cmds must not be read.
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
	// The caller sends its op itself when its round trip then ends by the
	// call's bound: the client keeps the budget's deadline, or there is no
	// bound at all.
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
	// An answer after giving up may be the cancellation giving up caused:
	// only one from a round trip that others still wait for is the reply.
	cancelled := w.giveUp()
	if afterGiveUp != nil {
		afterGiveUp()
	}
	if !cancelled && w.answered() {
		return nil
	}
	return s.timeoutError(w, entry)
}

// callInline sends w's lone op on the caller's goroutine, which took a
// lane of b: what b has queued, its own op among it, until its op is
// answered; a queue left behind goes to a goroutine (drain). The round
// trip's deadline is the budget counted from the write, which the client
// keeps (Store.inline). A cancellation before it is not noticed, and a
// reply this process is too starved to read in time is lost, so call takes
// this path only with a deadline (or neither deadline nor Done), and only
// when no yield showed the process starved lately.
func (s *Store) callInline(w *waiter, b *pipeliner, entry time.Time) error {
	b.drain(w)
	<-w.done // exec's signal, for the waiter that is not there
	if err := w.one[0].cmd.Err(); err != nil && timedOut(err) &&
		time.Now().UnixNano() >= w.written.Load()+int64(w.budget) {
		late := time.Since(time.Unix(0, w.written.Load()+int64(w.budget))) >= w.budget/10
		if s.cluster != nil {
			s.healCluster()
		}
		// The socket's deadline ended the read, however late this goroutine
		// came to it: on a process too busy to run it (a late wake-up, a
		// slow yield), or while Redis replied to another round trip since
		// the write, the reply may have come in time and been dropped.
		ran := s.replied.Load() > w.written.Load()
		if s.refused(w, entry) != nil {
			return s.timeoutError(w, entry)
		}
		j := s.judge(w)
		if j == silent {
			return s.timeoutError(w, entry)
		}
		if j == behind {
			return fmt.Errorf("%w (%w: its reply waits to be read, %v after the write): %w", backend.ErrUnread, errWritten, w.budget, context.DeadlineExceeded)
		}
		if starved, _ := s.starved(w.budget); starved || late || ran {
			s.slowYield.Store(time.Now().UnixNano())
			return fmt.Errorf("%w (%w: no reply read within %v of the write): %w", backend.ErrUnread, errWritten, w.budget, context.DeadlineExceeded)
		}
		return s.timeoutError(w, entry)
	}
	return nil
}

// timedOut reports whether err is a deadline: the network's or the context's.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// starvedLately reports whether a yield showed this process starved within
// starvedMemory before now.
func (s *Store) starvedLately(now time.Time) bool {
	return now.UnixNano()-s.slowYield.Load() < int64(starvedMemory)
}

// waitStarved waits, past the caller's deadline, while the call may still
// be answered without blaming Redis for this process's delays (written ops
// get their whole budget from the write; a starved process waits as long
// as its yields take, up to starvedLimit), and reports whether it was.
func (s *Store) waitStarved(w *waiter, entry time.Time) bool {
	if w.wait(time.Until(entry.Add(w.budget))) {
		return true // ctx's deadline came before the budget
	}
	limit := entry.Add(starvedLimit(w.budget))
	for {
		if s.refused(w, entry) != nil {
			return false // the node is down: no reply to wait for
		}
		var late bool
		if wr := w.written.Load(); wr != 0 {
			due := time.Unix(0, wr).Add(w.budget)
			if w.wait(time.Until(due)) {
				return true
			}
			// A wake-up well past its time says the process was not
			// running, which a yield, quick once it runs again, misses.
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
		if !w.taken() && w.node != nil && w.node.stuck(time.Now()) {
			return false // not sent, behind a round trip the node ignores
		}
		j := s.judge(w)
		if j == silent {
			return false // written, and the node sent nothing back
		}
		starved, took := s.starved(w.budget)
		if w.answered() {
			return true
		}
		starved = starved || j == behind
		if late && !starved {
			starved = true
			s.slowYield.Store(time.Now().UnixNano())
		}
		// Redis replied to a round trip since this call was written: it
		// runs, and the reply most likely waits to be read. A frozen Redis
		// replies to none.
		if wr := w.written.Load(); !starved && wr != 0 && s.replied.Load() > wr {
			starved = true
		}
		if !starved {
			// Redis is slow, unless the scheduler has not polled the
			// network for a reply yet, which a busy process does every few ms.
			return w.wait(min(w.budget/10, time.Until(limit)))
		}
		if w.wait(min(max(took, w.budget/2), time.Until(limit))) {
			return true
		}
	}
}

// starved yields the CPU and reports whether this process is too busy to
// run its goroutines promptly (a yield of a tenth of the budget, or one
// within starvedMemory), and how long the yield took. A sender whose reply
// came waits in the global run queue, as a yield does, while a caller
// woken by its timer jumps it.
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

// yields: one yield can be quick by luck on a starved process.
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

// giveUp records that the caller stopped waiting: its queued ops are
// never sent, and a round trip that took them gives up too once no other
// caller waits for it. It reports whether it cancelled one.
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

// board counts w as waiting for f, unless it gave up.
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

// timeoutError says why a call ran out of budget: a refused dial to its
// node (refused) makes it unreachable, the dial's retries outlasting the
// budget; otherwise a timeout, waiting for a reply or for a round trip.
// A call a round trip took is marked errWritten either way.
func (s *Store) timeoutError(w *waiter, entry time.Time) error {
	dial := s.refused(w, entry)
	switch {
	case !w.taken() && dial != nil:
		return unreachable(dial)
	case !w.taken():
		// Not sent: this process's delay, unless a round trip holding a
		// lane is overdue and the node replied to nothing since (stuck).
		if b := w.node; b != nil && b.stuck(time.Now()) {
			return fmt.Errorf("%w within %v: %w", errStuck, w.budget, context.DeadlineExceeded)
		}
		return fmt.Errorf("%w within %v: %w", errNotSent, w.budget, context.DeadlineExceeded)
	case dial != nil:
		return fmt.Errorf("%w (%w: no reply within %v of the write)", unreachable(dial), errWritten, w.budget)
	}
	return fmt.Errorf("%w: no reply within %v of the write: %w", errWritten, w.budget, context.DeadlineExceeded)
}

// judge says what the sockets of w's node say about w, out of budget
// (nodeRecord.judge).
func (s *Store) judge(w *waiter) judgement {
	if w.node == nil || w.written.Load() == 0 {
		return unjudged
	}
	return s.dials.node(w.node.addr).judge(w.written.Load(), w.budget)
}

// refused returns the refused dial that says w's node is down, if any: a
// dial to it failed at most dialRecent before entry or since, and neither
// a dial nor a round trip to it succeeded since (dialLog.refused).
func (s *Store) refused(w *waiter, entry time.Time) error {
	b := w.node
	if b == nil {
		return nil
	}
	return s.dials.refused(b.addr, entry, b.replied.Load())
}

// pipeliner queues the ops bound for one node while its lanes (round
// trips in flight, at most max) are taken. There is no worker (drain).
type pipeliner struct {
	s     *Store
	mu    sync.Mutex
	queue []*op
	lanes int    // round trips in flight or about to be
	max   int    // lanes at most (tests set 1)
	addr  string // the node's address on Cluster; "" otherwise
	// flying are the round trips in flight to the node (see stuck).
	flying [maxLanes]flyingTrip
	// replied is the UnixNano of the node's latest reply (not a timeout,
	// not a failed connection): it ran then.
	replied atomic.Int64
}

// flyingTrip is a round trip in flight: when it was written, and the
// budget its callers give it from then; zero: a free slot.
type flyingTrip struct {
	at     int64
	budget time.Duration
}

func newPipeliner(s *Store, addr string) *pipeliner {
	return &pipeliner{s: s, max: maxLanes, addr: addr}
}

// fly records a round trip written at now with budget, and returns its
// slot for land (-1: none free, only when a test calls exec directly).
func (b *pipeliner) fly(now time.Time, budget time.Duration) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.flying {
		if b.flying[i].at == 0 {
			b.flying[i] = flyingTrip{at: now.UnixNano(), budget: budget}
			return i
		}
	}
	return -1
}

// land records that the round trip of slot came back.
func (b *pipeliner) land(slot int) {
	if slot < 0 {
		return
	}
	b.mu.Lock()
	b.flying[slot] = flyingTrip{}
	b.mu.Unlock()
}

// stuck reports whether the node holds a round trip that is overdue, and
// replied to nothing since it was written, by a patience that this
// process's own delays cannot exhaust: its budget from the write when no
// yield showed this process starved lately, otherwise starvedLimit of it
// (as long as a written call waits for a starved process); on Linux, by
// its budget when its node's sockets show it silent, never when they show
// a reply waiting (nodeRecord.judge). A round trip without a budget is
// never overdue.
func (b *pipeliner) stuck(now time.Time) bool {
	starved := b.s.starvedLately(now)
	replied := b.replied.Load()
	socks := b.s.dials.node(b.addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.flying {
		if f.at != 0 && f.budget > 0 && now.UnixNano()-f.at > int64(f.budget) {
			switch socks.judge(f.at, f.budget) {
			case silent:
				return true
			case behind:
				continue
			}
		}
		patience := f.budget
		if starved {
			patience = starvedLimit(f.budget)
		}
		if f.at != 0 && f.budget > 0 && replied < f.at && now.UnixNano()-f.at > int64(patience) {
			return true
		}
	}
	return false
}

// enqueue queues the ops of w on their nodes' pipeliners, those of one
// node together, and makes sure each is sent: a node with a lane free gets
// a goroutine that sends its queue, except that when mayInline the lane is
// the caller's, and enqueue returns its pipeliner for callInline.
func (s *Store) enqueue(ctx context.Context, w *waiter, ops []op, mayInline bool) (*pipeliner, error) {
	var one [1]*pipeliner
	bs := one[:]
	if len(ops) > 1 {
		bs = make([]*pipeliner, len(ops))
	}
	for i := range ops {
		ops[i].w = w
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
			go b.drain(nil)
		}
	}
	return nil, nil
}

// enqueue queues those of ops whose bs entry is b, clearing it, and
// reports whether the caller took a lane, which it must use to send the
// queue: otherwise a round trip in flight will.
func (b *pipeliner) enqueue(ops []op, bs []*pipeliner) (lane bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range ops {
		if bs[i] == b {
			b.queue = append(b.queue, &ops[i])
			bs[i] = nil
		}
	}
	if b.lanes < b.max {
		b.lanes++
		return true
	}
	return false
}

// drain sends b's queue, a batch per round trip, on a lane its caller
// holds: until self's op is answered (self is callInline's waiter), or
// else until the queue is empty. It then gives the lane back, to a new
// goroutine if a queue is left.
func (b *pipeliner) drain(self *waiter) {
	var batch []*op
	if self != nil {
		batch = self.self[:0]
	}
	for self == nil || self.pending.Load() > 0 {
		b.mu.Lock()
		batch = b.take(batch[:0])
		if len(batch) == 0 {
			b.lanes-- // for self: a caller that took a lane at the same time sent its op
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.s.exec(b, batch, self)
		clear(batch)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) > 0 {
		go b.drain(nil)
		return
	}
	b.lanes--
}

// take moves up to maxBatch ops from the queue into batch (more if the
// last call taken has more ops here: they share a round trip), dropping
// those whose caller gave up. b.mu is held.
func (b *pipeliner) take(batch []*op) []*op {
	n := 0
	for n < len(b.queue) && (len(batch) < maxBatch || b.queue[n].w == batch[len(batch)-1].w) {
		o := b.queue[n]
		n++
		// Claimed before gone is read, as giveUp sets gone before its
		// caller reads unclaimed (taken): either take sees the caller gone
		// or the caller sees its op taken, never a sent op told ErrNotSent.
		o.w.unclaimed.Add(-1)
		if duringTake != nil {
			duringTake(o.w)
		}
		if o.w.gone.Load() && !o.w.detached {
			o.w.unclaimed.Add(1)
			continue
		}
		batch = append(batch, o)
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// errNoKey is a bug: an op without its key would go to the wrong node.
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
	s.dials.hook(node) // a node client made before New
	b, _ := s.nodes.LoadOrStore(addr, newPipeliner(s, addr))
	return b.(*pipeliner), nil
}

// noRetry is a command go-redis must not send again once written (its
// MaxRetries would): a decision run twice takes effect twice. Only a
// command known not to have reached the server (a failed dial, a MOVED or
// ASK) is sent again.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// exec sends one batch in one round trip with a deadline of its own,
// counted from the write, re-sends with EVAL the calls a node could not
// run, and wakes every waiter whose ops are all answered; b is the
// pipeliner of the batch's node, which tracks it in flight. self is the
// waiter of a caller that sends the batch itself (callInline), whose
// budget is the round trip's; nil for a drain goroutine.
func (s *Store) exec(b *pipeliner, batch []*op, self *waiter) {
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
		// The sending caller returns by its own bound: an unbounded waiter
		// that queued into its batch gets an error past it.
		bounded = budget > 0
	}
	var ctx context.Context
	switch {
	case inline:
		self.wd = writeDeadline{Context: self.ctx}
		if bounded {
			self.wd.at, self.wd.done = now.Add(budget), doneUnlessPast(self.ctx, now)
		}
		ctx = &self.wd
	case !bounded: // neither deadline nor Done: as long as it takes
		ctx = &writeDeadline{Context: batch[0].w.ctx}
	default:
		// The waiters' patience with a starved process, and half a budget
		// more, so that a reply that came in time is read; cancelled as soon
		// as none of them waits (flight).
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
	slot := b.fly(now, budget)
	s.send(ctx, batch)
	b.land(slot)
	heal, replied := false, false
	for _, o := range batch {
		err := o.cmd.Err()
		replied = replied || err == nil
		if err != nil {
			s.logReply(err)
			heal = heal || (s.cluster != nil && stale(err))
			replied = replied || isReply(err)
		}
	}
	if replied {
		at := time.Now().UnixNano()
		s.replied.Store(at)
		b.replied.Store(at)
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

// isReply reports whether err is an error reply: Redis's answer too.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// writeDeadline is a round trip's context without a timer of its own: the
// caller's values, the budget's deadline from the write (go-redis sets it
// on the connection), and the caller's Done, which go-redis reads only
// while it waits for a connection (nil when the deadline had passed).
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

// afterGiveUp and beforeWrite, set by tests, run once a caller gave up (a
// cancelled round trip answering first) and before a batch is written (a
// process too busy to run the sender).
var afterGiveUp, beforeWrite func()

// duringTake, set by tests, runs between take's claim of an op of w and
// its reading whether w's caller gave up: a caller giving up then.
var duringTake func(w *waiter)

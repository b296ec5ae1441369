package redis

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// tripCounter is a go-redis hook counting round trips: a lone command or a
// pipeline each make one, with the number of commands of each.
type tripCounter struct {
	mu    sync.Mutex
	trips []int
}

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "fcall" || name == "evalsha" {
			c.add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "fcall" || name == "evalsha" {
				n++
			}
		}
		if n > 0 { // not a connection's handshake
			c.add(n)
		}
		return next(ctx, cmds)
	}
}

func (c *tripCounter) add(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = append(c.trips, n)
}

func (c *tripCounter) get() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.trips...)
}

// clientKinds are the two ways a client treats a context's deadline: left
// to the Store (go-redis's default), and kept by go-redis itself
// (ContextTimeoutEnabled), under which a lone decision on an idle node is
// sent by its caller.
var clientKinds = []struct {
	name string
	new  func(t *testing.T, addr string) *redis.Client
}{
	{"default", defaultClient},
	{"ContextTimeoutEnabled", func(t *testing.T, addr string) *redis.Client {
		return defaultClientOpts(t, &redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}},
}

// forEachClientKind runs test once per clientKinds entry.
func forEachClientKind(t *testing.T, test func(t *testing.T, newClient func(t *testing.T, addr string) *redis.Client)) {
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) { test(t, k.new) })
	}
}

// oneLane makes s send one round trip at a time to its node, so that a
// test holding it queues the decisions made meanwhile.
func oneLane(s *Store) *Store {
	s.pipe.max = 1
	return s
}

// lanes is how many of the store's lanes are taken: round trips in flight,
// sent by their callers or by a goroutine started for the queue.
func lanes(s *Store) int {
	s.pipe.mu.Lock()
	defer s.pipe.mu.Unlock()
	return s.pipe.lanes
}

// queued is how many ops wait in the store's queue.
func queued(s *Store) int {
	s.pipe.mu.Lock()
	defer s.pipe.mu.Unlock()
	return len(s.pipe.queue)
}

// waitFor polls ok every few milliseconds for up to 10s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// holdTheLane stalls proxy and sends a decision on key "k" through s, a
// Store of one round trip in flight: once written says it was written,
// that decision holds the only lane until proxy.Resume. Its outcome comes
// on the channel.
func holdTheLane(t *testing.T, s *Store, proxy *redistest.Proxy, written func() bool) <-chan error {
	t.Helper()
	proxy.Stall()
	first := make(chan error, 1)
	go func() {
		_, err := s.Decide(context.Background(), []backend.Request{day("k", 1)})
		first <- err
	}()
	waitFor(t, "the first round trip", written)
	return first
}

// TestDecisionsWaitingForARoundTripShareTheNext holds the only round trip
// in flight (the proxy stalls its reply) while 20 decisions arrive: they
// queue, and when the reply comes they go out together, in one pipelined
// write, each still decided on its own.
// The held round trip is sent by a worker, or, under ContextTimeoutEnabled,
// by its caller, which hands the queue to a worker when the reply comes.
func TestDecisionsWaitingForARoundTripShareTheNext(t *testing.T) {
	forEachClientKind(t, testDecisionsWaitingForARoundTripShareTheNext)
}

func testDecisionsWaitingForARoundTripShareTheNext(t *testing.T, newClient func(t *testing.T, addr string) *redis.Client) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	client := newClient(t, proxy.Addr)
	trips := &tripCounter{}
	client.AddHook(trips)
	s := oneLane(New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	ctx := context.Background()
	decide(t, s, day("warm", 1))

	first := holdTheLane(t, s, proxy, func() bool { return len(trips.get()) == 2 })
	const n = 20
	var wg sync.WaitGroup
	results := make([]backend.Result, n)
	for i := range n {
		wg.Go(func() {
			res, err := s.Decide(ctx, []backend.Request{day("k", 1)})
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = res[0]
		})
	}
	waitFor(t, "20 queued decisions", func() bool { return queued(s) == n })
	proxy.Resume()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// Lone calls all, the n share one run of the batch script.
	if got, want := trips.get(), []int{1, 1, 1}; !equalInts(got, want) {
		t.Errorf("scripts per round trip = %v, want %v", got, want)
	}
	seen := map[int64]bool{}
	for _, r := range results {
		if !r.Allowed || seen[r.Remaining] {
			t.Fatalf("results %+v: want %d admissions, each seeing its own remaining", results, n)
		}
		seen[r.Remaining] = true
	}
	if got, want := stored(t, s, "k"), int64(n+1); got != want {
		t.Errorf("units stored = %d, want %d", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDecideReturnsByItsDeadline stalls every reply: Decide (and Reset)
// returns when its context's deadline passes (up to 2s later when this
// process is starved for CPU), with an error wrapping
// context.DeadlineExceeded, whatever the client's own timeouts (go-redis's
// default read timeout is 3s and ignores the context).
// Under ContextTimeoutEnabled the lone decision is sent by its caller and
// held to the same deadline.
func TestDecideReturnsByItsDeadline(t *testing.T) {
	forEachClientKind(t, testDecideReturnsByItsDeadline)
}

func testDecideReturnsByItsDeadline(t *testing.T, newClient func(t *testing.T, addr string) *redis.Client) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	s := New(newClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	proxy.Stall()
	defer proxy.Resume()
	for _, n := range []int{1, 8} { // a lone decision, then a batch
		start := time.Now()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("stalled Redis: err = %v, want context.DeadlineExceeded", err)
				}
			})
		}
		wg.Wait()
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%d decisions on a stalled Redis returned after %v, want about 100ms (at most 2s on a starved process, 5s with scheduling)", n, d)
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Reset(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Reset on a stalled Redis: err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Reset on a stalled Redis returned after %v, want about 100ms (at most 2s on a starved process, 5s with scheduling)", d)
	}
}

// TestBudgetCountsFromTheWrite delays the write of a decision past its
// context's deadline, as a process too busy to run the store's worker
// would: Redis answers at once after the write, and the answer is used,
// because the budget the deadline left at entry is counted from the write.
// Under ContextTimeoutEnabled the caller sends its decision itself, and
// the budget counts from its write as well.
func TestBudgetCountsFromTheWrite(t *testing.T) {
	forEachClientKind(t, testBudgetCountsFromTheWrite)
}

func testBudgetCountsFromTheWrite(t *testing.T, newClient func(t *testing.T, addr string) *redis.Client) {
	s := New(newClient(t, redistest.Shared(t).Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	beforeWrite = func() { time.Sleep(150 * time.Millisecond) }
	defer func() { beforeWrite = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res, err := s.Decide(ctx, []backend.Request{day("k", 1)})
	if err != nil {
		t.Fatalf("Decide whose write this process delayed by 150ms, with a 100ms budget: %v", err)
	}
	if !res[0].Allowed {
		t.Fatalf("result %+v, want admitted", res[0])
	}
}

// TestScriptCacheFlushedUnderABatch empties the script cache and the
// library while a batch waits: each script of the batch finds no function,
// and the store re-sends them all with EVAL in one more round trip, each
// decided once.
func TestScriptCacheFlushedUnderABatch(t *testing.T) {
	srv := redistest.Shared(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	client := defaultClient(t, proxy.Addr)
	count := countCommands(client)
	trips := &tripCounter{}
	client.AddHook(trips)
	s := oneLane(New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	ctx := context.Background()
	decide(t, s, day("warm", 1))

	first := holdTheLane(t, s, proxy, func() bool { return len(trips.get()) == 2 })
	const n = 10
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(t, "queued decisions", func() bool { return queued(s) == n })
	if err := flushScripts(ctx, srv.Client(t)); err != nil {
		t.Fatal(err)
	}
	count.reset()
	proxy.Resume()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	evals := 0
	for _, name := range count.sent() {
		if name == "eval" {
			evals++
		}
	}
	if evals != 1 {
		t.Errorf("commands after the flush %v: %d EVAL, want 1 (the batch script the n lone calls share)", count.sent(), evals)
	}
	if got, want := stored(t, s, "k"), int64(n+1); got != want {
		t.Errorf("units stored = %d, want %d: each decision once", got, want)
	}
}

// TestLoneDecisionSentByItsCaller: on a client that keeps its context's
// deadline (ContextTimeoutEnabled), decisions made one at a time are
// written by their callers' goroutines (the test's own frame is on the
// stack that writes them); on a default client, whose deadline the Store
// keeps, another goroutine writes each round trip while its caller waits
// with a timer, except for a call with no bound at all. Either way no
// goroutine and no lane is left afterwards.
func TestLoneDecisionSentByItsCaller(t *testing.T) {
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) {
			client := k.new(t, redistest.Shared(t).Addr)
			callers := &callerFrames{}
			client.AddHook(callers)
			s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			// A call with no bound waits as long as it takes: its caller
			// sends it on any client.
			if _, err := s.Decide(context.Background(), []backend.Request{day("k", 1)}); err != nil {
				t.Fatal(err)
			}
			byCaller, byOther := callers.counts()
			switch {
			case k.name == "ContextTimeoutEnabled" && (byCaller != 4 || byOther != 0):
				t.Errorf("scripts written by their caller / by another goroutine = %d / %d, want 4 / 0", byCaller, byOther)
			case k.name == "default" && (byCaller != 1 || byOther != 3):
				t.Errorf("scripts written by their caller / by another goroutine = %d / %d, want 1 / 3 (the unbounded call by its caller)", byCaller, byOther)
			}
			waitFor(t, "every lane given back", func() bool { return lanes(s) == 0 })
			if got, want := stored(t, s, "k"), int64(4); got != want {
				t.Errorf("units stored = %d, want %d", got, want)
			}
		})
	}
}

// callerFrames is a go-redis hook counting the EVALSHA commands written
// on a goroutine whose stack holds TestLoneDecisionSentByItsCaller, and
// the others.
type callerFrames struct {
	tripCounter
	mu                sync.Mutex
	byCaller, byOther int
}

func (c *callerFrames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "fcall" || name == "evalsha" {
			pcs := make([]uintptr, 64)
			frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
			mine := false
			for {
				f, more := frames.Next()
				mine = mine || strings.Contains(f.Function, "TestLoneDecisionSentByItsCaller")
				if !more {
					break
				}
			}
			c.mu.Lock()
			if mine {
				c.byCaller++
			} else {
				c.byOther++
			}
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *callerFrames) counts() (byCaller, byOther int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byCaller, c.byOther
}

// TestInlineBatchKeepsItsSendersBound: a caller that sends a batch itself
// returns by its budget on a stalled Redis even when a waiter without a
// budget queued into that batch (go-redis's own read timeout, 3s, would
// hold it otherwise).
func TestInlineBatchKeepsItsSendersBound(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	s := New(defaultClientOpts(t, &redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true}), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	proxy.Stall()
	defer proxy.Resume()
	var batch []*op
	for _, budget := range []time.Duration{100 * time.Millisecond, 0} {
		w, ops := newWaiter(context.Background(), 1)
		w.budget = budget
		w.pending.Store(1)
		ops[0] = s.scriptOp(context.Background(), decideScript, []string{s.prefix + "k"}, s.args([]backend.Request{day("k", 1)}, false))
		ops[0].w = w
		batch = append(batch, &ops[0])
	}
	start := time.Now()
	s.exec(s.pipe, batch, batch[0].w)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a batch sent by a caller with a 100ms budget returned after %v on a stalled Redis, want about 100ms", d)
	}
}

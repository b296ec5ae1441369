package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// frozenCall decides on a Redis frozen with SIGSTOP and returns the error
// and how long the call took.
func frozenCall(t *testing.T, inline bool) (error, time.Duration) {
	inst := redistest.Server(t)
	s := New(defaultClientOpts(t, &redis.Options{Addr: inst.Addr, ContextTimeoutEnabled: inline}), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	// The warm-up's library load is not this test's: its reply, left
	// unread on its connection by a starved process, would say "this
	// process is behind" (nodeRecord.judge) until the load reads it.
	waitForLibrary(t, inst.Client(t))
	inst.Freeze(t)
	defer inst.Thaw(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
	return err, time.Since(start)
}

// wantBackendsFailure checks that err blames the backend: written and
// unanswered, neither this process's delay in writing nor in reading.
func wantBackendsFailure(t *testing.T, err error, took, within time.Duration) {
	t.Helper()
	if !errors.Is(err, errWritten) || errors.Is(err, backend.ErrUnread) || errors.Is(err, backend.ErrNotSent) {
		t.Errorf("a frozen Redis: %v, want the backend's failure (written, no reply)", err)
	}
	if took > within {
		t.Errorf("returned after %v, want within %v: the sockets say nothing came back", took, within)
	}
	t.Logf("returned after %v: %v", took, err)
}

// TestAFrozenRedisIsBlamedWithinTheBudget: on a prompt process, a call to
// a Redis frozen with SIGSTOP fails as the backend's, soon after its
// 100ms budget, whichever goroutine sends it.
func TestAFrozenRedisIsBlamedWithinTheBudget(t *testing.T) {
	for _, inline := range []bool{false, true} {
		err, took := frozenCall(t, inline)
		wantBackendsFailure(t, err, took, 300*time.Millisecond)
	}
}

// TestAFrozenRedisIsBlamedOnAStarvedProcess: the same with one CPU and 16
// busy goroutines, where every yield is slow and the old patience with a
// starved process waited 2s (starvedWait) and, for a caller that sent its
// call itself, blamed this process (backend.ErrUnread): the sockets show
// the call written and nothing back, the backend's failure soon after the
// budget, however loaded this process is.
func TestAFrozenRedisIsBlamedOnAStarvedProcess(t *testing.T) {
	// A CPU flood timing a frozen server: on a machine that others load
	// too, this process waits for a CPU beyond the bound it asserts.
	citest.Only(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := burnCPU(16)
	defer stop()
	for _, inline := range []bool{false, true} {
		err, took := frozenCall(t, inline)
		wantBackendsFailure(t, err, took, starvedWait/2)
	}
}

// TestAReplyWaitingUnreadIsThisProcesssDelay holds the reader of a healthy
// Redis's reply for three budgets, as a process too busy to run it would:
// the reply waits in the kernel, so the caller keeps waiting (within
// starvedLimit) and takes it. Before, a prompt caller with no other reply
// since its write blamed Redis a tenth of a budget after its budget. A
// caller that sends its call itself, whose read's deadline passes with the
// reply waiting, fails with backend.ErrUnread (shed), not the backend's
// failure.
func TestAReplyWaitingUnreadIsThisProcesssDelay(t *testing.T) {
	const budget = 100 * time.Millisecond
	for _, inline := range []bool{false, true} {
		s := New(defaultClientOpts(t, &redis.Options{Addr: redistest.Shared(t).Addr, ContextTimeoutEnabled: inline}), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
		decide(t, s, day("warm", 1))
		var hold atomic.Bool
		hook := func() {
			if hold.CompareAndSwap(true, false) {
				time.Sleep(3 * budget)
			}
		}
		beforeRead.Store(&hook)
		hold.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		res, err := s.Decide(ctx, []backend.Request{day("k", 1)})
		cancel()
		beforeRead.Store(nil)
		switch {
		case inline && !errors.Is(err, backend.ErrUnread):
			t.Errorf("inline: a reply left unread past the deadline: %v, want backend.ErrUnread", err)
		case !inline && (err != nil || !res[0].Allowed):
			t.Errorf("a reply read late: %+v, %v; want it admitted", res, err)
		}
	}
}

// TestAWatchedIdleConnectionIsStillHealthChecked: the server closes the
// store's idle pooled connection (CLIENT KILL); go-redis's health check,
// which peeks the socket of the connection it took from the pool, sees the
// close through the watching wrapper and dials anew, so the next decision
// is answered (a script is never re-sent, so a dead connection would be
// its error).
func TestAWatchedIdleConnectionIsStillHealthChecked(t *testing.T) {
	addr := redistest.Shared(t).Addr
	name := fmt.Sprint("watched-", time.Now().UnixNano())
	client := defaultClientOpts(t, &redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1, ClientName: name})
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	admin := defaultClient(t, addr)
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			id = strings.TrimPrefix(strings.Fields(line)[0], "id=")
		}
	}
	if id == "" {
		t.Fatalf("the store's connection is not in CLIENT LIST:\n%s", list)
	}
	if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the FIN reaches the client's socket
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if res, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err != nil || !res[0].Allowed {
		t.Errorf("a decision after the idle connection was killed: %+v, %v; want admitted on a new one", res, err)
	}
}

// TestACallBehindASilentRoundTripIsTheBackends: on one lane, a call queued
// behind a round trip to a frozen Redis (whose 60ms caller gave up, the
// lane still held), on a starved process, runs out of its budget unsent;
// the lane's round trip is overdue and its sockets show
// nothing came back, so the call fails as the node's (errStuck, the fail
// mode applies; or, sent once the lane came free, errWritten) at its
// budget, not as this process's delay
// (backend.ErrNotSent, shed) for 2s of patience with a starved process.
func TestACallBehindASilentRoundTripIsTheBackends(t *testing.T) {
	citest.Only(t) // a CPU flood, and a frozen server's timing
	inst := redistest.Server(t)
	s := oneLane(New(defaultClient(t, inst.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	decide(t, s, day("warm", 1))
	waitForLibrary(t, inst.Client(t)) // its load is not this test's
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := burnCPU(16)
	defer stop()
	inst.Freeze(t)
	defer inst.Thaw(t)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		defer cancel()
		_, err := s.Decide(ctx, []backend.Request{day("first", 1)})
		first <- err
	}()
	waitFor(t, "the first call's write", func() bool { return lanes(s) == 1 })
	time.Sleep(50 * time.Millisecond)
	s.slowYield.Store(time.Now().UnixNano()) // starved, whatever the yields say
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.Decide(ctx, []backend.Request{day("second", 1)})
	took := time.Since(start)
	// errWritten when the first caller's cancellation ended its round
	// trip in time for this call to be written: silent too.
	if !(errors.Is(err, errStuck) || errors.Is(err, errWritten)) || errors.Is(err, backend.ErrNotSent) || errors.Is(err, backend.ErrUnread) {
		t.Errorf("a call queued behind a silent round trip: %v, want the backend's failure (errStuck, or errWritten)", err)
	}
	if err := <-first; !errors.Is(err, errWritten) || errors.Is(err, backend.ErrUnread) {
		t.Errorf("the silent round trip's call: %v, want the backend's failure", err)
	}
	if took > starvedWait/2 {
		t.Errorf("returned after %v, want within %v", took, starvedWait/2)
	}
	t.Logf("returned after %v: %v", took, err)
}

// TestAFrozenRedisIsBlamedBesideAnUnreadSubscription: the user's own
// subscriber on the store's client has a message it has not read yet,
// waiting in the kernel on its connection, when Redis freezes. Those bytes
// answer no round trip in flight, so they say nothing of this process's
// delay: a call to the frozen Redis is still the backend's failure, soon
// after its budget, not this process's (ErrUnread, or a wait for a starved
// process's patience).
func TestAFrozenRedisIsBlamedBesideAnUnreadSubscription(t *testing.T) {
	for _, inline := range []bool{false, true} {
		inst := redistest.Server(t)
		client := defaultClientOpts(t, &redis.Options{Addr: inst.Addr, ContextTimeoutEnabled: inline})
		s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
		decide(t, s, day("warm", 1))
		waitForLibrary(t, inst.Client(t))
		sub := client.Subscribe(context.Background(), "news")
		if _, err := sub.Receive(context.Background()); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		if err := inst.Client(t).Publish(context.Background(), "news", "unread").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the message in the kernel", func() bool {
			rec := s.dials.node(inst.Addr)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for c := range rec.conns {
				if c.waiting() > 0 {
					return true
				}
			}
			return false
		})
		inst.Freeze(t)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
		cancel()
		wantBackendsFailure(t, err, time.Since(start), 300*time.Millisecond)
		inst.Thaw(t)
		sub.Close()
	}
}

package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestACallBehindARefusedDialIsUnreachable kills Redis; a call's dial is
// refused, and go-redis waits 500ms to dial again, holding the only lane. A
// call that begins after the refusal and runs out of its budget queued
// behind it never dials itself, yet the node is down: it fails as
// unreachable (the fail mode applies), not as never sent (shed) (finding
// 4: Redis killed, the first request shed with a refused dial logged 60ms
// before it).
func TestACallBehindARefusedDialIsUnreachable(t *testing.T) {
	inst := redistest.Server(t)
	client := defaultClientOpts(t, &redis.Options{Addr: inst.Addr, MaxRetries: -1, DialerRetries: 2, DialerRetryTimeout: 500 * time.Millisecond})
	s := oneLane(New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	decide(t, s, day("warm", 1))
	inst.Kill()
	for { // until the pooled connection is gone and a dial was refused
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Decide(ctx, []backend.Request{day("drain", 1)})
		cancel()
		if err == nil {
			t.Fatal("decided on a killed Redis")
		}
		if s.dials.all.failed.Load() != nil {
			break
		}
	}
	s.dials.all.failed.Store(nil)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := s.Decide(ctx, []backend.Request{day("first", 1)})
		first <- err
	}()
	waitFor(t, "the first call's refused dial", func() bool { return s.dials.all.failed.Load() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.Decide(ctx, []backend.Request{day("second", 1)})
	if !errors.Is(err, backend.ErrUnreachable) || errors.Is(err, backend.ErrNotSent) {
		t.Errorf("a call queued behind a refused dial: %v, want backend.ErrUnreachable", err)
	}
	if err := <-first; !errors.Is(err, backend.ErrUnreachable) {
		t.Errorf("the call whose dial was refused: %v, want backend.ErrUnreachable", err)
	}
}

// TestARefusedDialBlamesTheNodeUntilItAnswers: a refused dial up to
// dialRecent before a call says its node is down, until a dial or a round
// trip to it succeeds; a dial that timed out before the call may have been
// this process's delay, and one older than dialRecent says nothing.
func TestARefusedDialBlamesTheNodeUntilItAnswers(t *testing.T) {
	refusedErr := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timeoutErr := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	call := time.Now()
	for _, tc := range []struct {
		name    string
		at      time.Duration // the failure, from the call
		err     error
		replied time.Duration // the node's last reply, from the call
		dialed  bool          // a dial succeeded after the failure
		blamed  bool
	}{
		{"refused 60ms before the call", -60 * time.Millisecond, refusedErr, -time.Hour, false, true},
		{"refused during the call", 10 * time.Millisecond, refusedErr, -time.Hour, false, true},
		{"refused, then the node replied", -60 * time.Millisecond, refusedErr, -50 * time.Millisecond, false, false},
		{"refused, then a dial succeeded", -60 * time.Millisecond, refusedErr, -time.Hour, true, false},
		{"refused longer than dialRecent before", -dialRecent - time.Millisecond, refusedErr, -time.Hour, false, false},
		{"timed out before the call", -60 * time.Millisecond, timeoutErr, -time.Hour, false, false},
		{"timed out during the call", 10 * time.Millisecond, timeoutErr, -time.Hour, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, addr := range []string{"", "10.0.0.1:6379"} { // single node, Cluster
				var d dialLog
				f := &dialFailure{at: call.Add(tc.at), err: tc.err}
				d.all.failed.Store(f)
				d.node(addr).failed.Store(f)
				if tc.dialed {
					d.all.failed.Store(nil)
					d.node(addr).failed.Store(nil)
				}
				got := d.refused(addr, call, call.Add(tc.replied).UnixNano())
				if blamed := got != nil; blamed != tc.blamed {
					t.Errorf("addr %q: refused = %v, want blamed %v", addr, got, tc.blamed)
				}
			}
		})
	}
}

// TestAStuckNodeIsNeverThisProcesssStall: a call no round trip took by
// its deadline is the node's fault (errStuck, the fail mode applies) only
// when a round trip in flight to it is overdue by a patience this
// process's delays cannot exhaust, and the node replied to nothing since
// it was written; otherwise it is this process's (backend.ErrNotSent,
// shed). On a fresh Store no round trip has come back yet, which says
// nothing (before, zero timestamps called it stuck at once).
func TestAStuckNodeIsNeverThisProcesssStall(t *testing.T) {
	const budget = 100 * time.Millisecond
	for _, tc := range []struct {
		name    string
		flying  time.Duration // since the round trip in flight was written; 0: none
		budget  time.Duration // its budget
		replied bool          // the node replied since its write
		starved bool          // a yield showed this process starved lately
		stuck   bool
	}{
		{"fresh Store, no round trip in flight", 0, budget, false, false, false},
		{"fresh Store, a round trip within its budget", 20 * time.Millisecond, time.Second, false, false, false},
		{"a round trip overdue, the process prompt", 2 * budget, budget, false, false, true},
		{"a round trip overdue, the node replied since", 2 * budget, budget, true, false, false},
		{"a round trip overdue on a starved process", 2 * budget, budget, false, true, false},
		{"a round trip overdue past the starved patience", starvedLimit(budget) + budget, budget, false, true, true},
		{"a round trip without a budget", time.Hour, 0, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{}
			b := newPipeliner(s, "")
			now := time.Now()
			if tc.flying > 0 {
				b.fly(now.Add(-tc.flying), tc.budget)
			}
			if tc.replied {
				b.replied.Store(now.Add(-tc.flying / 2).UnixNano())
			}
			if tc.starved {
				s.slowYield.Store(now.UnixNano())
			}
			w := &waiter{done: make(chan struct{}, 1), budget: budget, n: 1, node: b}
			w.unclaimed.Store(1)
			err := s.timeoutError(w, now.Add(-budget))
			if stuck := errors.Is(err, errStuck); stuck != tc.stuck || stuck == errors.Is(err, backend.ErrNotSent) {
				t.Errorf("timeoutError = %v, want stuck %v (else backend.ErrNotSent)", err, tc.stuck)
			}
		})
	}
}

// TestAFailedConnectionIsNoReply: a round trip that failed on a refused
// dial or a lost connection does not count as Redis replying (which would
// say Redis runs and the reply waits to be read); an error reply does.
func TestAFailedConnectionIsNoReply(t *testing.T) {
	inst := redistest.Server(t)
	s := New(defaultClientOpts(t, &redis.Options{Addr: inst.Addr, MaxRetries: -1, DialerRetries: 1}), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	decide(t, s, day("warm", 1))
	if s.pipe.replied.Load() == 0 || s.replied.Load() == 0 {
		t.Fatal("a decision answered, and no reply recorded")
	}
	inst.Kill()
	before := s.pipe.replied.Load()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Decide(ctx, []backend.Request{day(fmt.Sprint("k", i), 1)})
		cancel()
		if err == nil {
			t.Fatal("decided on a killed Redis")
		}
	}
	if got := s.pipe.replied.Load(); got != before || s.replied.Load() != before {
		t.Errorf("failed round trips on a killed Redis recorded a reply")
	}
}

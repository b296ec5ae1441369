package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

func fixed(key string, limit, cost int64) backend.Request {
	return backend.Request{Key: key, Algorithm: backend.FixedWindow, Limit: limit, Period: time.Hour, Cost: cost}
}

// remaining peeks at a key.
func remaining(t *testing.T, s *Store, key string, limit int64) int64 {
	t.Helper()
	return decide(t, s, fixed(key, limit, 0))[0].Remaining
}

func TestRejectedRuleConsumesFromNoRule(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		decide(t, s, fixed("day:a", 1, 1)) // the day budget is spent
		// Keys on several slots on Cluster: the minute rule and a forced
		// charge consume in their slots, then are refunded.
		res := decide(t, s,
			fixed("minute:a", 5, 1),
			backend.Request{Key: "tokens:a", Algorithm: backend.FixedWindow, Limit: 100, Period: time.Hour, Cost: 7, Force: true},
			fixed("day:a", 1, 1),
		)
		if res[2].Allowed {
			t.Fatal("day rule admitted past its limit")
		}
		if !res[0].Allowed {
			t.Error("minute rule reported rejected although it fits")
		}
		if got, want := remaining(t, s, "minute:a", 5), int64(5); got != want {
			t.Errorf("minute remaining after a rejected request = %d, want %d", got, want)
		}
		if got, want := remaining(t, s, "tokens:a", 100), int64(100); got != want {
			t.Errorf("forced charge in a rejected request: remaining = %d, want %d", got, want)
		}
	})
}

func TestRequestsOnOneKeySeeEachOther(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		res := decide(t, s, fixed("k", 2, 1), fixed("k", 2, 1))
		if got, want := []int64{res[0].Remaining, res[1].Remaining}, []int64{1, 0}; got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("remaining = %v, want %v", got, want)
		}
		res = decide(t, s, fixed("j", 1, 1), fixed("j", 1, 1))
		if !res[0].Allowed || res[1].Allowed {
			t.Fatalf("allowed = %v, %v; want true, false", res[0].Allowed, res[1].Allowed)
		}
		if got, want := remaining(t, s, "j", 1), int64(1); got != want {
			t.Errorf("remaining after the rejected pair = %d, want %d", got, want)
		}
	})
}

func TestRejectedCrossSlotRequestLeavesEveryCounter(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		keys := []string{"a:1", "b:2", "c:3", "d:4", "e:5", "f:6"}
		for _, k := range keys {
			decide(t, s, fixed(k, 10, 3)) // every counter at 7 remaining
		}
		decide(t, s, fixed("full", 1, 1))
		for _, alg := range []backend.Algorithm{backend.GCRA, backend.SlidingLog, backend.SlidingWindow, backend.FixedWindow} {
			reqs := []backend.Request{fixed("full", 1, 1)}
			for _, k := range keys {
				reqs = append(reqs, backend.Request{Key: k + alg.String(), Algorithm: alg, Limit: 10, Period: time.Hour, Cost: 2})
			}
			// Refunds in a rejected call give nothing back either; on Cluster
			// the slots that applied one charge it again.
			for _, k := range keys {
				reqs = append(reqs, fixed(k, 10, -2))
			}
			res, err := s.Decide(context.Background(), reqs)
			if err != nil {
				t.Fatalf("%v: Decide: %v", alg, err) // a CROSSSLOT error would land here
			}
			if res[0].Allowed {
				t.Fatalf("%v: full key admitted", alg)
			}
			for _, r := range reqs[1 : 1+len(keys)] {
				r.Cost = 0
				if got, want := decide(t, s, r)[0].Remaining, int64(10); got != want {
					t.Errorf("%v: %s remaining = %d after a rejected request, want %d", alg, r.Key, got, want)
				}
			}
		}
		for _, k := range keys {
			if got, want := remaining(t, s, k, 10), int64(7); got != want {
				t.Errorf("%s remaining = %d after rejected refunds, want %d", k, got, want)
			}
		}
	})
}

// TestClusterRefundUndoesOnlyItsOwnUnits pins the stamps: a refund after
// the window moved on, or after other units were added, gives back only the
// units of the consumption it undoes.
func TestClusterRefundUndoesOnlyItsOwnUnits(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		clock := newFakeClock()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		ctx := context.Background()
		run := func(req backend.Request, stamp int64) {
			t.Helper()
			req.Stamp = stamp
			if _, err := s.run(ctx, []backend.Request{req}); err != nil {
				t.Fatal(err)
			}
		}
		t0 := clock.Now().UnixMicro()
		for _, alg := range []backend.Algorithm{backend.SlidingLog, backend.FixedWindow, backend.SlidingWindow} {
			req := backend.Request{Key: "k:" + alg.String(), Algorithm: alg, Limit: 10, Period: time.Second, Cost: 2}
			decide(t, s, req) // units at t0, the ones a refund will undo
			clock.Advance(1500 * time.Millisecond)
			req.Cost = 3
			decide(t, s, req) // units in the next window, nobody's to undo
			refund := req
			refund.Cost, refund.Force = -2, true
			run(refund, t0)
			peek := req
			peek.Cost = 0
			got := decide(t, s, peek)[0].Remaining
			want := map[backend.Algorithm]int64{
				backend.SlidingLog:    7, // t0's units expired: nothing to give back
				backend.FixedWindow:   7, // t0's window is over
				backend.SlidingWindow: 7, // prev 2 → 0, cur 3
			}[alg]
			if got != want {
				t.Errorf("%v: remaining after a stamped refund = %d, want %d", alg, got, want)
			}
			clock.Advance(-1500 * time.Millisecond)
		}
	})
}

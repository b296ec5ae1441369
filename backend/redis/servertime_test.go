package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestDecisionsUseTheServersClock pins "time comes from the backend": a
// Store without WithClock decides on Redis TIME, not on this process's
// clock. miniredis's clock is set far from the process's (in 2031, on an
// hour boundary), so that a script given the application's time instead
// would report other windows and never see an hour pass. Both scripts are
// covered: the lone GCRA request's and the general one.
func TestDecisionsUseTheServersClock(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0)) // the deny cache runs on this process's clock, by design

	server := time.Date(2031, 3, 1, 10, 0, 0, 0, time.UTC)
	mr.SetTime(server.Add(time.Second))
	gcra := backend.Request{Key: "gcra", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour, Cost: 1}
	fixed := backend.Request{Key: "fixed", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	other := backend.Request{Key: "other", Algorithm: backend.FixedWindow, Limit: 100, Period: time.Hour, Cost: 1}

	if res := decide(t, s, gcra)[0]; !res.Allowed || res.ResetAfter != time.Hour {
		t.Fatalf("GCRA at 10:00:01 server time: %+v, want admitted, full again in 1h", res)
	}
	res := decide(t, s, fixed, other)
	if !res[0].Allowed || res[0].ResetAfter != time.Hour-time.Second {
		t.Fatalf("fixed window at 10:00:01 server time: %+v, want admitted, its hour ending in 59m59s", res[0])
	}

	mr.SetTime(server.Add(30 * time.Minute))
	if res := decide(t, s, gcra)[0]; res.Allowed || res.RetryAfter != 30*time.Minute+time.Second {
		t.Errorf("GCRA at 10:30 server time: %+v, want rejected for 30m1s", res)
	}
	if res := decide(t, s, fixed, other)[0]; res.Allowed || res.RetryAfter != 30*time.Minute {
		t.Errorf("fixed window at 10:30 server time: %+v, want rejected until 11:00, in 30m", res)
	}

	// An hour of server time passes in no time on this process's clock.
	mr.SetTime(server.Add(time.Hour + time.Second))
	if res := decide(t, s, gcra)[0]; !res.Allowed {
		t.Errorf("GCRA an hour later on the server: %+v, want admitted", res)
	}
	if res := decide(t, s, fixed, other)[0]; !res.Allowed || res.ResetAfter != time.Hour-time.Second {
		t.Errorf("fixed window in the next hour on the server: %+v, want admitted, ending in 59m59s", res)
	}
}

// TestBatchedDecisionsUseTheServersClock covers the shared script's clock:
// lone GCRA, rolling-window and sliding-log decisions queued behind a round
// trip in flight go out as one script run (batch.lua), which reads Redis
// TIME once for all of them. miniredis's clock is set in 2031, as in
// TestDecisionsUseTheServersClock; a batch decided on this process's clock
// would see a fresh rolling window's unit counted to another instant, no
// half hour pass between the first batch and the second, and no hour
// before the third.
func TestBatchedDecisionsUseTheServersClock(t *testing.T) {
	mr := miniredis.RunT(t)
	proxy := redistest.NewProxy(t, mr.Addr())
	client := defaultClient(t, proxy.Addr)
	trips := &tripCounter{}
	client.AddHook(trips)
	s := oneLane(New(client, WithDenyCache(0))) // the deny cache runs on this process's clock, by design

	server := time.Date(2031, 3, 1, 10, 0, 0, 0, time.UTC)
	mr.SetTime(server.Add(time.Second))
	decide(t, s, day("warm", 1))
	var calls [][]backend.Request
	for _, alg := range []backend.Algorithm{backend.GCRA, backend.RollingWindow, backend.SlidingLog} {
		for i := range 3 {
			calls = append(calls, []backend.Request{{Key: fmt.Sprintf("%v-%d", alg, i), Algorithm: alg, Limit: 1, Period: time.Hour, Cost: 1}})
		}
	}
	batch := func(at time.Time) [][]backend.Result {
		t.Helper()
		mr.SetTime(at)
		results, errs := queueBehindHeldLane(t, s, proxy, trips, calls)()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		if got := trips.get(); got[len(got)-1] != 1 {
			t.Fatalf("scripts per round trip = %v, want the %d queued decisions in one", got, len(calls))
		}
		return results
	}
	// The rolling window's hour is 16 buckets of 225 s, aligned on the
	// server's clock: a unit of 10:00:01 is in the bucket of 10:00:00 and
	// counts until 17 buckets later, 11:03:45.
	rollingUntil := server.Add(17 * 225 * time.Second)
	wants := func(at time.Time) map[backend.Algorithm]backend.Result {
		return map[backend.Algorithm]backend.Result{
			backend.GCRA:          {Limit: 1, ResetAfter: server.Add(time.Hour + time.Second).Sub(at), RetryAfter: server.Add(time.Hour + time.Second).Sub(at), NextAfter: server.Add(time.Hour + time.Second).Sub(at)},
			backend.RollingWindow: {Limit: 1, ResetAfter: rollingUntil.Sub(at), RetryAfter: rollingUntil.Sub(at), NextAfter: rollingUntil.Sub(at)},
			backend.SlidingLog:    {Limit: 1, ResetAfter: server.Add(time.Hour + time.Second).Sub(at), RetryAfter: server.Add(time.Hour + time.Second).Sub(at), NextAfter: server.Add(time.Hour + time.Second).Sub(at)},
		}
	}

	first := wants(server.Add(time.Second))
	for i, res := range batch(server.Add(time.Second)) {
		alg := calls[i][0].Algorithm
		if !res[0].Allowed || res[0].ResetAfter != first[alg].ResetAfter {
			t.Errorf("%v at 10:00:01 server time: %+v, want admitted, full again in %v", alg, res[0], first[alg].ResetAfter)
		}
	}
	at := server.Add(30 * time.Minute)
	half := wants(at)
	for i, res := range batch(at) {
		if want := half[calls[i][0].Algorithm]; res[0] != want {
			t.Errorf("%v at 10:30 server time:\n got %+v\nwant %+v", calls[i][0].Algorithm, res[0], want)
		}
	}
	// More than an hour of server time passes in no time on this
	// process's clock.
	for i, res := range batch(rollingUntil) {
		if !res[0].Allowed {
			t.Errorf("%v at 11:03:45 server time: %+v, want admitted", calls[i][0].Algorithm, res[0])
		}
	}
}

package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestRetriesMakeALostReplyInvisible drops the reply of a decision, then of
// a refund, after Redis ran the script, on a Store with WithRetries: the
// store sends each again, the script finds its request id recorded and
// answers what it answered the first time, and each took effect once:
// units stored = units admitted.
func TestRetriesMakeALostReplyInvisible(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	s := New(defaultClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0), WithRetries(2))
	decide(t, s, day("warm", 1))

	proxy.DropReply("evalsha")
	res := decide(t, s, day("d", 1))
	if !res[0].Allowed || res[0].Remaining != backend.MaxLimit-1 {
		t.Errorf("decision whose first reply was lost: %+v, want admitted with %d remaining (decided once)", res[0], int64(backend.MaxLimit-1))
	}
	if got, want := stored(t, s, "d"), int64(1); got != want {
		t.Errorf("units stored = %d, want %d (admitted)", got, want)
	}

	decide(t, s, day("r", 10))
	proxy.DropReply("evalsha")
	decide(t, s, day("r", -4))
	if got, want := stored(t, s, "r"), int64(6); got != want {
		t.Errorf("units stored after 10 admitted and a refund of 4 whose first reply was lost = %d, want %d", got, want)
	}
	if got, want := proxy.Dropped(), 2; got != want {
		t.Fatalf("proxy dropped %d replies, want %d", got, want)
	}
}

// TestRetriesKeepAStormExact is TestClientKillStormNeverCountsTwice with
// WithRetries: decisions whose reply a kill lost are sent again and
// answered from their record, so units stored = units admitted whenever no
// decision failed outright, and at most the failed ones more otherwise.
func TestRetriesKeepAStormExact(t *testing.T) {
	srv := redistest.Shared(t)
	s := New(defaultClient(t, srv.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0), WithRetries(3))
	admitted, failed, kills := killStorm(t, srv, s, time.Second)
	got := stored(t, s, "k")
	t.Logf("%d kills: %d admitted, %d failed, %d units stored", kills, admitted, failed, got)
	if got < admitted || got > admitted+failed {
		t.Errorf("units stored %d, admitted %d, failed %d: want admitted ≤ stored ≤ admitted + failed", got, admitted, failed)
	}
	if failed == 0 && got != admitted {
		t.Errorf("units stored %d ≠ admitted %d with no decision failed", got, admitted)
	}
}

// TestRetriesKeepEveryAnswer runs decisions of one and of several rules,
// across Cluster slots with their refunds, through recorded scripts: the
// request id's key shares each script's slot and the answers are the
// plain scripts' answers.
func TestRetriesKeepEveryAnswer(t *testing.T) {
	for _, tg := range targets[1:] { // miniredis has no cmsgpack
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			prefix := redistest.KeyPrefix(t)
			plain := New(client, WithPrefix(prefix+"p"), WithDenyCache(0))
			recorded := New(client, WithPrefix(prefix+"r"), WithDenyCache(0), WithRetries(1))
			steps := [][]backend.Request{
				{{Key: "gcra", Algorithm: backend.GCRA, Limit: 2, Period: time.Hour, Cost: 1}},
				threeRules("u"),
				threeRules("u"),
				{fixed("day:a", 1, 1)},
				{fixed("minute:a", 5, 1), fixed("day:a", 1, 1)}, // rejected across slots: refunded
				{fixed("minute:a", 5, 0)},
			}
			for i, reqs := range steps {
				want := decide(t, plain, reqs...)
				got := decide(t, recorded, reqs...)
				for j := range want {
					if got[j].Allowed != want[j].Allowed || got[j].Remaining != want[j].Remaining {
						t.Errorf("step %d request %d: %+v, want %+v", i, j, got[j], want[j])
					}
				}
			}
		})
	}
}

// killStorm decides on key "k" through s from 16 goroutines while every
// client connection to srv is killed every 10ms for d, and returns the
// decisions admitted and failed, and the connections killed.
func killStorm(t *testing.T, srv *redistest.Instance, s *Store, d time.Duration) (admitted, failed, kills int64) {
	t.Helper()
	ctx := context.Background()
	decide(t, s, day("warm", 1))
	admin := srv.Client(t)
	stop := make(chan struct{})
	var nAdmitted, nFailed, nKills atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		every(10*time.Millisecond, stop, func() bool {
			n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal").Result()
			if err != nil {
				t.Errorf("CLIENT KILL: %v", err)
				return false
			}
			nKills.Add(n)
			return true
		})
	})
	deadline := time.Now().Add(d)
	for range 16 {
		wg.Go(func() {
			reqs := []backend.Request{day("k", 1)}
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				res, err := s.Decide(ctx, reqs)
				cancel()
				switch {
				case err != nil:
					nFailed.Add(1)
				case res[0].Allowed:
					nAdmitted.Add(1)
				default:
					t.Errorf("a decision under a limit of %d was rejected", int64(backend.MaxLimit))
					return
				}
			}
		})
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	if nKills.Load() == 0 {
		t.Fatal("the storm killed no connection")
	}
	return nAdmitted.Load(), nFailed.Load(), nKills.Load()
}

// every calls f every d until stop is closed or f returns false.
func every(d time.Duration, stop <-chan struct{}, f func() bool) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			if !f() {
				return
			}
		}
	}
}

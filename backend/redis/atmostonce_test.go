package redis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// day is a fixed window of a day with room for every test: its stored
// count is exactly the units taken, so stored units can be compared with
// admitted ones.
func day(key string, cost int64) backend.Request {
	return backend.Request{Key: key, Algorithm: backend.FixedWindow, Limit: backend.MaxLimit, Period: 24 * time.Hour, Cost: cost}
}

// stored is how many units a day key holds, read by a peek through s.
func stored(t *testing.T, s *Store, key string) int64 {
	t.Helper()
	return backend.MaxLimit - decide(t, s, day(key, 0))[0].Remaining
}

// defaultClient is a client with go-redis's default options, as users
// build it: MaxRetries 3, which re-sends a command whose reply was lost.
func defaultClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLostReplyIsNotAppliedTwice drops the reply of a decision, then of a
// refund, after Redis ran the script: each took effect once (go-redis, left
// to itself, would send it again on a new connection and apply it twice),
// and the call reports an error instead of a guess.
func TestLostReplyIsNotAppliedTwice(t *testing.T) {
	srv := redistest.Shared(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s := New(defaultClient(t, proxy.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	ctx := context.Background()
	decide(t, s, day("warm", 1)) // loads the script, so the next EVALSHA runs it

	t.Run("decision", func(t *testing.T) {
		proxy.DropReply("fcall")
		if _, err := s.Decide(ctx, []backend.Request{day("d", 1)}); err == nil {
			t.Error("Decide answered although its reply was lost")
		} else if !errors.Is(err, backend.ErrUnreachable) {
			t.Errorf("lost reply: err = %v, want it to wrap backend.ErrUnreachable", err)
		}
		if got, want := stored(t, s, "d"), int64(1); got != want {
			t.Errorf("units stored after one decision whose reply was lost = %d, want %d (ran once)", got, want)
		}
	})
	t.Run("refund", func(t *testing.T) {
		decide(t, s, day("r", 10))
		proxy.DropReply("fcall")
		if _, err := s.Decide(ctx, []backend.Request{day("r", -4)}); err == nil {
			t.Error("refund answered although its reply was lost")
		}
		if got, want := stored(t, s, "r"), int64(6); got != want {
			t.Errorf("units stored after 10 admitted and a refund of 4 whose reply was lost = %d, want %d (refunded once)", got, want)
		}
	})
	if got, want := proxy.Dropped(), 2; got != want {
		t.Fatalf("proxy dropped %d replies, want %d", got, want)
	}
}

// TestClientKillStormNeverCountsTwice decides from 16 goroutines on one key
// while every client connection is killed every 10ms for 5s (CLIENT KILL
// TYPE normal). Every decision is admitted, or fails with an error; a
// failed one may or may not have taken its unit, but none takes two: the
// units Redis stored are at least the admitted ones and at most those plus
// the failed ones. go-redis's own retries break the upper bound.
func TestClientKillStormNeverCountsTwice(t *testing.T) {
	srv := redistest.Shared(t)
	s := New(defaultClient(t, srv.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	storm := 5 * time.Second
	if testing.Short() {
		storm = time.Second
	}
	admitted, failed, kills := killStorm(t, srv, s, storm)
	got := stored(t, s, "k")
	t.Logf("%d kills: %d admitted, %d failed, %d units stored", kills, admitted, failed, got)
	if failed == 0 {
		t.Fatalf("the storm killed %d connections and failed no decision: it did not hit the decisions", kills)
	}
	if got < admitted {
		t.Errorf("units stored %d < admitted %d: an admission was not counted", got, admitted)
	}
	if max := admitted + failed; got > max {
		t.Errorf("units stored %d > admitted + failed = %d: some decision took effect twice", got, max)
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

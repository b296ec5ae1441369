package redis

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/ceiling-go/ceiling/backend"
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

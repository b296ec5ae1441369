package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestDenyCacheAbsorbsAFlood: once a key is rejected, 10,000 more requests
// from it cost Redis nothing until its RetryAfter has passed.
func TestDenyCacheAbsorbsAFlood(t *testing.T) {
	for _, tg := range targets[:2] {
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			count := countCommands(client)
			s := New(client, WithPrefix(redistest.KeyPrefix(t)))
			r := backend.Request{Key: "otp:victim", Algorithm: backend.SlidingLog, Limit: 3, Period: 15 * time.Minute, Cost: 1}
			for range 4 {
				decide(t, s, r)
			}
			before := count.n.Load()
			for i := range 10_000 {
				if res := decide(t, s, r); res[0].Allowed {
					t.Fatalf("flood request %d admitted", i)
				}
			}
			if got := count.n.Load() - before; got != 0 {
				t.Errorf("10,000 requests from a rejected key sent %d commands to Redis, want 0", got)
			}
			scripts := 0
			for _, name := range count.sent() {
				if name == "fcall" || name == "evalsha" || name == "eval" {
					scripts++
				}
			}
			// Four decisions reach Redis, one more EVAL if the library was
			// not loaded yet; connection set-up commands are not decisions.
			if scripts > 5 {
				t.Errorf("10,004 decisions ran %d scripts (%v), want at most 5", scripts, count.sent())
			}
		})
	}
}

// TestDenyCacheSteps walks a denied key through the fake clock: local
// answers count down, and Redis decides again once RetryAfter has passed,
// or at once after a refund or a reset through the Store.
func TestDenyCacheSteps(t *testing.T) {
	client := targets[0].client(t)
	count := countCommands(client)
	clock := newFakeClock()
	s := New(client, WithClock(clock.Now))
	r := backend.Request{Key: "day:u", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: 1}
	other := backend.Request{Key: "ip:u", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 1}
	decide(t, s, r)
	if res := decide(t, s, r); res[0].Allowed || res[0].RetryAfter != time.Second {
		t.Fatalf("second request: %+v, want rejected for 1s", res[0])
	}

	type check struct {
		name     string
		at       time.Duration
		reqs     []backend.Request
		commands int64
		allowed  []bool
		retry    time.Duration // of the first result
	}
	refund := r
	refund.Cost = -1
	costTwo := r
	costTwo.Cost = 2
	shadow := r
	shadow.Shadow = true
	steps := []check{
		{"denied, answered locally", 0, []backend.Request{r}, 0, []bool{false}, time.Second},
		{"the rest of the call is not read", 400 * time.Millisecond, []backend.Request{r, other}, 0, []bool{false, true}, 600 * time.Millisecond},
		{"another cost asks Redis", 400 * time.Millisecond, []backend.Request{costTwo}, 1, []bool{false}, backend.Never},
		{"a shadow request asks Redis", 400 * time.Millisecond, []backend.Request{shadow}, 1, []bool{false}, 600 * time.Millisecond},
		{"1µs before RetryAfter", time.Second - time.Microsecond, []backend.Request{r}, 0, []bool{false}, time.Microsecond},
		{"at RetryAfter Redis admits", time.Second, []backend.Request{r}, 1, []bool{true}, 0},
		{"rejected again", time.Second, []backend.Request{r}, 1, []bool{false}, time.Second},
		{"a refund forgets the key", time.Second, []backend.Request{refund}, 1, []bool{true}, 0},
		{"so Redis admits", time.Second, []backend.Request{r}, 1, []bool{true}, 0},
	}
	t0 := clock.Now()
	for _, st := range steps {
		clock.mu.Lock()
		clock.now = t0.Add(st.at)
		clock.mu.Unlock()
		count.reset()
		res := decide(t, s, st.reqs...)
		if got := count.n.Load(); got != st.commands {
			t.Errorf("%s: %d commands, want %d", st.name, got, st.commands)
		}
		for i, want := range st.allowed {
			if res[i].Allowed != want {
				t.Errorf("%s: result %d allowed = %v, want %v", st.name, i, res[i].Allowed, want)
			}
		}
		if res[0].RetryAfter != st.retry {
			t.Errorf("%s: RetryAfter %v, want %v", st.name, res[0].RetryAfter, st.retry)
		}
		for i := range st.reqs {
			// Only an answer that cost no command is the cache's own.
			if got, want := res[i].Cached, st.commands == 0; got != want {
				t.Errorf("%s: result %d Cached = %v, want %v", st.name, i, got, want)
			}
		}
		if len(st.reqs) == 2 && st.commands == 0 {
			if got, want := res[1], (backend.Result{Allowed: true, Limit: 10, Unread: true, Cached: true}); got != want {
				t.Errorf("%s: unread rule reports %+v, want %+v", st.name, got, want)
			}
		}
	}

	decide(t, s, r) // rejected again, remembered
	if err := s.Reset(t.Context(), r.Key); err != nil {
		t.Fatal(err)
	}
	count.reset()
	if res := decide(t, s, r); !res[0].Allowed || count.n.Load() != 1 {
		t.Errorf("after Reset: %+v with %d commands, want admitted by Redis", res[0], count.n.Load())
	}
}

func TestDenyCacheIsBounded(t *testing.T) {
	s := New(targets[0].client(t), WithDenyCache(2))
	for _, user := range []string{"a", "b", "c", "d", "e"} {
		r := backend.Request{Key: "k:" + user, Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 2}
		if res := decide(t, s, r); res[0].Allowed {
			t.Fatal("cost 2 of limit 1 admitted")
		}
	}
	// Never (cost over the limit) is not remembered; reject for real.
	for _, user := range []string{"a", "b", "c", "d", "e"} {
		r := backend.Request{Key: "k:" + user, Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
		decide(t, s, r)
		decide(t, s, r)
	}
	s.deny.mu.Lock()
	n := len(s.deny.entries)
	s.deny.mu.Unlock()
	if n != 2 {
		t.Errorf("deny cache holds %d keys, want its bound 2", n)
	}
}

func TestDenyCacheOff(t *testing.T) {
	client := targets[0].client(t)
	count := countCommands(client)
	s := New(client, WithDenyCache(0))
	r := backend.Request{Key: "k", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	decide(t, s, r)
	count.reset()
	for range 100 {
		decide(t, s, r)
	}
	if got, want := count.n.Load(), int64(100); got != want {
		t.Errorf("100 rejected requests without a deny cache sent %d commands, want %d", got, want)
	}
}

var _ redis.Hook = (*commandCounter)(nil)

// TestDenyCacheNeverAnswersASentDecision: a decision that Redis applied
// but whose reply is lost (held, then dropped by the proxy) fails, and
// meanwhile another decision on its key is rejected, which the cache would
// learn. The failed decision's caller, which asks the cache next as the
// limiter does before its fail mode, must not get that rejection: its own
// decision took the unit the rejection saw taken. Nor may a rejection
// learned just after the failure answer it. Once the doubt is over, the
// cache answers the key again from the rejection it kept.
func TestDenyCacheNeverAnswersASentDecision(t *testing.T) {
	srv := redistest.Shared(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	prefix := redistest.KeyPrefix(t)
	clock := newFakeClock()
	s := New(defaultClient(t, proxy.Addr), WithPrefix(prefix), WithClock(clock.Now))
	direct := New(defaultClient(t, srv.Addr), WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
	one := backend.Request{Key: "k", Algorithm: backend.FixedWindow, Limit: 1, Period: 24 * time.Hour, Cost: 1}
	decide(t, s, backend.Request{Key: "warm", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1})

	lose := proxy.LoseReplyLate("fcall")
	defer lose()
	sent := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := s.Decide(ctx, []backend.Request{one})
		sent <- err
	}()
	peek := one
	peek.Cost = 0
	waitFor(t, "the lost decision applied", func() bool { return decide(t, direct, peek)[0].Remaining == 0 })
	if res := decide(t, s, one); res[0].Allowed || res[0].Cached {
		t.Fatalf("a decision after the unit was taken: %+v, want rejected by Redis", res[0])
	}
	lose()
	if err := <-sent; err == nil {
		t.Fatal("the decision whose reply was lost answered")
	}
	out := make([]backend.Result, 1)
	if s.DecideCached([]backend.Request{one}, out) {
		t.Errorf("the caller of a decision Redis applied got a cached rejection learned while it was out: %+v", out[0])
	}
	if res := decide(t, s, one); res[0].Allowed || res[0].Cached {
		t.Fatalf("a decision after the failure: %+v, want rejected by Redis", res[0])
	}
	if s.DecideCached([]backend.Request{one}, out) {
		t.Errorf("the caller of a decision Redis applied got a cached rejection learned just after it failed: %+v", out[0])
	}
	clock.Advance(doubtFor)
	if !s.DecideCached([]backend.Request{one}, out) || out[0].Allowed {
		t.Errorf("once the doubt is over, the cache does not answer the spent key: %v %+v", out[0].Cached, out[0])
	}
}

// TestDenyCacheForgetsAKeyAnsweredAtAnEarlierClock_Regression: a peek at a
// clock 2.2 hours behind a remembered rejection anchors the key's state at
// that clock, which brings the rejection's end 2.2 hours nearer; the cache
// forgets it rather than answering the next request with the old end
// (seed 10570530580855651193 of the cluster+deny differential, shrunk).
func TestDenyCacheForgetsAKeyAnsweredAtAnEarlierClock_Regression(t *testing.T) {
	const period = 7775999999999 * time.Microsecond
	clusterDenyDifferential(t).Replay(t, []backendtest.Step{
		{At: 7637916000001 * time.Microsecond, Decide: []backend.Request{
			{Key: "{x}b", Algorithm: backend.SlidingLog, Limit: 1, Period: period, Cost: 1, Once: 515172056250},
		}},
		{At: 7637917500002 * time.Microsecond, Decide: []backend.Request{
			{Key: "{x}b", Algorithm: backend.SlidingLog, Limit: 5, Period: period, Cost: 5, Once: 515172056250},
		}},
		{At: 7629991787870 * time.Microsecond, Decide: []backend.Request{
			{Key: "{x}b", Algorithm: backend.SlidingLog, Limit: 1, Period: period, Cost: 0},
		}},
		{At: 10837076933561 * time.Microsecond, Decide: []backend.Request{
			{Key: "{x}b", Algorithm: backend.SlidingLog, Limit: 5, Period: period, Cost: 5, Once: 443668623247},
		}},
	})
}

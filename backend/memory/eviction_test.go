package memory

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestVictimSurvivesAFreshKeyFlood: a key that spent its whole limit keeps
// it through a flood of fresh keys half again as many as the key bound,
// each of which spent one unit (the 1.5M fresh phone numbers
// against a million keys, at a 16Ki bound). Evicting a flood key gives its
// (attacker) caller a unit back: each is counted, and the burst is logged
// once.
func TestVictimSurvivesAFreshKeyFlood(t *testing.T) {
	const maxKeys = 1 << 14
	const flood = maxKeys * 3 / 2
	for _, alg := range backend.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			var log bytes.Buffer
			s, clock := newTestStore(t, WithMaxKeys(maxKeys), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
			otp := backend.Request{Key: "otp:to:victim", Algorithm: alg, Limit: 3, Period: 15 * time.Minute, Cost: 1}
			for range 3 {
				decide(t, s, otp)
			}
			if decide(t, s, otp)[0].Allowed {
				t.Fatal("a fourth OTP admitted")
			}
			res := make([]backend.Result, 1)
			r := []backend.Request{otp}
			for i := range flood {
				if i%1000 == 0 {
					clock.t = clock.t.Add(time.Millisecond) // a flood lasting a minute and a half
				}
				r[0].Key = "otp:to:" + fmt.Sprint(i)
				if err := s.DecideInto(ctx, r, res); err != nil {
					t.Fatal(err)
				}
			}
			if res := decide(t, s, otp)[0]; res.Allowed || res.Remaining != 0 {
				t.Fatalf("victim after the flood: %+v, want still rejected with 0 remaining", res)
			}
			if got, min := s.Evictions(), uint64(flood-maxKeys-len(s.shards)); got < min {
				t.Errorf("Evictions = %d, want at least %d: every flood key evicted held a unit", got, min)
			}
			if got := strings.Count(log.String(), "evicting them gives their callers quota back"); got != 1 {
				t.Errorf("the flood was logged %d times, want once:\n%s", got, log.String())
			}
			// A minute without evictions ends the burst: the next is logged.
			clock.t = clock.t.Add(2 * time.Minute)
			for i := range 2 * len(s.shards) {
				r[0].Key = "otp:to:late:" + fmt.Sprint(i)
				if err := s.DecideInto(ctx, r, res); err != nil {
					t.Fatal(err)
				}
			}
			if got := strings.Count(log.String(), "evicting them gives their callers quota back"); got != 2 {
				t.Errorf("a second burst was logged %d times in all, want 2", got)
			}
		})
	}
}

// TestEvictionRanksRollingTiersTogether: rolling windows of different
// limits live in tables of different count widths; a full shard compares
// the keys of every table, so a flood of fresh keys under a limit of 1000
// (16-bit counts), one unit each, evicts its own kind and not the one key
// under a limit of 3 (8-bit counts) that spent its limit.
func TestEvictionRanksRollingTiersTogether(t *testing.T) {
	s, _ := newTestStore(t, WithMaxKeys(64), WithLogger(slog.New(slog.DiscardHandler)))
	victim := backend.Request{Key: "otp:to:victim", Limit: 3, Period: 15 * time.Minute, Cost: 3}
	if !decide(t, s, victim)[0].Allowed {
		t.Fatal("3 of 3 rejected")
	}
	for i := range 500 {
		decide(t, s, backend.Request{Key: fmt.Sprint("api:", i), Limit: 1000, Period: 15 * time.Minute, Cost: 1})
	}
	victim.Cost = 1
	if res := decide(t, s, victim)[0]; res.Allowed {
		t.Fatalf("the victim's fourth unit admitted after the flood: %+v", res)
	}
}

// TestMaxKeysUnderAFlood is the million-attacker simulation, scaled down:
// 20 000 fresh keys against a bound of 1 000. The store stays bounded and
// counts every live key it had to forget.
func TestMaxKeysUnderAFlood(t *testing.T) {
	const bound, attackers = 1000, 20_000
	s, _ := newTestStore(t, WithMaxKeys(bound))
	res := make([]backend.Result, 1)
	for i := range attackers {
		r := []backend.Request{{Key: fmt.Sprintf("ip:%d", i), Algorithm: backend.GCRA, Limit: 5, Period: time.Minute, Cost: 1}}
		if err := s.DecideInto(ctx, r, res); err != nil {
			t.Fatal(err)
		}
		if !res[0].Allowed {
			t.Fatalf("attacker %d rejected: a fresh key has its full quota", i)
		}
	}
	if got, max := s.Len(), bound+len(s.shards); got > max {
		t.Errorf("Len = %d, want at most %d", got, max)
	}
	if got, min := s.Evictions(), uint64(attackers-bound-len(s.shards)); got < min {
		t.Errorf("Evictions = %d, want at least %d", got, min)
	}
}

// TestMaxKeysEvictsExpiredFirst: keys already back to full make room for
// new ones without counting as a weakening.
func TestMaxKeysEvictsExpiredFirst(t *testing.T) {
	s, clock := newTestStore(t, WithMaxKeys(64))
	fill := func(prefix string) {
		for i := range 64 {
			decide(t, s, backend.Request{Key: fmt.Sprintf("%s:%d", prefix, i), Algorithm: backend.FixedWindow, Limit: 5, Period: time.Second, Cost: 1})
		}
	}
	fill("old")
	clock.t = clock.t.Add(time.Second) // every old window has ended
	fill("new")
	if got := s.Evictions(); got != 0 {
		t.Errorf("Evictions = %d, want 0: only expired state was replaced", got)
	}
	if got := s.Len(); got != 64 {
		t.Errorf("Len = %d, want 64", got)
	}
}

// TestMaxKeysEvictsClosestToFull: with every key live, the one whose state
// is soonest back to full is the one forgotten (here the shard is small
// enough for the sample to see all of it).
func TestMaxKeysEvictsClosestToFull(t *testing.T) {
	s, _ := newTestStore(t, WithMaxKeys(8))
	r := backend.Request{Algorithm: backend.GCRA, Limit: 10, Period: time.Second, Cost: 5}
	for i := range 8 {
		r.Key = fmt.Sprintf("heavy:%d", i)
		if i == 3 {
			r.Key, r.Cost = "light", 1
		}
		decide(t, s, r)
		r.Cost = 5
	}
	r.Key, r.Cost = "newcomer", 1
	decide(t, s, r)
	if got := s.Evictions(); got != 1 {
		t.Fatalf("Evictions = %d, want 1", got)
	}
	r.Key, r.Cost = "light", 0
	if got := decide(t, s, r)[0].Remaining; got != 10 {
		t.Errorf("light key remaining = %d, want 10 (it was the one evicted)", got)
	}
	r.Key = "heavy:0"
	if got := decide(t, s, r)[0].Remaining; got != 5 {
		t.Errorf("heavy key remaining = %d, want 5 (kept)", got)
	}
}

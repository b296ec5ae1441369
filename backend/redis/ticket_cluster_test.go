package redis

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestClusterUndoneReservationDropsItsTicket: a reservation whose call
// another slot rejects is undone with its state, and its ticket must go
// with it: left behind, a refund with its Once would give back the units
// of the admission that took them since. The model's refund finds no
// ticket and gives nothing back.
func TestClusterUndoneReservationDropsItsTicket(t *testing.T) {
	a := backend.Request{Key: "{x}a", Algorithm: backend.FixedWindow, Limit: 2, Period: time.Hour, Cost: 1, Once: 8}
	other := a
	other.Once = 0
	refund := a
	refund.Cost = -1
	clusterDifferential(t).Replay(t, []backendtest.Step{
		{At: time.Second, Decide: []backend.Request{a, rejects}},
		{At: time.Second, Decide: []backend.Request{other}},
		{At: 2 * time.Second, Decide: []backend.Request{refund}},
		{At: 2 * time.Second, Decide: []backend.Request{other}},
		{At: 2 * time.Second, Decide: []backend.Request{other}},
	})
}

// TestClusterUndoneRefundGetsItsTicketBack: a settlement call is never
// rejected (a refund and a release always fit), but it fails when one of
// its slots' scripts does, and the slots that ran are then undone. A
// refund put back so must get its reservation's ticket back, or its
// resend finds none and gives nothing back: the reservation would stand
// at its estimate for good. Here the release's slot holds a string where
// a lease set belongs, so its script fails.
func TestClusterUndoneRefundGetsItsTicketBack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	s := New(client, WithPrefix(prefix), WithDenyCache(0))
	ctx := context.Background()
	reserve := backend.Request{Key: "{x}a", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 5, Once: 31}
	got, err := s.Decide(ctx, []backend.Request{reserve})
	if err != nil || !got[0].Allowed || got[0].Stamp == 0 {
		t.Fatalf("the reservation: %+v, %v", got, err)
	}
	refund := reserve
	refund.Cost, refund.Stamp = -5, got[0].Stamp
	release := backend.Request{Key: "{y}b", Algorithm: backend.Concurrency, Limit: 1, Period: time.Minute, Cost: -1, Lease: 1}
	if err := client.Set(ctx, prefix+":{y}b", "not a lease set", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, []backend.Request{refund, release}); err == nil {
		t.Fatal("a call whose release slot fails: no error")
	}
	ticket := onceKeyOf(prefix+":{x}a", 31)
	if n, err := client.Exists(ctx, ticket).Result(); err != nil || n != 1 {
		t.Fatalf("after the undone refund: %d tickets (%v), want its reservation's back", n, err)
	}
	peek := reserve
	peek.Cost, peek.Once = 0, 0
	if got, err := s.Decide(ctx, []backend.Request{peek}); err != nil || got[0].Remaining != 5 {
		t.Fatalf("after the undone refund: %+v, %v; want 5 left (the refund put back)", got, err)
	}
	if got, err := s.Decide(ctx, []backend.Request{refund}); err != nil || got[0].Remaining != 10 {
		t.Errorf("the refund resent: %+v, %v; want applied, 10 left", got, err)
	}
	if n, err := client.Exists(ctx, ticket).Result(); err != nil || n != 0 {
		t.Errorf("after the resent refund: %d tickets (%v), want none", n, err)
	}
}

// TestClusterInvertedResendKeepsTheStandingTicket: a reservation resent
// with its Once in a cross-slot call that is rejected elsewhere, on a key
// another client wrote meanwhile, is undone by a refund of the resend's
// units. That refund must not consume the ticket, which stood before the
// call: the first reservation's own refund would then give nothing back.
func TestClusterInvertedResendKeepsTheStandingTicket(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 1, Once: 44}
	first := decide(t, s, reserve)[0]
	one := reserve
	one.Once = 0
	undoneAfterAnotherWrite(t, s, []backend.Request{reserve}, one) // another client meanwhile: the key cannot be put back
	refund := reserve
	refund.Cost, refund.Stamp = -1, first.Stamp
	if res := decide(t, s, refund)[0]; res.Remaining != 9 {
		t.Errorf("the first reservation's refund after the undo: %+v, want 9 remaining (only the other client's unit taken)", res)
	}
}

// undoneAfterAnotherWrite runs reqs on their slot beside a request on
// another, as one cross-slot call, has another client decide meanwhile
// (so that reqs' key cannot be put back byte for byte, only inverted),
// and undoes the call as if the other slot had rejected it.
func undoneAfterAnotherWrite(t *testing.T, s *Store, reqs []backend.Request, meanwhile backend.Request) {
	t.Helper()
	undoneWith(t, s, reqs, meanwhile, nil)
}

// undoneWith is undoneAfterAnotherWrite with between run after the call's
// groups and before the undo (nil: nothing), and meanwhile decided only
// when its Key is set (otherwise the key is put back).
func undoneWith(t *testing.T, s *Store, reqs []backend.Request, meanwhile backend.Request, between func()) {
	t.Helper()
	ctx := context.Background()
	other := backend.Request{Key: "{b}o", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Second, Cost: 1}
	own := make([]string, len(reqs))
	for i, r := range reqs {
		own[i] = s.prefix + r.Key
	}
	keys := [][]string{own, {s.prefix + other.Key}}
	sub := [][]backend.Request{reqs, {other}}
	replies, errs := s.runGroups(ctx, keys, sub, true, false)
	if errs[0] != nil || errs[1] != nil || slices.ContainsFunc(replies[0].results, func(r backend.Result) bool { return !r.Allowed }) {
		t.Fatalf("the call's groups: %v, %v, %+v", errs[0], errs[1], replies[0].results)
	}
	if meanwhile.Key != "" {
		decide(t, s, meanwhile)
	}
	if between != nil {
		between()
	}
	replies[1].rejected = true
	s.refund(ctx, keys, sub, replies, errs)
}

// remainingOf peeks r's key (Cost 0, no Once) and returns its remaining
// units.
func remainingOf(t *testing.T, s *Store, r backend.Request) int64 {
	t.Helper()
	r.Cost, r.Once, r.Force, r.Stamp = 0, 0, false, 0
	return decide(t, s, r)[0].Remaining
}

// onceEntry is the stored once entry of r's (Key, Once), "" when absent.
func onceEntry(t *testing.T, s *Store, r backend.Request) string {
	t.Helper()
	v, _ := s.client.Get(context.Background(), onceKeyOf(s.prefix+r.Key, r.Once)).Result()
	return v
}

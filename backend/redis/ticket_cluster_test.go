package redis

import (
	"context"
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

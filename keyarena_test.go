package ceiling_test

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// On the memory store a stored key is built in the pooled per-request state
// without an allocation, and that state serves the next decisions: a
// concurrency slot held past its decision must keep its own key, so that
// Release gives back this slot and not the one of whichever key reused
// the state (keys of equal length, so a shared buffer would alias exactly).
func TestHeldSlotKeepsItsKeyWhileTheStateIsReused(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "exports", Limit: 1, Period: time.Minute, Algorithm: ceiling.Concurrency}})
	defer l.Close()
	ctx := context.Background()
	decide := func(key string) ceiling.Decision {
		t.Helper()
		d, err := l.Decide(ctx, ceiling.Input{Rule: "exports", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := decide("tenant-a")
	if !a.Allowed {
		t.Fatal("tenant-a's first export was refused")
	}
	if d := decide("tenant-a"); d.Allowed {
		t.Fatal("tenant-a's second export was admitted while its first holds the only slot")
	}
	for i := range 100 {
		b := decide("tenant-b")
		if !b.Allowed {
			t.Fatalf("tenant-b's export %d was refused: its slot was not given back", i)
		}
		b.Release()
	}
	a.Release()
	if d := decide("tenant-a"); !d.Allowed {
		t.Fatal("tenant-a's slot was not given back by Release: the held key changed under it")
	} else {
		d.Release()
	}
}

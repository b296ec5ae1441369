package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"
)

// slotsInUse is the health report's SlotsInUse of each rule, by name.
func slotsInUse(l *Limiter) map[string]int64 {
	m := map[string]int64{}
	for _, r := range l.Health().Rules {
		m[r.Name] = r.SlotsInUse
	}
	return m
}

// The health report counts the units of a concurrency rule's limit that
// the process holds: taken by admitted decisions, given back by their
// release (once, however often it is called) or, for a Decision dropped
// without one, by the garbage collector. A refused decision holds
// nothing, and a rate rule has no slots.
func TestHealthCountsTheSlotsInUse(t *testing.T) {
	l := MustNew([]Rule{
		{Name: "jobs", Limit: 5, Period: time.Minute, Algorithm: Concurrency},
		{Name: "calls", Limit: 100, Period: time.Minute},
	}, WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	ctx := context.Background()
	in := Input{Rule: "jobs", Key: "tenant-1"}
	var ds []Decision
	for range 3 {
		d, err := l.Decide(ctx, in)
		if err != nil || !d.Allowed {
			t.Fatalf("an acquisition under the limit: allowed %v (%v)", d.Allowed, err)
		}
		ds = append(ds, d)
	}
	if d, _ := l.Decide(ctx, Input{Rule: "calls", Key: "tenant-1"}); !d.Allowed {
		t.Fatal("the rate rule refused")
	}
	if got := slotsInUse(l); got["jobs"] != 3 || got["calls"] != 0 {
		t.Fatalf("after 3 acquisitions: slots in use %v, want jobs 3, calls 0", got)
	}
	if d, _ := l.Decide(ctx, Input{Rule: "jobs", Key: "tenant-1", Cost: 3}); d.Allowed {
		t.Fatal("3 more units over a limit of 5 were admitted")
	}
	if got := slotsInUse(l)["jobs"]; got != 3 {
		t.Fatalf("after a refusal: slots in use %d, want 3", got)
	}
	big, _ := l.Decide(ctx, Input{Rule: "jobs", Key: "tenant-2", Cost: 2})
	if got := slotsInUse(l)["jobs"]; !big.Allowed || got != 5 {
		t.Fatalf("after 2 units more: allowed %v, slots in use %d, want 5", big.Allowed, got)
	}
	big.Release()
	for _, d := range ds {
		d.Release()
		d.Release() // idempotent: counted off once
	}
	if got := slotsInUse(l)["jobs"]; got != 0 {
		t.Fatalf("after every release: slots in use %d, want 0", got)
	}

	// A Decision dropped without Release: its slot stops counting when the
	// garbage collector releases it.
	func() {
		d, _ := l.Decide(ctx, in)
		if !d.Allowed {
			t.Fatal("refused")
		}
	}()
	if got := slotsInUse(l)["jobs"]; got != 1 {
		t.Fatalf("a dropped Decision not yet collected: slots in use %d, want 1", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for slotsInUse(l)["jobs"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a dropped Decision's slot is counted forever")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // the cleanup runs on its own goroutine
	}
}

// Slots FailLocal took on the in-process store while the backend was down
// are in use too, until released.
func TestHealthCountsFailLocalSlots(t *testing.T) {
	l := MustNew([]Rule{{Name: "inflight", Limit: 2, Period: time.Minute, Algorithm: Concurrency}},
		WithBackend(&flaky{err: errors.New("down")}), WithFailMode(FailLocal), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	d, err := l.Decide(context.Background(), Input{Rule: "inflight", Key: "acme"})
	if err != nil || !d.Allowed || d.Results[0].Fallback != FailLocal {
		t.Fatalf("with the backend down: allowed %v, fallback %v (%v), want admitted by FailLocal", d.Allowed, d.Results[0].Fallback, err)
	}
	if got := slotsInUse(l)["inflight"]; got != 1 {
		t.Fatalf("a slot held on FailLocal's store: slots in use %d, want 1", got)
	}
	d.Release()
	if got := slotsInUse(l)["inflight"]; got != 0 {
		t.Fatalf("after its release: slots in use %d, want 0", got)
	}
}

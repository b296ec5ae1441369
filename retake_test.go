package ceiling

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// The recovery's retake skips a decision released meanwhile (its release
// waits for the retake, then gives the slots back) and takes the others
// again on the backend.
func TestRetakeSkipsAReleaseInProgress(t *testing.T) {
	be := &unstamped{m: memory.New()}
	defer be.m.Close()
	l := MustNew([]Rule{{Name: "streams", Limit: 2, Period: time.Minute, Algorithm: Concurrency}}, WithBackend(be))
	defer l.Close()
	var ds []Decision
	for range 2 {
		d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "acme"})
		if err != nil || !d.Allowed {
			t.Fatalf("Decide: %v %v", d.Allowed, err)
		}
		ds = append(ds, d)
	}
	defer func() {
		for _, d := range ds {
			d.Release()
		}
	}()
	// A release that has begun: done, and waiting for the retake's lock.
	h := ds[0].leases
	h.mu.Lock()
	h.done = true
	h.mu.Unlock()
	if err := be.m.Reset(t.Context(), h.reqs[0].Key); err != nil { // the leases lapsed
		t.Fatal(err)
	}
	if err := l.retakeSlots(t.Context()); err != nil {
		t.Fatal(err)
	}
	res, err := l.Peek(t.Context(), "streams", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if res.Remaining != 1 {
		t.Errorf("after the retake: %d slots free, want 1 (the held one taken again, the released one not)", res.Remaining)
	}
}

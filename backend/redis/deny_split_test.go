package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestDenyCacheLearnsNoRejectionOfASplitCall pins that on Cluster the deny
// cache learns no rejection from a call split across slots: such a
// rejection may be of units an undo gives back milliseconds later, and a
// burst of such calls once locked every caller out for the full window's
// RetryAfter while the units were free. A rejection of a one-slot call is
// still learnt.
func TestDenyCacheLearnsNoRejectionOfASplitCall(t *testing.T) {
	cl := redistest.SharedCluster(t)
	prefix := redistest.KeyPrefix(t)
	s := New(cl.Client(t), WithPrefix(prefix))
	direct := New(cl.Client(t), WithPrefix(prefix), WithDenyCache(0))
	alg := backend.FixedWindow
	reqs := []backend.Request{
		{Key: "a", Algorithm: alg, Limit: 100, Period: time.Hour, Cost: 1},
		{Key: "b", Algorithm: alg, Limit: 1, Period: time.Hour, Cost: 1},
		{Key: "c", Algorithm: alg, Limit: 200, Period: time.Hour, Cost: 1},
	}
	if len(s.slotGroups(reqs)) < 2 {
		t.Fatal("the call's keys share a slot; the test needs a split call")
	}
	if res := decide(t, direct, reqs[1]); !res[0].Allowed {
		t.Fatalf("taking b's unit: %+v", res[0])
	}
	res, err := s.Decide(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res[1].Allowed || res[1].Cached {
		t.Fatalf("the split call on a spent b: %+v, want rejected by Redis", res[1])
	}
	out := make([]backend.Result, len(reqs))
	if s.DecideCached(reqs, out) {
		t.Errorf("the deny cache learnt the split call's rejection: %+v", out)
	}
	if s.DecideCached(reqs[1:2], out) {
		t.Errorf("the deny cache learnt b from the split call: %+v", out[0])
	}
	// The control: the same rejection from a one-slot call is learnt.
	if res := decide(t, s, reqs[1]); res[0].Allowed {
		t.Fatalf("a one-slot call on a spent b: %+v", res[0])
	}
	if !s.DecideCached(reqs[1:2], out) {
		t.Error("the deny cache did not learn a one-slot call's rejection")
	}
}

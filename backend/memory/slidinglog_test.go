package memory

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestSlidingLogGivesBackABurst: a log that held many entries keeps only
// the memory its live entries need once the burst has left the window.
func TestSlidingLogGivesBackABurst(t *testing.T) {
	s, clock := newTestStore(t)
	r := backend.Request{Key: "k", Algorithm: backend.SlidingLog, Limit: 1000, Period: time.Second, Cost: 1}
	for range 1000 {
		decide(t, s, r)
		clock.t = clock.t.Add(time.Microsecond) // one entry per admission
	}
	clock.t = clock.t.Add(time.Second)
	decide(t, s, r)
	h := s.hash("k")
	sh := s.shardOf(h)
	st := sh.logs.slots[sh.logs.find(h)].v
	if got := st.n; got != 1 {
		t.Fatalf("%d entries, want 1", got)
	}
	if got := len(st.ring); got > 16 {
		t.Errorf("the log keeps room for %d entries after the burst, want at most 16", got)
	}
}

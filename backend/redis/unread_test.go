package redis

import (
	"testing"
	"time"
)

// A call whose budget ran out while Redis replied to another round trip
// taken after it was is not blamed on a frozen Redis: Redis runs, and the
// reply is most likely waiting for this process to read it, so the caller
// keeps waiting (within starvedLimit) and takes the reply that comes. With
// no reply to any round trip since, the caller gives up soon after its
// budget, as for a frozen Redis. Neither process here is starved by
// goroutines, so a yield alone calls it prompt (issue 30.1: an overloaded
// machine starves the whole process, which a quick yield does not show).
func TestAReplyToAnotherRoundTripMeansRedisRuns(t *testing.T) {
	const budget = 200 * time.Millisecond
	for _, tc := range []struct {
		name    string
		replied bool
		want    bool
	}{
		{"Redis replied to another round trip since the write", true, true},
		{"no reply since the write", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{}
			w := &waiter{done: make(chan struct{}, 1), budget: budget, n: 1}
			entry := time.Now()
			w.pending.Store(1)
			w.written.Store(entry.UnixNano())
			if tc.replied {
				s.replied.Store(entry.Add(time.Millisecond).UnixNano())
			}
			answer := time.AfterFunc(3*budget, func() { w.done <- struct{}{} }) // the reply, read late
			defer answer.Stop()
			got := s.waitStarved(w, entry)
			took := time.Since(entry)
			if got != tc.want {
				t.Errorf("answered %v after %v, want %v", got, took, tc.want)
			}
			if !tc.want && took > 3*budget {
				t.Errorf("gave up after %v, want soon after the budget of %v", took, budget)
			}
		})
	}
}

package redis

import (
	"testing"
	"testing/synctest"
	"time"
)

// A call whose budget ran out while Redis replied to another round trip
// taken after it was is not blamed on a frozen Redis: Redis runs, and the
// reply is most likely waiting for this process to read it, so the caller
// keeps waiting (within starvedLimit) and takes the reply that comes. With
// no reply to any round trip since, the caller gives up soon after its
// budget, as for a frozen Redis. The clock is synctest's, so the yields
// take no time and no wake-up is late: the process counts as prompt
// however loaded the machine is, and the times are exact (issue 26.1).
func TestAReplyToAnotherRoundTripMeansRedisRuns(t *testing.T) {
	const budget = 200 * time.Millisecond
	for _, tc := range []struct {
		name    string
		replied bool
		want    bool
		took    time.Duration // when waitStarved returns
	}{
		{"Redis replied to another round trip since the write", true, true, 3 * budget},
		// the budget, then a tenth of it for the network poller
		{"no reply since the write", false, false, budget + budget/10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
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
				if took := time.Since(entry); got != tc.want || took != tc.took {
					t.Errorf("answered %v after %v, want %v after %v", got, took, tc.want, tc.took)
				}
			})
		})
	}
}

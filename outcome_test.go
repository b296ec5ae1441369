package ceiling

import (
	"log/slog"
	"testing"
	"time"
)

// A dashboard adds a rule's outcomes to get the requests it decided, and
// reads its allowed outcomes as what it was charged for. A rule that had
// room in a request another rule refused was charged nothing: it is
// not_charged, never allowed (issue 15: 30 "allowed" for a day rule while
// 15 requests were admitted).
func TestOutcomesSumToRequestsPerRule(t *testing.T) {
	store := newCounting()
	obs := newRecorder()
	l := MustNew([]Rule{
		{Name: "chat:minute", Key: RemoteAddr, Limit: 3, Period: time.Minute},
		{Name: "chat:day", Key: RemoteAddr, Limit: 100, Period: 24 * time.Hour},
		{Name: "chat:new", Key: RemoteAddr, Limit: 2, Period: time.Minute, Shadow: true},
	}, WithBackend(store), WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	const requests = 10
	if got, want := codes(t, l.Handler(okHandler), requests), []int{200, 200, 200, 429, 429, 429, 429, 429, 429, 429}; !sameInts(got, want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	want := map[string]int{
		"chat:minute allowed": 3, "chat:minute rejected": 7,
		"chat:day allowed": 3, "chat:day not_charged": 7,
		// The shadow rule fits twice, then would have refused every request.
		"chat:new allowed": 2, "chat:new shadow_rejected": 8,
	}
	for k, v := range want {
		if got := obs.decisions[k]; got != v {
			t.Errorf("decisions[%q] = %d, want %d (all: %v)", k, got, v, obs.decisions)
		}
	}
	perRule := map[string]int{}
	allowed := 0
	for k, n := range obs.decisions {
		var rule, outcome string
		for i := len(k) - 1; i >= 0; i-- {
			if k[i] == ' ' {
				rule, outcome = k[:i], k[i+1:]
				break
			}
		}
		perRule[rule] += n
		if outcome == OutcomeAllowed.String() {
			allowed += n
		}
	}
	for _, r := range []string{"chat:minute", "chat:day", "chat:new"} {
		if got := perRule[r]; got != requests {
			t.Errorf("outcomes of %s sum to %d, want one per request: %d", r, got, requests)
		}
	}
	// Each allowed outcome is one unit consumed in the store, no more.
	if got, want := store.total(), int64(allowed); got != want {
		t.Errorf("units consumed = %d, allowed outcomes = %d", got, want)
	}
}

func TestOutcomeLabels(t *testing.T) {
	for o, want := range map[Outcome]string{
		OutcomeAllowed: "allowed", OutcomeRejected: "rejected",
		OutcomeShadowRejected: "shadow_rejected", OutcomeNotCharged: "not_charged",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d) = %q, want %q", o, got, want)
		}
	}
}

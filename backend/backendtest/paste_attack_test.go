package backendtest

import (
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestPastedCaseKeepsOnce_Regression: a disagreement the differential
// shrank was printed, and offered as a test to paste, without the
// requests' Once. Pasted, the case had no tickets and passed: the Postgres
// and Cluster disagreements of TestGCRARefundAfterClockStepBack_Regression
// and TestClusterUndoKeepsStandingTicket_Regression were unreproducible
// from their report. Every request field the backends read must be
// printed.
func TestPastedCaseKeepsOnce_Regression(t *testing.T) {
	steps := []Step{{At: time.Second, Decide: []backend.Request{
		{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Second, Cost: -1, Stamp: 9, Once: 31961270045},
	}}}
	got := Differential{}.goTest(steps)
	if !strings.Contains(got, "Once: 31961270045") {
		t.Errorf("the pasted case drops the request's Once:\n%s", got)
	}
	if s := goRequests(steps[0].Decide, ""); !strings.Contains(s, "Once: 31961270045") {
		t.Errorf("the failure message drops the request's Once: %s", s)
	}
}

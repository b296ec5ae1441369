package check

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A rule's Unit is sent as RateLimit-Policy's qu parameter (draft-11
// section 3.1): the policy of a rule counting tokens, and of a
// concurrency rule counting something else than requests, must match the
// document as every other policy does.
func TestPolicyWithAUnitMatchesTheDocument_Attack(t *testing.T) {
	rt := router(t)
	accepted := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 5, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "llm:tokens", Key: ceiling.RemoteAddr, Limit: 200000, Period: time.Hour, Unit: "tokens"},
		{Name: "llm:streams", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute, Algorithm: ceiling.Concurrency, Unit: "streams"},
	}, quiet)
	defer limiter.Close()
	resp := send(limiter.Handler(accepted), "+254700000000")
	if resp.status != 202 {
		t.Fatalf("status %d %s, want 202", resp.status, resp.body)
	}
	policy := resp.header.Get("RateLimit-Policy")
	if !strings.Contains(policy, `;qu="tokens"`) || !strings.Contains(policy, `;qu="streams"`) {
		t.Fatalf("RateLimit-Policy %q names no unit", policy)
	}
	if err := validate(t, rt, resp); err != nil {
		t.Errorf("the 202 with RateLimit-Policy %q does not match the document: %v", policy, err)
	}
}

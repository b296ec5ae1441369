package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// With Redis gone the service keeps answering (it fails open), says it is
// degraded, logs it once, and enforces again once Redis is back, without a
// restart.
func TestRedisKilledFailsOpenThenRecovers(t *testing.T) {
	srv := redistest.Server(t)
	cfg, logs := testConfig(t)
	cfg.RedisURL = "redis://" + srv.Addr + "/0"
	cfg.Limits.PerMinute = 3
	cfg.Timeout = 50 * time.Millisecond
	cfg.Breaker = ceiling.BreakerConfig{Failures: 2, CoolDown: 20 * time.Millisecond, MaxCoolDown: 100 * time.Millisecond}
	ts := start(t, cfg)
	tok := token(t, "https://shop-1.myshopify.com")
	if got := chat(t, ts.URL, tok, question).Status; got != 200 {
		t.Fatalf("before the outage: %d, want 200", got)
	}
	if m := metrics(t, ts.Admin); !strings.Contains(m, `ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="allowed",ceiling_rate_limiting_rule="chat:shop:minute"} 1`) || !strings.Contains(m, "ceiling_rate_limiting_degraded 0") {
		t.Errorf("/metrics before the outage lacks the admission or says degraded:\n%s", m)
	}

	srv.Kill()
	got := statuses(t, 10, func() servicetest.Response { return chat(t, ts.URL, tok, question) })
	if want := repeat(10, 200); !slices.Equal(got, want) {
		t.Errorf("during the outage: %v, want %v (failing open, over the limit of 3)", got, want)
	}
	status, h := health(t, ts.Admin)
	if status != http.StatusServiceUnavailable || h.Status != "degraded" || h.Reason == "" {
		t.Errorf("/healthz during the outage: %d %+v, want 503, degraded, with a reason", status, h)
	}
	if h.Rules[0].FailOpenAdmissions == 0 {
		t.Errorf("/healthz counts no unenforced admissions for %s: %+v", ruleMinute, h.Rules[0])
	}
	// The line follows the state /healthz reported: wait for it, as for the state.
	if !servicetest.Eventually(2*time.Second, func() bool { return count(logs, "backend degraded") == 1 }) {
		t.Errorf("the degradation was logged %d times, want once", count(logs, "backend degraded"))
	}
	m := metrics(t, ts.Admin)
	for _, want := range []string{"ceiling_rate_limiting_degraded 1", "ceiling_rate_limiting_degraded_transitions_total 1", `ceiling_rate_limiting_fail_mode_admissions_total{ceiling_rate_limiting_fail_mode="open",ceiling_rate_limiting_rule="chat:shop:minute"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics during the outage lacks %q", want)
		}
	}

	srv.Restart(t)
	probe := token(t, "https://probe.myshopify.com")
	if !servicetest.Eventually(5*time.Second, func() bool {
		chat(t, ts.URL, probe, question)
		status, _ := health(t, ts.Admin)
		return status == http.StatusOK
	}) {
		t.Fatal("/healthz still degraded 5s after Redis came back")
	}
	if got, want := statuses(t, 4, func() servicetest.Response { return chat(t, ts.URL, tok, question) }), []int{200, 200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("after recovery: %v, want %v (enforced again; the restarted Redis is empty)", got, want)
	}
	if m := metrics(t, ts.Admin); !strings.Contains(m, "ceiling_rate_limiting_degraded 0") {
		t.Error("/metrics still says degraded after recovery")
	}
}

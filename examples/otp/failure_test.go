package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// With Redis gone nothing is sent: every request gets 503 with
// Retry-After. Once Redis is back the service sends again, without a
// restart.
func TestRedisKilledFailsClosedThenRecovers(t *testing.T) {
	srv := redistest.Server(t)
	cfg, sms := testConfig(t)
	cfg.RedisURL = "redis://" + srv.Addr + "/0"
	cfg.Timeout = 50 * time.Millisecond
	cfg.Breaker = ceiling.BreakerConfig{Failures: 2, CoolDown: 20 * time.Millisecond, MaxCoolDown: 100 * time.Millisecond}
	ts := start(t, cfg)
	if got := otp(t, ts.URL, "", phone(kenya)).Status; got != 202 {
		t.Fatalf("before the outage: %d, want 202", got)
	}

	srv.Kill()
	for i := range 10 {
		resp := otp(t, ts.URL, "", phone("+254 700 000 2"+strconv.Itoa(10+i)))
		if resp.Status != http.StatusServiceUnavailable {
			t.Errorf("request %d during the outage: %d, want 503", i, resp.Status)
		}
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("request %d during the outage: Retry-After %q, want whole seconds", i, resp.Header.Get("Retry-After"))
		}
	}
	if got := sms.count(); got != 1 {
		t.Errorf("%d SMS sent in all, want 1 (none during the outage)", got)
	}
	// A report is refused as plainly: 503 with Retry-After, never a 202
	// for a report nobody counted, nor one silently dropped.
	resp := report(t, ts.URL, "", "198.51.100.1", "flat-42", "scam")
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.Status != http.StatusServiceUnavailable || err != nil || ra < 1 {
		t.Errorf("a report during the outage: %d, Retry-After %q; want 503 and whole seconds", resp.Status, resp.Header.Get("Retry-After"))
	}
	if resp, err := servicetest.Get(http.DefaultClient, ts.Admin+"/healthz"); err != nil || resp.Status != http.StatusServiceUnavailable {
		t.Errorf("/healthz during the outage: %d %v, want 503", resp.Status, err)
	}
	if resp, err := servicetest.Get(http.DefaultClient, ts.Admin+"/metrics"); err != nil || !strings.Contains(resp.Body, "ceiling_degraded 1") {
		t.Errorf("/metrics during the outage does not say degraded: %v\n%s", err, resp.Body)
	}

	srv.Restart(t)
	if !servicetest.Eventually(5*time.Second, func() bool {
		return otp(t, ts.URL, "", phone("+254 700 000 300")).Status == http.StatusAccepted
	}) {
		t.Fatal("no SMS sent 5s after Redis came back")
	}
	if resp, err := servicetest.Get(http.DefaultClient, ts.Admin+"/healthz"); err != nil || resp.Status != http.StatusOK {
		t.Errorf("/healthz after recovery: %d %v, want 200", resp.Status, err)
	}
}

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
	if resp, err := servicetest.Get(http.DefaultClient, ts.Admin+"/metrics"); err != nil || !strings.Contains(resp.Body, "ceiling_rate_limiting_degraded 1") {
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

// Reports alone find Redis down: the reports' limiter has a breaker of
// its own, and /healthz says degraded while they are refused, though no
// OTP request has asked Redis; it says healthy again once they are filed.
func TestReportsAloneMakeTheServiceDegraded(t *testing.T) {
	srv := redistest.Server(t)
	cfg, _ := testConfig(t)
	cfg.RedisURL = "redis://" + srv.Addr + "/0"
	cfg.Timeout = 50 * time.Millisecond
	cfg.Breaker = ceiling.BreakerConfig{Failures: 2, CoolDown: 20 * time.Millisecond, MaxCoolDown: 100 * time.Millisecond}
	ts := start(t, cfg)
	health := func() int {
		resp, err := servicetest.Get(http.DefaultClient, ts.Admin+"/healthz")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status
	}
	// The first report also loads the Lua library on a fresh server, which
	// a loaded machine may not do within the short timeout.
	if !servicetest.Eventually(5*time.Second, func() bool {
		return report(t, ts.URL, "", "198.51.100.1", "flat-1", "scam").Status == http.StatusAccepted
	}) || health() != 200 {
		t.Fatalf("before the outage: no report filed within 5s, or /healthz %d; want 202 and 200", health())
	}

	srv.Kill()
	for i := range 4 {
		if r := report(t, ts.URL, "", "198.51.100.1", "flat-2", "scam"); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("report %d during the outage: %d, want 503", i, r.Status)
		}
	}
	if got := health(); got != http.StatusServiceUnavailable {
		t.Errorf("/healthz while reports are refused: %d, want 503", got)
	}

	srv.Restart(t)
	if !servicetest.Eventually(5*time.Second, func() bool {
		return report(t, ts.URL, "", "198.51.100.1", "flat-3", "scam").Status == http.StatusAccepted && health() == 200
	}) {
		t.Fatalf("5s after Redis came back: /healthz %d, want reports filed and 200", health())
	}
}

package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A misconfigured Redis refuses the start within seconds, naming the
// cause (issue 12.8).
func TestBinaryRefusesAMisconfiguredRedis(t *testing.T) {
	bin := chatBinary.Path(t)
	for _, c := range servicetest.Misconfigurations(t) {
		t.Run(c.Name, func(t *testing.T) {
			start := time.Now()
			log, code := servicetest.Exit(t, bin, []string{"REDIS_URL=" + c.RedisURL, "CHAT_JWT_SECRET=" + testSecret}, 15*time.Second)
			if code <= 0 || !servicetest.ContainsAny(log, c.Cause) {
				t.Errorf("exit code %d after %v, want non-zero with a message naming %v:\n%s", code, time.Since(start), c.Cause, log)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("refused after %v, want within seconds", took)
			}
		})
	}
}

// An unreachable Redis at start is an outage, which the chat's fail mode
// (open) rides out: the service starts degraded, says so at ERROR and in
// /healthz, and recovers by itself once Redis answers (issue 12.8).
func TestBinaryStartsDegradedOnAnUnreachableRedis(t *testing.T) {
	srv := redistest.Server(t)
	srv.Kill()
	p := servicetest.Start(t, chatBinary.Path(t), []string{"REDIS_URL=redis://" + srv.Addr + "/0", "CHAT_JWT_SECRET=" + testSecret})
	resp, err := servicetest.Get(http.DefaultClient, p.Admin+"/healthz")
	var h struct{ Status, Reason string }
	if err != nil || resp.Status != http.StatusServiceUnavailable || json.Unmarshal([]byte(resp.Body), &h) != nil || h.Reason != "unreachable" {
		t.Errorf("/healthz at start: %d %s %v, want 503, degraded, unreachable", resp.Status, resp.Body, err)
	}
	if !servicetest.ContainsAny(p.Log(), []string{"starting DEGRADED"}) {
		t.Errorf("the degraded start is not logged:\n%s", p.Log())
	}
	// The store's own account of the failed dials goes through the
	// service's logger, sampled (go-redis's own lines stay where the
	// program's go-redis logger sends them: the store never replaces it).
	if !servicetest.Eventually(5*time.Second, func() bool { return strings.Contains(p.Log(), "ceiling/backend/redis: failed to dial") }) {
		t.Errorf("no failed dial of the store in the service's log while Redis is down:\n%s", p.Log())
	}
	srv.Restart(t)
	if !servicetest.Eventually(5*time.Second, func() bool {
		r, err := servicetest.Get(http.DefaultClient, p.Admin+"/healthz")
		return err == nil && r.Status == http.StatusOK
	}) {
		t.Errorf("still degraded 5 s after Redis came back")
	}
	p.Stop(t)
}

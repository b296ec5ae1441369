package ceilingotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestMain stops the Redis servers the tests started and reports the
// tests that skipped for want of redis-server.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// code is the status of a GET through h.
func code(h http.Handler) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	return w.Code
}

// result is the requests counter's series of a rule and a result, as
// sdkObserver's collection names it.
func result(rule, result string) string {
	return "ceiling.rate_limiting.requests{ceiling.rate_limiting.result=" + result + ",ceiling.rate_limiting.rule=" + rule + "}"
}

// A request that a rule failing closed refused with 503 while a real
// Redis was down is counted as that rule's fail_closed result, once per
// 503: no rule decided it, so no other call reports it. The rule failing
// open before it admitted nothing (a request is refused as a whole).
func TestFailClosedRefusalsAreCounted(t *testing.T) {
	srv := redistest.Server(t)
	store := redisbackend.New(srv.Client(t), redisbackend.WithPrefix(redistest.KeyPrefix(t)))
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "otp:to", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailClosed},
	}, ceiling.WithBackend(store), ceiling.WithObserver(obs), ceiling.WithTimeout(2*time.Second), quiet)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	if got := code(h); got != 200 {
		t.Fatalf("status %d with Redis up, want 200", got)
	}
	srv.Kill()
	refused := 0
	for range 8 { // the first few fail on the dead server, the rest on the open breaker
		if code(h) == 503 {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no 503 with Redis killed and a rule failing closed")
	}
	got := collect()
	expect(t, got, map[string]float64{
		result("otp:to", "fail_closed"): float64(refused),
		result("otp:to", "allowed"):     1,
		result("otp:ip", "allowed"):     1,
	})
	if n := got[result("otp:ip", "fail_closed")]; n != 0 {
		t.Errorf("otp:ip, failing open, counted %v fail_closed", n)
	}
}

// notSent is a remote backend this process never gets to send a call to,
// as when every connection is taken.
type notSent struct{}

func (notSent) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, fmt.Errorf("pool exhausted: %w", backend.ErrNotSent)
}

func (notSent) Reset(context.Context, ...string) error { return nil }

// A request shed with 503 because this process could not send its call is
// the shed result of its first enforced rule, never fail_closed: whatever
// the fail modes, it was not the backend that failed. A shadow rule before
// it is not named.
func TestShedRequestsAreCounted(t *testing.T) {
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, Shadow: true},
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
	}, ceiling.WithBackend(notSent{}), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	for range 3 {
		if got := code(h); got != 503 {
			t.Fatalf("status %d, want 503 for a shed request", got)
		}
	}
	got := collect()
	n := 0 // series of the requests counter that counted something
	for k, v := range got {
		if strings.HasPrefix(k, "ceiling.rate_limiting.requests{") && v > 0 {
			n++
		}
	}
	if got[result("chat", "shed")] != 3 || n != 1 {
		t.Errorf("requests = %v, want chat shed = 3 and nothing else", got)
	}
}

// down is a remote backend that is unreachable.
type down struct{}

func (down) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, fmt.Errorf("dial: %w", backend.ErrUnreachable)
}

func (down) Reset(context.Context, ...string) error { return nil }

// An admission that a rule's fail mode made while the backend was down is
// the rule's fail_open or fail_local result, as many as the fail-mode
// admissions, and never allowed: a dashboard of allowed requests counts
// only what the backend charged. Each request is one result per rule.
func TestFailModeAdmissionsAreTheirOwnResults(t *testing.T) {
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "shop", Key: ceiling.Static("s"), Limit: 100, Period: time.Minute, FailMode: ceiling.FailLocal},
	}, ceiling.WithBackend(down{}), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	for range 4 {
		if got := code(h); got != 200 {
			t.Fatalf("status %d, want 200 admitted by the fail modes", got)
		}
	}
	got := collect()
	expect(t, got, map[string]float64{
		result("chat", "fail_open"):  4,
		result("shop", "fail_local"): 4,
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=open,ceiling.rate_limiting.rule=chat}":  4,
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=local,ceiling.rate_limiting.rule=shop}": 4,
	})
	for k, v := range got {
		if strings.HasPrefix(k, "ceiling.rate_limiting.requests{") && v != 0 && k != result("chat", "fail_open") && k != result("shop", "fail_local") {
			t.Errorf("%s = %v, want 0: each admission is counted once, as its fail mode", k, v)
		}
	}
}

package ceilingprom_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMain stops the Redis servers the tests started and reports the
// tests that skipped for want of redis-server.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// requests reads ceiling_rate_limiting_requests_total by rule and result,
// leaving out the series still at zero.
func requests(t *testing.T, obs *ceilingprom.Observer) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range series(t, obs, "ceiling_rate_limiting_requests_total") {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if v := m.GetCounter().GetValue(); v != 0 {
			out[l["ceiling_rate_limiting_rule"]+" "+l["ceiling_rate_limiting_result"]] = v
		}
	}
	return out
}

// series gathers obs on a pedantic registry and returns the series of the
// family name (none when it has none).
func series(t *testing.T, obs *ceilingprom.Observer, name string) []*dto.Metric {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// A request that a rule failing closed refused with 503 while a real
// Redis was down is counted as that rule's fail_closed result, once per
// 503: no rule decided it, so no other call reports it. The rule failing
// open before it admitted nothing (a request is refused as a whole).
func TestFailClosedRefusalsAreCounted(t *testing.T) {
	srv := redistest.Server(t)
	store := redisbackend.New(srv.Client(t), redisbackend.WithPrefix(redistest.KeyPrefix(t)))
	obs := ceilingprom.New(ceilingprom.Options{})
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "otp:to", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailClosed},
	}, ceiling.WithBackend(store), ceiling.WithObserver(obs), ceiling.WithTimeout(2*time.Second),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	if got := get(h); got != 200 {
		t.Fatalf("status %d with Redis up, want 200", got)
	}
	srv.Kill()
	refused := 0
	for range 8 { // the first few fail on the dead server, the rest on the open breaker
		if get(h) == 503 {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no 503 with Redis killed and a rule failing closed")
	}
	got := requests(t, obs)
	if got["otp:to fail_closed"] != float64(refused) {
		t.Errorf("otp:to fail_closed = %v, want the %d 503s sent (all: %v)", got["otp:to fail_closed"], refused, got)
	}
	if n, ok := got["otp:ip fail_closed"]; ok {
		t.Errorf("otp:ip, failing open, counted %v fail_closed", n)
	}
	if got["otp:to allowed"] != 1 || got["otp:ip allowed"] != 1 {
		t.Errorf("allowed = %v, want 1 for each rule, the request before the outage", got)
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
	obs := ceilingprom.New(ceilingprom.Options{})
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, Shadow: true},
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, FailMode: ceiling.FailOpen},
	}, ceiling.WithBackend(notSent{}), ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	for range 3 {
		if got := get(h); got != 503 {
			t.Fatalf("status %d, want 503 for a shed request", got)
		}
	}
	got := requests(t, obs)
	if got["chat shed"] != 3 || len(got) != 1 {
		t.Errorf("requests = %v, want chat shed = 3 and nothing else", got)
	}
}

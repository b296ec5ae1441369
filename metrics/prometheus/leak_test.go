package ceilingprom_test

import (
	"encoding/hex"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// Nothing the exposition holds (names, labels, help, values) repeats a
// key value, the Redis address or password, the key secret or the stored
// keys' prefix, after requests with distinctive keys were admitted,
// rejected, refused by a shadow rule and, with the real Redis killed,
// decided by every fail mode and refused failing closed.
func TestExpositionHoldsNoKeyAddressOrSecret(t *testing.T) {
	const password = "pw-Zq81vXk2Lm"
	secret := []byte("ks-7HcP0qW3nR5tY9uI2oA4sD6fG8hJ1kL3")
	srv := redistest.ServerWith(t, "requirepass "+password)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	obs := ceilingprom.New(ceilingprom.Options{})
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute, FailMode: ceiling.FailLocal},
		{Name: "chat:user", Key: ceiling.Header("X-User"), Limit: 2, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "otp:to", Key: ceiling.Query("to"), Limit: 1, Period: time.Hour, FailMode: ceiling.FailClosed},
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
	}, ceiling.WithBackend(redisbackend.New(client, redisbackend.WithPrefix(prefix))),
		ceiling.WithKeySecret(secret), ceiling.WithObserver(obs), ceiling.WithTimeout(2*time.Second),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })

	codes := map[int]int{}
	send := func(addr, user, to string) {
		r := httptest.NewRequest("GET", "/?to="+to, nil)
		r.RemoteAddr = addr
		if user != "" {
			r.Header.Set("X-User", user)
		}
		w := httptest.NewRecorder()
		l.Handler(ok).ServeHTTP(w, r)
		codes[w.Code]++
	}
	clients := [][3]string{
		{"198.51.100.23:5555", "user-4f9c1e", "%2B15550199123"},
		{"[2001:db8:77::beef]:443", "mallory-b7e2", "%2B15550188456"},
	}
	for range 4 {
		for _, c := range clients {
			send(c[0], c[1], c[2])
		}
	}
	srv.Kill()
	// Keys the deny cache does not hold as spent, so that the backend is
	// asked, fails, and the fail modes decide.
	for _, c := range [][3]string{
		{"198.51.100.23:5555", "user-a11ce9", "%2B15550177789"}, // otp:to fails closed: 503
		{"203.0.113.9:1", "", ""},                               // only chat:ip and new apply: decided locally
		{"203.0.113.9:1", "trudy-c0ffee", ""},
	} {
		for range 3 {
			send(c[0], c[1], c[2])
		}
	}
	for _, code := range []int{200, 429, 503} {
		if codes[code] == 0 {
			t.Fatalf("no %d among the responses %v: the scenario does not reach every outcome", code, codes)
		}
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	w := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	exposition := w.Body.String()
	for _, want := range []string{`ceiling_rate_limiting_result="rejected"`, `ceiling_rate_limiting_result="fail_closed"`, `ceiling_rate_limiting_result="shadow_rejected"`} {
		if !strings.Contains(exposition, want) {
			t.Fatalf("the exposition has no %s: the scenario did not reach it\n%s", want, exposition)
		}
	}
	for _, leak := range []string{
		"198.51.100.23", "2001:db8", "user-4f9c1e", "mallory-b7e2", "user-a11ce9", "trudy-c0ffee",
		"15550199123", "15550188456", "15550177789", "203.0.113.9",
		srv.Addr, password, string(secret), hex.EncodeToString(secret), prefix,
	} {
		if strings.Contains(exposition, leak) {
			t.Errorf("the exposition repeats %q", leak)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", exposition)
	}
}

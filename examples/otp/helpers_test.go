package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) {
	code := redistest.Main(m)
	otpBinary.Remove()
	os.Exit(code)
}

// testSecret signs the tests' user tokens.
const testSecret = "otp-test-secret"

// countingSender records every number it was asked to send to.
type countingSender struct {
	mu   sync.Mutex
	sent []string
}

func (s *countingSender) Send(_ context.Context, phone, code string) error {
	if len(code) != 6 {
		panic("code " + code + " is not six digits")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, phone)
	return nil
}

func (s *countingSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

// testConfig is the production configuration with the tests' secret, a
// log buffer and a counting sender.
func testConfig(t *testing.T) (config, *countingSender) {
	t.Helper()
	logs := &servicetest.LogBuffer{}
	sms := &countingSender{}
	cfg := defaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.JWTSecret = []byte(testSecret)
	cfg.Sender = sms
	// Generous, so that a loaded machine never makes an exactness test
	// fail closed; the failure tests set a short one.
	cfg.Timeout = 2 * time.Second
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", logs.String())
		}
	})
	return cfg, sms
}

// eachBackend runs fn on the memory backend and on a real Redis shared by
// the package's tests (keys apart by a prefix of the test's own), both at
// once.
func eachBackend(t *testing.T, fn func(t *testing.T, cfg config, sms *countingSender)) {
	backends(t, true, fn)
}

// backends runs fn on each backend, both at once when parallel is set.
// Tests that count goroutines run them in turn.
func backends(t *testing.T, parallel bool, fn func(t *testing.T, cfg config, sms *countingSender)) {
	t.Run("memory", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		cfg, sms := testConfig(t)
		fn(t, cfg, sms)
	})
	t.Run("redis", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		srv := redistest.Shared(t)
		cfg, sms := testConfig(t)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		cfg.RedisPrefix = redistest.KeyPrefix(t)
		fn(t, cfg, sms)
	})
}

// A site is a service that start serves: the base URLs of its public
// and its admin listener.
type site struct{ URL, Admin string }

// start serves newServer(cfg) on two loopback ports, public and admin,
// until the test ends.
func start(t *testing.T, cfg config) *site {
	t.Helper()
	h, cleanup, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	public, admin := httptest.NewServer(h.Public), httptest.NewServer(h.Admin)
	t.Cleanup(func() {
		public.Close()
		admin.Close()
		cleanup()
	})
	return &site{URL: public.URL, Admin: admin.URL}
}

// otp posts body to the service's OTP endpoint.
func otp(t *testing.T, url, tok, body string, header ...string) servicetest.Response {
	t.Helper()
	resp, err := servicetest.Post(http.DefaultClient, url+"/api/otp", tok, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// phone is the body asking for a code to number.
func phone(number string) string {
	b, _ := json.Marshal(map[string]string{"phone": number})
	return string(b)
}

// violated returns the violated-policies of a 429's problem body.
func violated(t *testing.T, r servicetest.Response) []string {
	t.Helper()
	var p ceiling.Problem
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	return p.ViolatedPolicies
}

// otpBinary is the service, built once per test run; TestMain removes it.
var otpBinary = servicetest.Binary{Pkg: "github.com/ceiling-go/ceiling/examples/otp"}

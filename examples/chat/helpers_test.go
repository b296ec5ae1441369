package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/golang-jwt/jwt/v5"
)

func TestMain(m *testing.M) {
	code := redistest.Main(m)
	chatBinary.Remove()
	os.Exit(code)
}

// testSecret signs the tests' tokens.
const testSecret = "chat-test-secret"

// testConfig is the production configuration with the tests' secret, a
// log buffer and an order lookup that takes no time.
func testConfig(t testing.TB) (config, *servicetest.LogBuffer) {
	t.Helper()
	logs := &servicetest.LogBuffer{}
	cfg := defaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.JWTSecret = []byte(testSecret)
	cfg.Orders = fakeOrders(0)
	// Generous, so that a loaded machine never makes an exactness test
	// fail open; the failure tests set a short one.
	cfg.Timeout = 2 * time.Second
	// Tests that count the other rules send many requests of one shop at
	// once; TestAnswersInFlightPerShop sets the production 4 again.
	cfg.Limits.Answers = 1000
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", logs.String())
		}
	})
	return cfg, logs
}

// eachBackend runs fn on the memory backend and on a real Redis shared by
// the package's tests (keys apart by a prefix of the test's own), both at
// once.
func eachBackend(t *testing.T, fn func(t *testing.T, cfg config)) { backends(t, true, fn) }

// backends runs fn on each backend, both at once when parallel is set.
// Tests that count goroutines run them in turn.
func backends(t *testing.T, parallel bool, fn func(t *testing.T, cfg config)) {
	t.Run("memory", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		cfg, _ := testConfig(t)
		fn(t, cfg)
	})
	t.Run("redis", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		srv := redistest.Shared(t)
		cfg, _ := testConfig(t)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		cfg.RedisPrefix = redistest.KeyPrefix(t)
		fn(t, cfg)
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

// token is a valid session token of shop.
func token(t testing.TB, shop string) string {
	return servicetest.Token(t, testSecret, jwt.MapClaims{"dest": shop, "sub": "user-1"})
}

// chat posts body to the service's chat endpoint.
func chat(t *testing.T, url, tok, body string, header ...string) servicetest.Response {
	t.Helper()
	resp, err := servicetest.Post(http.DefaultClient, url+"/api/chat", tok, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

const question = `{"message": "where is my order?"}`

// statuses sends n requests one after the other and returns their statuses.
func statuses(t *testing.T, n int, send func() servicetest.Response) []int {
	t.Helper()
	got := make([]int, n)
	for i := range got {
		got[i] = send().Status
	}
	return got
}

// repeat returns n copies of status, for want lists: repeat(30, 400).
func repeat(n, status int) []int { return slices.Repeat([]int{status}, n) }

// violated returns the violated-policies of a 429's problem body.
func violated(t *testing.T, r servicetest.Response) []string {
	t.Helper()
	var p ceiling.Problem
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("429 body %q: %v", r.Body, err)
	}
	return p.ViolatedPolicies
}

// health returns /healthz's status code and report.
func health(t *testing.T, url string) (int, ceiling.Health) {
	t.Helper()
	resp, err := servicetest.Get(http.DefaultClient, url+"/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h ceiling.Health
	if err := json.Unmarshal([]byte(resp.Body), &h); err != nil {
		t.Fatalf("/healthz body %q: %v", resp.Body, err)
	}
	return resp.Status, h
}

// metrics returns the /metrics exposition.
func metrics(t *testing.T, url string) string {
	t.Helper()
	resp, err := servicetest.Get(http.DefaultClient, url+"/metrics")
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.Status, err)
	}
	return resp.Body
}

// chatBinary is the service, built once per test run; TestMain removes it.
var chatBinary = servicetest.Binary{Pkg: "github.com/ceiling-go/ceiling/examples/chat"}

// count returns how many times substr occurs in the log.
func count(logs *servicetest.LogBuffer, substr string) int {
	return strings.Count(logs.String(), substr)
}

package ceiling_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
)

// down is a shared backend that cannot be reached, as Redis during an
// outage.
type down struct{}

func (down) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6379}
	return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: addr, Err: syscall.ECONNREFUSED}
}

func (down) Reset(context.Context, ...string) error { return nil }

// pager tells someone of each degradation; a real one pages from a
// goroutine, since an observer must not block.
type pager struct{ ceiling.NopObserver }

func (pager) ObserveDegraded(e ceiling.DegradedEvent) {
	fmt.Println("degraded:", e.Degraded, "after", e.Failures, "failures:", e.Cause)
}

// While the shared backend is down, FailLocal keeps enforcing each rule on
// the instance's own memory, at its share of the limit, and the degradation
// is reported once to the observer (and logged, and visible in Health).
func ExampleFailLocal() {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 6, Period: time.Minute},
	},
		ceiling.WithBackend(down{}),
		ceiling.WithFailMode(ceiling.FailLocal),
		ceiling.WithInstances(3), // each instance keeps 1/3 of the limit locally
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 2}),
		ceiling.WithObserver(pager{}),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)),
	)
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/otp", nil))
		fmt.Println(w.Code)
	}
	fmt.Println(l.Health().Status, l.Health().Rules[0].FailLocalAdmissions)
	// Output:
	// 200
	// degraded: true after 2 failures: dial tcp 127.0.0.1:6379: connection refused
	// 200
	// 429
	// degraded 2
}

// Check at start-up proves the backend answers and rejects a canary over
// its limit; a backend that admits everything fails it.
func ExampleLimiter_Check() {
	rules := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Second}}

	l := ceiling.MustNew(rules) // the memory store
	defer l.Close()
	fmt.Println(l.Check(context.Background()))

	broken := ceiling.MustNew(rules, ceiling.WithBackend(admitsEverything{}))
	err := broken.Check(context.Background())
	fmt.Println(errors.Is(err, ceiling.ErrNotEnforcing))
	// Output:
	// <nil>
	// true
}

type admitsEverything struct{}

func (admitsEverything) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	for i := range out {
		out[i].Allowed = true
	}
	return out, nil
}

func (admitsEverything) Reset(context.Context, ...string) error { return nil }

// The health handler answers 503 with the kind of failure while the limiter
// is degraded, for uptime checks and alerts; the error itself, which names
// the backend's address, goes only to the log.
func ExampleLimiter_HealthHandler() {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "chat", Key: ceiling.RemoteAddr, Limit: 30, Period: time.Minute}},
		ceiling.WithBackend(down{}), ceiling.WithFailMode(ceiling.FailOpen),
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 1, CoolDown: time.Minute}),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	mux := http.NewServeMux()
	mux.Handle("/healthz", l.HealthHandler())
	mux.Handle("/chat", l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))

	var body string
	for _, path := range []string{"/healthz", "/chat", "/healthz"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, w.Code)
		body = w.Body.String()
	}
	h := l.Health()
	fmt.Println(h.Status, "-", h.Reason, "- address in the body:", strings.Contains(body, "6379"))
	// Output:
	// /healthz 200
	// /chat 200
	// /healthz 503
	// degraded - unreachable - address in the body: false
}

// An Observer that reports what was admitted without enforcement; embed
// NopObserver and implement only what you need.
type unenforced struct{ ceiling.NopObserver }

func (unenforced) ObserveFailMode(rule string, mode ceiling.FailMode) {
	fmt.Printf("%s admitted failing %s\n", rule, mode)
}

func ExampleWithObserver() {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "chat", Key: ceiling.RemoteAddr, Limit: 30, Period: time.Minute, FailMode: ceiling.FailOpen}},
		ceiling.WithBackend(down{}), ceiling.WithObserver(unenforced{}),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	l.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	// Output:
	// chat admitted failing open
}

package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// server is an http.Handler behind an in-process RoundTripper, for tests
// inside a synctest bubble, where real sockets do not work. It records
// the status and the body of every request it answered.
type server struct {
	h      http.Handler
	mu     sync.Mutex
	codes  []int
	bodies []string
	// onRefusal, when set, is called as each 429 or 503 is answered.
	onRefusal func()
}

func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RemoteAddr = "192.0.2.1:1234"
	in.RequestURI = req.URL.RequestURI()
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	in.Body = io.NopCloser(bytes.NewReader(body))
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, in)
	s.mu.Lock()
	s.codes = append(s.codes, rec.Code)
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	if s.onRefusal != nil && (rec.Code == http.StatusTooManyRequests || rec.Code == http.StatusServiceUnavailable) {
		s.onRefusal()
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// seen is the statuses the server answered, in order.
func (s *server) seen() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.codes)
}

// rejected counts the 429s and 503s the server answered.
func (s *server) rejected() int {
	n := 0
	for _, c := range s.seen() {
		if c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable {
			n++
		}
	}
	return n
}

// env is where a test runs ceiling's middleware: its backend's options,
// and the clock that the server and the Transport share.
type env struct {
	opts []ceiling.Option
	fake *backendtest.Clock // nil inside a synctest bubble, whose clock is time's
}

func (e *env) now() time.Time {
	if e.fake != nil {
		return e.fake.Now()
	}
	return time.Now()
}

// transport puts tr on e's clock: under a fake clock its waits advance
// that clock instead of sleeping.
func (e *env) transport(tr *Transport) *Transport {
	if e.fake != nil {
		tr.now = e.fake.Now
		tr.sleep = func(ctx context.Context, d time.Duration) error {
			e.fake.Advance(d)
			return ctx.Err()
		}
	}
	return tr
}

// forBackends runs f on ceiling's middleware over the memory store inside
// a synctest bubble, and over a real Redis outside any bubble, on a fake
// clock that both the Store (WithClock) and the Transport read. Redis
// cannot run in bubbles: backend/redis pools the channels of its waiters
// across Stores, and a bubble's channel must not cross into another.
func forBackends(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("memory", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { f(t, &env{}) })
	})
	t.Run("redis", func(t *testing.T) {
		rc := redistest.Shared(t).Client(t)
		// The fake clock starts at the real time, so that a context
		// deadline set from it means the same to both clocks.
		clock := backendtest.NewClock(time.Now())
		store := ceilingredis.New(rc, ceilingredis.WithPrefix(redistest.KeyPrefix(t)), ceilingredis.WithClock(clock.Now))
		f(t, &env{opts: []ceiling.Option{ceiling.WithBackend(store)}, fake: clock})
	})
}

var secret = bytes.Repeat([]byte("k"), 32)

// limited is ceiling's middleware with one rule of limit per period for
// everybody, over a handler that answers 200, on opts' backend.
func limited(t *testing.T, limit int64, period time.Duration, opts ...ceiling.Option) *server {
	t.Helper()
	l, err := ceiling.New([]ceiling.Rule{{
		Name:      "api",
		Key:       ceiling.Static("all"),
		Limit:     limit,
		Period:    period,
		Algorithm: ceiling.SlidingLog,
	}}, append([]ceiling.Option{ceiling.WithKeySecret(secret)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &server{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
}

package ceiling

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// concurrencyBackends are the stores a concurrency rule is tested on: the
// default memory store (nil) and a real Redis, decided with loadedTimeout:
// these tests are about leases, not about the timeout.
var concurrencyBackends = []struct {
	name    string
	backend func(t *testing.T) backend.Backend
}{
	{"memory", func(*testing.T) backend.Backend { return nil }},
	{"redis", func(t *testing.T) backend.Backend {
		return ceilingredis.New(redistest.Shared(t).Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
	}},
}

// A plan's number of concurrent streams, from Rule.Limits or Input.Limit:
// it was a 500 for every request ("lease 0 outside 1.."), because the
// limit was validated before the lease was drawn.
func TestConcurrencyLimitPerRequest_LeaseRegression(t *testing.T) {
	for _, be := range concurrencyBackends {
		t.Run(be.name, func(t *testing.T) {
			var opts []Option
			if b := be.backend(t); b != nil {
				opts = append(opts, WithBackend(b), WithTimeout(loadedTimeout))
			}
			l := MustNew([]Rule{{Name: "streams", Key: headerKey("X-Shop"), Limit: 5, Period: time.Minute, Algorithm: Concurrency,
				Limits: func(r *http.Request) (int64, int64, error) {
					n, err := strconv.ParseInt(r.Header.Get("X-Plan-Streams"), 10, 64)
					return n, 0, err
				}}}, opts...)
			defer l.Close()

			// Through HTTP: a plan of 2 streams holds 2 at once.
			g := newGate()
			h := l.Handler(g)
			req := func(shop string, streams int) *http.Request {
				r := inflightRequest(shop)
				r.Header.Set("X-Plan-Streams", strconv.Itoa(streams))
				return r
			}
			g.leave <- struct{}{} // one request that goes straight through
			if w := serve(t, h, req("initech", 2)); w.Code != 200 {
				t.Fatalf("a stream on a plan of 2: %d, want 200", w.Code)
			}
			<-g.entered
			w1, done1 := start(h, req("acme", 2))
			waitEntered(t, g, w1, done1)
			w2, done2 := start(h, req("acme", 2))
			waitEntered(t, g, w2, done2)
			if w := serve(t, h, req("acme", 2)); w.Code != http.StatusTooManyRequests {
				t.Errorf("third stream on a plan of 2: %d, want 429", w.Code)
			}
			g.leave <- struct{}{}
			<-done1
			w3, done3 := start(h, req("acme", 2))
			waitEntered(t, g, w3, done3)
			g.leave <- struct{}{}
			g.leave <- struct{}{}
			<-done2
			<-done3

			// Through Decide: a limit of 3 for this call holds 3.
			var held []Decision
			for i := range 4 {
				d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "globex", Limit: 3})
				if err != nil {
					t.Fatalf("Decide %d: %v", i+1, err)
				}
				if want := i < 3; d.Allowed != want {
					t.Fatalf("Decide %d with a limit of 3: allowed %v, want %v", i+1, d.Allowed, want)
				}
				held = append(held, d)
			}
			held[0].Release()
			if d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "globex", Limit: 3}); err != nil || !d.Allowed {
				t.Errorf("after a release: %v, %v; want admitted", d.Allowed, err)
			} else {
				d.Release()
			}
			for _, d := range held {
				d.Release()
			}
		})
	}
}

// waitEntered waits until the request start began enters the gate's
// handler, and fails the test if it was answered without entering (shed
// with a 503 on a loaded machine, say) rather than wait for ever.
func waitEntered(t *testing.T, g *gate, w *httptest.ResponseRecorder, done chan struct{}) {
	t.Helper()
	select {
	case <-g.entered:
	case <-done:
		t.Fatalf("the request was answered %d without reaching the handler: %s", w.Code, w.Body)
	}
}

// Charge on a concurrency rule is refused: a charged slot had no lease
// that anything could give back (Charge(+3) filled the key, Charge(-3)
// changed nothing, and the key stayed full for the whole lease).
func TestChargeRefusedOnConcurrency(t *testing.T) {
	for _, be := range concurrencyBackends {
		t.Run(be.name, func(t *testing.T) {
			var opts []Option
			if b := be.backend(t); b != nil {
				opts = append(opts, WithBackend(b), WithTimeout(loadedTimeout))
			}
			l := MustNew([]Rule{{Name: "streams", Limit: 3, Period: time.Minute, Algorithm: Concurrency}}, opts...)
			defer l.Close()
			for _, cost := range []int64{3, -3} {
				if err := l.Charge(t.Context(), Input{Rule: "streams", Key: "acme", Cost: cost}); !errors.Is(err, errChargeConcurrency) {
					t.Errorf("Charge(%d): %v, want the concurrency refusal", cost, err)
				}
			}
			d, err := l.Decide(t.Context(), Input{Rule: "streams", Key: "acme", Cost: 3})
			if err != nil || !d.Allowed {
				t.Errorf("a decision for the whole limit after the charges: %v, %v; want admitted", d.Allowed, err)
			}
			d.Release()
		})
	}
}

// Package compare measures, for a fixed amount of work against ceiling's
// middleware, how many calls each way of retrying gets rejected: a naive
// retry loop, github.com/hashicorp/go-retryablehttp with its defaults and
// with client.Backoff, and client.Transport with and without Pace. It is
// a test-only module, so that the core module never requires
// go-retryablehttp.
package compare

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/client"
	"github.com/hashicorp/go-retryablehttp"
)

// api is ceiling's middleware behind an in-process RoundTripper (the
// comparison runs in a synctest bubble, where sockets do not work),
// counting the calls it answered and the ones it refused.
type api struct {
	h              http.Handler
	calls, refused atomic.Int64
}

func (a *api) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RemoteAddr = "192.0.2.1:1234"
	in.RequestURI = req.URL.RequestURI()
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		req.Body.Close()
		in.Body = io.NopCloser(bytes.NewReader(b))
	}
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, in)
	a.calls.Add(1)
	if rec.Code == http.StatusTooManyRequests {
		a.refused.Add(1)
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

const (
	limit  = 5
	period = 10 * time.Second
	// maxCalls bounds every strategy's loop: a strategy that needs more
	// calls than this for the work fails the test instead of spinning.
	maxCalls = 10_000
)

// strategy does one unit of work: a GET that must end in a 200, sent
// through a, retried as the strategy retries.
type strategy struct {
	name string
	new  func(a *api) func(ctx context.Context) error
}

var strategies = []strategy{
	{"naive loop (retry after 100ms)", func(a *api) func(context.Context) error {
		return func(ctx context.Context) error {
			for range maxCalls {
				resp, err := a.RoundTrip(get(ctx))
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				time.Sleep(100 * time.Millisecond)
			}
			return fmt.Errorf("no 200 in %d calls", maxCalls)
		}
	}},
	{"go-retryablehttp, DefaultBackoff", retryable(nil)},
	{"go-retryablehttp, client.Backoff", retryable(client.Backoff)},
	{"client.Transport", transport(false)},
	{"client.Transport, Pace", transport(true)},
}

func get(ctx context.Context) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
	return req
}

// retryable is a go-retryablehttp client with its defaults (RetryWaitMin
// 1s, RetryWaitMax 30s, RetryMax 4, DefaultRetryPolicy), its Backoff
// replaced when backoff is not nil; a unit of work that it gives up on is
// started again, as its caller would have to.
func retryable(backoff retryablehttp.Backoff) func(a *api) func(context.Context) error {
	return func(a *api) func(context.Context) error {
		c := retryablehttp.NewClient()
		c.HTTPClient = &http.Client{Transport: a}
		c.Logger = nil
		if backoff != nil {
			c.Backoff = backoff
		}
		return func(ctx context.Context) error {
			for a.calls.Load() < maxCalls {
				req, err := retryablehttp.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
				if err != nil {
					return err
				}
				resp, err := c.Do(req)
				if err != nil {
					continue // gave up after RetryMax: the work is still to do
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
			return fmt.Errorf("no 200 in %d calls", maxCalls)
		}
	}
}

// transport is client.Transport with its defaults; a unit of work whose
// retries ran out is started again.
func transport(pace bool) func(a *api) func(context.Context) error {
	return func(a *api) func(context.Context) error {
		c := &http.Client{Transport: &client.Transport{Base: a, Pace: pace}}
		return func(ctx context.Context) error {
			for a.calls.Load() < maxCalls {
				resp, err := c.Do(get(ctx))
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
			return fmt.Errorf("no 200 in %d calls", maxCalls)
		}
	}
}

// outcome is what a strategy cost for the work.
type outcome struct {
	refused, calls int64
	took           time.Duration
}

// run does work units of work with workers goroutines through s against
// a limit of 5 per 10 s (a sliding log, the exact rolling window) on the
// memory store, in a synctest bubble, so every wait is virtual.
func run(t *testing.T, s strategy, work, workers int) outcome {
	var o outcome
	synctest.Test(t, func(t *testing.T) {
		l, err := ceiling.New([]ceiling.Rule{{
			Name: "api", Key: ceiling.Static("all"), Limit: limit, Period: period, Algorithm: ceiling.SlidingLog,
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		a := &api{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
		do := s.new(a)
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < work; i += workers {
					if err := do(t.Context()); err != nil {
						t.Errorf("%s: %v", s.name, err)
						return
					}
				}
			})
		}
		wg.Wait()
		o = outcome{refused: a.refused.Load(), calls: a.calls.Load(), took: time.Since(start)}
	})
	return o
}

// compare runs every strategy on the work and logs what each cost.
func compare(t *testing.T, work, workers int) map[string]outcome {
	got := map[string]outcome{}
	for _, s := range strategies {
		o := run(t, s, work, workers)
		got[s.name] = o
		t.Logf("%-34s %4d refused of %4d calls, done in %v", s.name, o.refused, o.calls, o.took)
	}
	return got
}

const naiveLoop = "naive loop (retry after 100ms)"

// TestFewestRejectedCalls: one worker doing 20 GETs against 5 per 10 s.
// client.Transport with Pace is refused fewer times than go-retryablehttp
// (with its DefaultBackoff or with client.Backoff), which is refused fewer
// times than a naive loop, and it finishes no later than any of them.
func TestFewestRejectedCalls(t *testing.T) {
	got := compare(t, 20, 1)
	paced, naive := got["client.Transport, Pace"], got[naiveLoop]
	for _, name := range []string{"go-retryablehttp, DefaultBackoff", "go-retryablehttp, client.Backoff"} {
		r := got[name]
		if !(paced.refused < r.refused && r.refused < naive.refused) {
			t.Errorf("refused: Pace %d, %s %d, naive %d; want them in increasing order", paced.refused, name, r.refused, naive.refused)
		}
	}
	for name, o := range got {
		if paced.took > o.took {
			t.Errorf("Pace took %v, %s %v: pacing must not cost time", paced.took, name, o.took)
		}
	}
}

// TestRejectedCallsConcurrent: four workers share one client for the same
// work. Pace holds only after an r=0, so requests already in flight when
// the quota runs out are still refused, and how many depends on how the
// workers interleave: only the naive loop's place, last, is certain, and
// every strategy finishes the work in the same time.
func TestRejectedCallsConcurrent(t *testing.T) {
	got := compare(t, 20, 4)
	naive := got[naiveLoop]
	for name, o := range got {
		if name != naiveLoop && o.refused >= naive.refused {
			t.Errorf("%s refused %d times, the naive loop %d", name, o.refused, naive.refused)
		}
		if o.took != naive.took {
			t.Errorf("%s took %v, the naive loop %v", name, o.took, naive.took)
		}
	}
}

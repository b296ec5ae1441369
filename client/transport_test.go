package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

const url = "http://api.test/"

// send sends a request of method to url through rt under ctx, and returns
// the response with how long (bubble time) it took.
func send(t *testing.T, ctx context.Context, rt http.RoundTripper, method string, body io.Reader) (*http.Response, time.Duration) {
	t.Helper()
	return sendOn(t, &env{}, ctx, rt, method, body)
}

// sendOn is send, timed on e's clock.
func sendOn(t *testing.T, e *env, ctx context.Context, rt http.RoundTripper, method string, body io.Reader) (*http.Response, time.Duration) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	start := e.now()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return resp, e.now().Sub(start)
}

func checkSeen(t *testing.T, s *server, want ...int) {
	t.Helper()
	if got := s.seen(); !slices.Equal(got, want) {
		t.Errorf("the server answered %v, want %v", got, want)
	}
}

// A limit of 2 per 10 s: the third GET is refused with Retry-After 10,
// and the Transport waits exactly that long and is admitted, on the
// memory store and on Redis.
func TestTransportWaitsForRetryAfter(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		srv := limited(t, 2, 10*time.Second, e.opts...)
		tr := e.transport(&Transport{Base: srv})
		var took time.Duration
		for range 3 {
			var resp *http.Response
			resp, took = sendOn(t, e, t.Context(), tr, "GET", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200 after the wait", resp.StatusCode)
			}
		}
		if took != 10*time.Second {
			t.Errorf("the third GET took %v, want the Retry-After of 10s", took)
		}
		checkSeen(t, srv, 200, 200, 429, 200)
	})
}

// With Pace, the 200 that spent the last unit (r=0;t=10) holds the next
// request until the quota is back: the server refuses nothing.
func TestTransportPaceSendsNoRequestToBeRefused(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		srv := limited(t, 2, 10*time.Second, e.opts...)
		tr := e.transport(&Transport{Base: srv, Pace: true})
		var took time.Duration
		for range 3 {
			_, took = sendOn(t, e, t.Context(), tr, "GET", nil)
		}
		if took != 10*time.Second {
			t.Errorf("the third GET took %v, want a hold of 10s", took)
		}
		checkSeen(t, srv, 200, 200, 200)
	})
}

// A wait that would end after the request's deadline is not started: the
// 429 comes back at once.
func TestTransportReturnsAtOnceWhenTheWaitPassesTheDeadline(t *testing.T) {
	for _, pace := range []bool{false, true} {
		t.Run(fmt.Sprintf("pace=%v", pace), func(t *testing.T) {
			forBackends(t, func(t *testing.T, e *env) {
				srv := limited(t, 1, 10*time.Second, e.opts...)
				tr := e.transport(&Transport{Base: srv, Pace: pace})
				sendOn(t, e, t.Context(), tr, "GET", nil)
				// A deadline at the very end of the wait: the retry would be
				// sent with a context already done.
				ctx, cancel := context.WithDeadline(t.Context(), e.now().Add(10*time.Second))
				defer cancel()
				resp, took := sendOn(t, e, ctx, tr, "GET", nil)
				if resp.StatusCode != http.StatusTooManyRequests || took != 0 {
					t.Errorf("status %d after %v, want 429 at once", resp.StatusCode, took)
				}
				if got := resp.Header.Get("Retry-After"); got != "10" {
					t.Errorf("Retry-After %q, want the server's 10", got)
				}
				checkSeen(t, srv, 200, 429)
			})
		})
	}
}

// A context cancelled during the wait gets the last response, body and
// all, when it is cancelled.
func TestTransportCancelledDuringTheWaitReturnsTheResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 1, 10*time.Second)
		tr := &Transport{Base: srv}
		send(t, t.Context(), tr, "GET", nil)
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			time.Sleep(3 * time.Second)
			cancel()
		}()
		resp, took := send(t, ctx, tr, "GET", nil)
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusTooManyRequests || took != 3*time.Second {
			t.Errorf("status %d after %v, want 429 at the cancellation, 3s", resp.StatusCode, took)
		}
		if !strings.Contains(string(body), `"violated-policies":["api"]`) {
			t.Errorf("body %q, want ceiling's problem body", body)
		}
		checkSeen(t, srv, 200, 429)
	})
}

// Only requests that are safe to repeat are sent again.
func TestTransportRetriesOnlyIdempotentRequests(t *testing.T) {
	for _, c := range []struct {
		name      string
		method    string
		header    string
		anyMethod bool
		want      []int
	}{
		{"GET", "GET", "", false, []int{200, 429, 200}},
		{"PUT", "PUT", "", false, []int{200, 429, 200}},
		{"DELETE", "DELETE", "", false, []int{200, 429, 200}},
		{"POST", "POST", "", false, []int{200, 429}},
		{"PATCH", "PATCH", "", false, []int{200, 429}},
		{"POST with Idempotency-Key", "POST", "Idempotency-Key", false, []int{200, 429, 200}},
		{"POST with X-Idempotency-Key", "POST", "X-Idempotency-Key", false, []int{200, 429, 200}},
		{"POST with RetryAnyMethod", "POST", "", true, []int{200, 429, 200}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := limited(t, 1, 10*time.Second)
				tr := &Transport{Base: srv, RetryAnyMethod: c.anyMethod}
				send(t, t.Context(), tr, "GET", nil)
				req, _ := http.NewRequestWithContext(t.Context(), c.method, url, nil)
				if c.header != "" {
					req.Header[c.header] = nil // net/http's rule: present, even empty
				}
				if _, err := tr.RoundTrip(req); err != nil {
					t.Fatal(err)
				}
				checkSeen(t, srv, c.want...)
			})
		})
	}
}

// A body is sent again only when GetBody can produce it again, and then
// the server sees the same bytes each time.
func TestTransportReplaysBodiesOnlyThroughGetBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 1, 10*time.Second)
		tr := &Transport{Base: srv}
		send(t, t.Context(), tr, "GET", nil)
		send(t, t.Context(), tr, "PUT", strings.NewReader("payload")) // NewRequest sets GetBody
		req, _ := http.NewRequestWithContext(t.Context(), "PUT", url, nil)
		req.Body = io.NopCloser(strings.NewReader("stream")) // no GetBody: cannot be read twice
		time.Sleep(10 * time.Second)                         // the PUT's unit goes back
		send(t, t.Context(), tr, "GET", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("the streamed PUT got %d, want the 429 returned as it came", resp.StatusCode)
		}
		checkSeen(t, srv, 200, 429, 200, 200, 429)
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if got, want := srv.bodies, []string{"", "payload", "payload", "", "stream"}; !slices.Equal(got, want) {
			t.Errorf("bodies %q, want %q", got, want)
		}
	})
}

// stub answers 429 with header h (each "Name: value") to the first
// refusals requests, then 200.
func stub(refusals int, h ...string) *server {
	var mu sync.Mutex
	n := 0
	return &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		refuse := n <= refusals
		mu.Unlock()
		if !refuse {
			return
		}
		for _, kv := range h {
			k, v, _ := strings.Cut(kv, ": ")
			w.Header().Add(k, v)
		}
		w.WriteHeader(http.StatusTooManyRequests)
	})}
}

// At most MaxRetries retries: 3 by default, none for a negative value.
func TestTransportBoundsRetries(t *testing.T) {
	for _, c := range []struct {
		max, sends int
	}{{0, 4}, {1, 2}, {5, 6}, {-1, 1}} {
		t.Run(fmt.Sprintf("MaxRetries=%d", c.max), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := stub(100, "Retry-After: 1")
				resp, took := send(t, t.Context(), &Transport{Base: srv, MaxRetries: c.max}, "GET", nil)
				if got := len(srv.seen()); got != c.sends || resp.StatusCode != 429 {
					t.Errorf("%d sends ending in %d, want %d ending in the server's 429", got, resp.StatusCode, c.sends)
				}
				if want := time.Duration(c.sends-1) * time.Second; took != want {
					t.Errorf("took %v, want %v", took, want)
				}
			})
		})
	}
}

// A wait above MaxWait (one minute by default) is not started.
func TestTransportBoundsTheWait(t *testing.T) {
	for _, c := range []struct {
		maxWait time.Duration
		after   string
		sends   int
	}{
		{0, "60", 2}, {0, "61", 1}, {2 * time.Minute, "61", 2}, {time.Second, "2", 1},
		{0, "99999999999999999999999", 1}, // saturates, never overflows into a negative wait
	} {
		t.Run(fmt.Sprintf("MaxWait=%v Retry-After=%s", c.maxWait, c.after), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := stub(1, "Retry-After: "+c.after)
				send(t, t.Context(), &Transport{Base: srv, MaxWait: c.maxWait}, "GET", nil)
				if got := len(srv.seen()); got != c.sends {
					t.Errorf("%d sends, want %d", got, c.sends)
				}
			})
		})
	}
}

// The wait comes from Retry-After in either form, else from RateLimit's
// t; a 429 that names no usable wait is returned as it came.
func TestTransportReadsTheWait(t *testing.T) {
	for _, c := range []struct {
		name   string
		header func(now time.Time) []string
		wait   time.Duration // -1: not retried
	}{
		{"delta-seconds", func(time.Time) []string { return []string{"Retry-After: 7"} }, 7 * time.Second},
		{"HTTP-date", func(now time.Time) []string {
			return []string{"Retry-After: " + now.Add(7*time.Second).UTC().Format(http.TimeFormat)}
		}, 7 * time.Second},
		{"past HTTP-date", func(now time.Time) []string {
			return []string{"Retry-After: " + now.Add(-time.Hour).UTC().Format(http.TimeFormat)}
		}, 0},
		{"RateLimit t", func(time.Time) []string { return []string{`RateLimit: "api";r=0;t=4`} }, 4 * time.Second},
		{"garbage Retry-After, RateLimit t", func(time.Time) []string {
			return []string{"Retry-After: soon", `RateLimit: "api";r=0;t=2`}
		}, 2 * time.Second},
		{"Retry-After before RateLimit", func(time.Time) []string {
			return []string{"Retry-After: 3", `RateLimit: "api";r=0;t=9`}
		}, 3 * time.Second},
		{"no wait", func(time.Time) []string { return nil }, -1},
		{"RateLimit with units left", func(time.Time) []string { return []string{`RateLimit: "api";r=3;t=0`} }, -1},
		{"negative", func(time.Time) []string { return []string{"Retry-After: -5", `RateLimit: "api";r=0;t=-5`} }, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := stub(1, c.header(time.Now())...)
				resp, took := send(t, t.Context(), &Transport{Base: srv}, "GET", nil)
				if c.wait < 0 {
					if resp.StatusCode != 429 || len(srv.seen()) != 1 {
						t.Errorf("status %d after %d sends, want the 429 returned", resp.StatusCode, len(srv.seen()))
					}
					return
				}
				if resp.StatusCode != 200 || took != c.wait {
					t.Errorf("status %d after %v, want 200 after %v", resp.StatusCode, took, c.wait)
				}
			})
		})
	}
}

// A 503 with Retry-After, as ceiling sends when it fails closed, is waited
// out like a 429.
func TestTransportWaitsOut503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n++; n == 1 {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		})}
		resp, took := send(t, t.Context(), &Transport{Base: srv}, "GET", nil)
		if resp.StatusCode != 200 || took != 2*time.Second {
			t.Errorf("status %d after %v, want 200 after 2s", resp.StatusCode, took)
		}
	})
}

// Pace's memory is per host, forgets a host whose quota is back, and
// holds at most maxHosts hosts, dropping ended holds first, then the one
// that ends first.
func TestTransportPaceMemoryIsBounded(t *testing.T) {
	var tr Transport
	now := time.Unix(1_700_000_000, 0)
	tr.remember("ended.test", now, time.Second, 0, 0)
	now = now.Add(2 * time.Second)
	for i := range maxHosts - 1 {
		tr.remember(fmt.Sprintf("h%d.test", i), now, time.Duration(i+10)*time.Second, 0, 0)
	}
	tr.remember("new.test", now, time.Minute, 0, 0)
	if _, ok := tr.hosts["ended.test"]; ok || len(tr.hosts) != maxHosts {
		t.Fatalf("%d hosts, ended.test kept %v; want %d and the ended hold dropped", len(tr.hosts), ok, maxHosts)
	}
	tr.remember("newer.test", now, time.Minute, 0, 0)
	if _, ok := tr.hosts["h0.test"]; ok || len(tr.hosts) != maxHosts {
		t.Errorf("%d hosts, h0.test (ends first) kept %v; want %d and it dropped", len(tr.hosts), ok, maxHosts)
	}
	for _, h := range []string{"new.test", "newer.test"} {
		if _, ok := tr.hosts[h]; !ok {
			t.Errorf("%s dropped", h)
		}
	}
	tr.remember("new.test", now, 0, 0, 0)
	if _, ok := tr.hosts["new.test"]; ok {
		t.Error("a host whose quota is back is still held")
	}
}

// Pace holds only the host that said r=0, and a later response with units
// left ends the hold.
func TestTransportPaceIsPerHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		remaining := map[string]string{"a.test": "0", "b.test": "5"}
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit", `"api";r=`+remaining[r.Host]+`;t=30`)
		})}
		tr := &Transport{Base: srv, Pace: true}
		get := func(host string) time.Duration {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+host+"/", nil)
			start := time.Now()
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		get("a.test")
		if took := get("b.test"); took != 0 {
			t.Errorf("b.test held %v by a.test's quota", took)
		}
		if took := get("A.TEST"); took != 30*time.Second {
			t.Errorf("a.test held %v, want 30s", took)
		}
		remaining["a.test"] = "1"
		get("a.test") // held again, then says r=1
		if took := get("a.test"); took != 0 {
			t.Errorf("a.test held %v after a response with units left", took)
		}
	})
}

// Over real loopback sockets (outside any bubble): a refused PUT whose
// Retry-After is a past HTTP-date is sent again at once with its body,
// and ceiling's own 429 with a wait past the deadline comes back at once.
func TestTransportOverLoopback(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	n := 0
	replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(b))
		if n++; n == 1 {
			w.Header().Set("Retry-After", "Fri, 31 Dec 1999 23:59:59 GMT")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer replay.Close()
	tr := &Transport{Base: replay.Client().Transport}
	req, _ := http.NewRequest("PUT", replay.URL, strings.NewReader("payload"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !slices.Equal(bodies, []string{"payload", "payload"}) {
		t.Errorf("status %d, bodies %q; want 200 after a replay of the body", resp.StatusCode, bodies)
	}

	l := ceiling.MustNew([]ceiling.Rule{{Name: "api", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Hour}}, ceiling.WithKeySecret(secret))
	defer l.Close()
	api := httptest.NewServer(l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer api.Close()
	tr = &Transport{Base: api.Client().Transport, MaxWait: 2 * time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var codes []int
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if !slices.Equal(codes, []int{200, 429}) || ctx.Err() != nil {
		t.Errorf("statuses %v (context %v), want [200 429] before the deadline", codes, ctx.Err())
	}
}

// ceiling refuses a request that costs more than the quota can ever admit
// with neither Retry-After nor a RateLimit member: there is nothing to
// wait for, so the 429 is returned at once, and Pace holds nothing.
func TestTransportDoesNotRetryWhatCanNeverFit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := ceiling.New([]ceiling.Rule{{
			Name: "api", Key: ceiling.Static("all"), Limit: 5, Period: 10 * time.Second, Algorithm: ceiling.SlidingLog,
			Estimate: func(*http.Request) (int64, error) { return 10, nil },
		}}, ceiling.WithKeySecret(secret))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		srv := &server{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
		tr := &Transport{Base: srv, Pace: true}
		for i := range 2 {
			resp, took := send(t, t.Context(), tr, "GET", nil)
			if resp.StatusCode != 429 || took != 0 || resp.Header.Get("Retry-After") != "" {
				t.Errorf("request %d: status %d after %v, Retry-After %q; want ceiling's 429 without one, at once",
					i, resp.StatusCode, took, resp.Header.Get("Retry-After"))
			}
		}
		checkSeen(t, srv, 429, 429)
	})
}

// A refusal whose body is too large to keep across the wait is returned
// as it came, every byte still readable: a caller whose context ended
// during the wait could not have been given it whole.
func TestTransportReturnsALargeRefusalAsItCame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("x", maxBuffered+1)
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, big)
		})}
		resp, _ := send(t, t.Context(), &Transport{Base: srv}, "GET", nil)
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != big || resp.Body.Close() != nil {
			t.Errorf("read %d bytes (%v), want all %d", len(body), err, len(big))
		}
		checkSeen(t, srv, 429)
	})
}

// An http.Client's Timeout is a deadline on the request's context: a wait
// past it is not started either.
func TestTransportHonoursClientTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := stub(2, "Retry-After: 10")
		c := &http.Client{Transport: &Transport{Base: srv}, Timeout: 5 * time.Second}
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 429 || time.Since(start) != 0 {
			t.Errorf("status %d after %v, want the 429 at once", resp.StatusCode, time.Since(start))
		}
		c.Timeout = 11 * time.Second
		start = time.Now()
		resp, err = c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || time.Since(start) != 10*time.Second {
			t.Errorf("status %d after %v, want 200 after the wait of 10s", resp.StatusCode, time.Since(start))
		}
	})
}

// A Base that returns a refusal with a nil Body (which the RoundTripper
// contract forbids) does not make the Transport panic.
func TestTransportSurvivesANilBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		base := roundTripper(func(req *http.Request) (*http.Response, error) {
			if n++; n == 1 {
				return &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"1"}}, Request: req}, nil
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
		})
		resp, _ := send(t, t.Context(), &Transport{Base: base}, "GET", nil)
		if resp.StatusCode != 200 || n != 2 {
			t.Errorf("status %d after %d sends, want 200 after 2", resp.StatusCode, n)
		}
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// flaky is a memory store that fails while down is set, as a backend
// that cannot be reached.
type flaky struct {
	m    *memory.Store // not embedded: its InProcess and DecideInto would bypass Decide
	down atomic.Bool
}

func (f *flaky) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if f.down.Load() {
		return nil, fmt.Errorf("%w: connection refused", backend.ErrUnreachable)
	}
	return f.m.Decide(ctx, reqs)
}

func (f *flaky) Reset(ctx context.Context, keys ...string) error { return f.m.Reset(ctx, keys...) }

// DeadlineBound: it never blocks, so the limiter calls it inline, inside
// the test's bubble.
func (f *flaky) DeadlineBound() bool { return true }

// ceiling failing closed answers 503 with a Retry-After while its backend
// is down; the Transport waits that out and is admitted once the backend
// is back.
func TestTransportWaitsOutCeilingFailingClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flaky{m: memory.New()}
		defer store.m.Close()
		l, err := ceiling.New([]ceiling.Rule{{
			Name: "api", Key: ceiling.Static("all"), Limit: 5, Period: 10 * time.Second, Algorithm: ceiling.SlidingLog,
		}}, ceiling.WithBackend(store), ceiling.WithFailMode(ceiling.FailClosed), ceiling.WithKeySecret(secret),
			ceiling.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		srv := &server{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
		store.down.Store(true)
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			time.Sleep(500 * time.Millisecond)
			store.down.Store(false)
		})
		resp, took := send(t, t.Context(), &Transport{Base: srv}, "GET", nil)
		if resp.StatusCode != 200 || took < time.Second {
			t.Errorf("status %d after %v, want 200 after the 503's Retry-After (at least 1s)", resp.StatusCode, took)
		}
		checkSeen(t, srv, 503, 200)
	})
}

// A retry that fails in the network returns that error, and closes the
// refusal it was retrying.
func TestTransportReturnsTheRetrysError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errDown := errors.New("connection refused")
		n := 0
		base := roundTripper(func(req *http.Request) (*http.Response, error) {
			if n++; n == 1 {
				return &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"1"}}, Body: http.NoBody, Request: req}, nil
			}
			return nil, errDown
		})
		req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
		resp, err := (&Transport{Base: base}).RoundTrip(req)
		if !errors.Is(err, errDown) || resp != nil || n != 2 {
			t.Errorf("RoundTrip = %v, %v after %d sends; want the retry's error after 2", resp, err, n)
		}
	})
}

// A body whose GetBody fails is not sent again: the refusal is returned.
func TestTransportKeepsTheRefusalWhenGetBodyFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := stub(1, "Retry-After: 1")
		req, _ := http.NewRequestWithContext(t.Context(), "PUT", url, strings.NewReader("payload"))
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("spooled file gone") }
		resp, err := (&Transport{Base: srv}).RoundTrip(req)
		if err != nil || resp.StatusCode != 429 {
			t.Errorf("RoundTrip = %v, %v; want the 429", resp, err)
		}
		checkSeen(t, srv, 429)
	})
}

// closeCounter counts the Close calls of a request body.
type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

// A request whose context ends during Pace's hold is not sent: the caller
// gets the context's error, and the body is closed as a RoundTripper must.
func TestTransportPaceHoldEndsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit", `"api";r=0;t=30`)
		})}
		tr := &Transport{Base: srv, Pace: true}
		send(t, t.Context(), tr, "GET", nil)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(3*time.Second, cancel)
		body := &closeCounter{Reader: strings.NewReader("payload")}
		req, _ := http.NewRequestWithContext(ctx, "PUT", url, body)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) || resp != nil || time.Since(start) != 3*time.Second {
			t.Errorf("RoundTrip = %v, %v after %v; want context.Canceled at 3s", resp, err, time.Since(start))
		}
		if body.closed != 1 {
			t.Errorf("body closed %d times, want 1", body.closed)
		}
		checkSeen(t, srv, 200)
	})
}

// A request that finds the release after a hold spent waits for the next
// reset only while that stays within MaxWait of its first wait: held past
// it, it is sent, and the server decides.
func TestTransportPaceHoldsNoLongerThanMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit-Policy", `"api";q=1;w=10`)
			w.Header().Set("RateLimit", `"api";r=0;t=10`)
		})}
		tr := &Transport{Base: srv, Pace: true, MaxWait: 15 * time.Second}
		send(t, t.Context(), tr, "GET", nil)
		var took [2]time.Duration
		var wg sync.WaitGroup
		for i := range took {
			wg.Go(func() { _, took[i] = send(t, t.Context(), tr, "GET", nil) })
		}
		wg.Wait()
		slices.Sort(took[:])
		// The first goes at the reset with the quota's one unit; the
		// second would wait for the next reset, 20s after it was held.
		if took != [2]time.Duration{10 * time.Second, 10 * time.Second} {
			t.Errorf("held %v, want both sent at 10s (the second at MaxWait's bound, not the reset at 20s)", took)
		}
	})
}

// After a hold, a response that reports fewer units than the policy's q
// (another client shares the quota) bounds what the hold still releases:
// of two requests sent then, one goes and one waits for the next reset,
// and the server refuses neither.
func TestTransportPaceReleasesNoMoreThanTheResponseReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 5, 10*time.Second)
		tr := &Transport{Base: srv, Pace: true}
		for range 5 {
			send(t, t.Context(), tr, "GET", nil)
		}
		time.Sleep(10 * time.Second)
		for range 3 { // the other client
			send(t, t.Context(), &Transport{Base: srv}, "GET", nil)
		}
		if _, took := send(t, t.Context(), tr, "GET", nil); took != 0 {
			t.Fatalf("held %v at the reset", took) // this response says r=1
		}
		// Each answer takes a millisecond, so that both requests have
		// left the hold before either is answered.
		tr.Base = delayed{srv, time.Millisecond}
		var took [2]time.Duration
		var wg sync.WaitGroup
		for i := range took {
			wg.Go(func() { _, took[i] = send(t, t.Context(), tr, "GET", nil) })
		}
		wg.Wait()
		slices.Sort(took[:])
		if took[0] != time.Millisecond || took[1] < 10*time.Second {
			t.Errorf("held %v, want one sent at once and one at the next reset", took)
		}
		if n := srv.rejected(); n != 0 {
			t.Errorf("%d refusals: %v", n, srv.seen())
		}
	})
}

// Under Pace a retry after a refusal's wait takes its place among the
// held requests: of two refused on a quota of 1 per 10 s, one is sent
// again at the reset and the other's turn is the next one. When that turn
// is past its deadline, or its context ends while it waits, its caller
// gets the refusal, and the server is not asked again.
func TestTransportPaceHoldsRetries(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
	}{
		{"deadline", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 15*time.Second)
		}},
		{"cancelled", func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(15*time.Second, cancel)
			return ctx, cancel
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := limited(t, 1, 10*time.Second)
				// A millisecond per answer: the three are all in flight
				// when the quota runs out.
				tr := &Transport{Base: delayed{srv, time.Millisecond}, Pace: true}
				ctx, cancel := c.ctx(t.Context())
				defer cancel()
				var codes [3]int
				var wg sync.WaitGroup
				for i := range codes {
					wg.Go(func() {
						req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
						resp, err := tr.RoundTrip(req)
						if err != nil {
							t.Errorf("RoundTrip: %v", err)
							return
						}
						resp.Body.Close()
						codes[i] = resp.StatusCode
					})
				}
				wg.Wait()
				slices.Sort(codes[:])
				if codes != [3]int{200, 200, 429} {
					t.Errorf("callers got %v, want two 200s and the 429 of the one that could not wait", codes)
				}
				if n := srv.rejected(); n != 2 {
					t.Errorf("the server answered %v, want the first window's two refusals only", srv.seen())
				}
			})
		})
	}
}

// A response with units left that was decided before the one that spent
// the quota, but arrives after it, does not end the hold: the next
// request still waits for the reset instead of being refused.
func TestTransportPaceKeepsTheHoldAgainstAnOlderAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 2, 10*time.Second)
		tr := &Transport{Base: lateAnswers{srv}, Pace: true}
		var wg sync.WaitGroup
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
			req.Header.Set("Late", "1")
			if resp, err := tr.RoundTrip(req); err != nil {
				t.Error(err)
			} else {
				resp.Body.Close()
			}
		})
		synctest.Wait()                      // decided (r=1), and on its way
		send(t, t.Context(), tr, "GET", nil) // r=0;t=10
		wg.Wait()                            // the r=1 arrives
		// Sent at 1ms, held until the reset at 10s.
		want := 10*time.Second - time.Millisecond
		if _, took := send(t, t.Context(), tr, "GET", nil); took != want {
			t.Errorf("held %v, want %v", took, want)
		}
		checkSeen(t, srv, 200, 200, 200)
	})
}

// lateAnswers is a Base that delivers the answer to a request with a Late
// header a millisecond after the server decided it.
type lateAnswers struct{ http.RoundTripper }

func (b lateAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.RoundTripper.RoundTrip(req)
	if req.Header.Get("Late") != "" {
		time.Sleep(time.Millisecond)
	}
	return resp, err
}

// delayed is a Base whose every answer takes d.
type delayed struct {
	http.RoundTripper
	d time.Duration
}

func (b delayed) RoundTrip(req *http.Request) (*http.Response, error) {
	time.Sleep(b.d)
	return b.RoundTripper.RoundTrip(req)
}

package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Over loopback: refusals with a small body and a short wait are retried
// on one kept-alive connection, and neither cancelled waits nor retries
// leave goroutines or connections behind.
func TestTransportReusesConnectionsAndLeaksNothing_Attack(t *testing.T) {
	var mu sync.Mutex
	conns := map[net.Conn]http.ConnState{}
	n := 0
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		refuse := n%3 != 0
		mu.Unlock()
		if refuse {
			w.Header().Set("Retry-After", "0")
			w.Header().Set("RateLimit", `"api";r=0;t=0`)
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"title":"Too Many Requests"}`))
		}
	}))
	ts.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		conns[c] = s
		mu.Unlock()
	}
	ts.Start()
	defer ts.Close()
	base := ts.Client().Transport.(*http.Transport)
	before := runtime.NumGoroutine()
	tr := &Transport{Base: base, Pace: true}
	for range 30 {
		req, _ := http.NewRequest("GET", ts.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	// Waits cut short by the context.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer slow.Close()
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", slow.URL, nil)
		time.AfterFunc(5*time.Millisecond, cancel)
		resp, err := (&Transport{Base: base}).RoundTrip(req)
		if errors.Is(err, context.Canceled) {
			cancel()
			continue // cancelled before the 503 came: nothing to wait out
		}
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the 503", resp.StatusCode)
		}
		cancel()
	}
	mu.Lock()
	if len(conns) != 1 {
		t.Errorf("%d connections for 30 GETs and their retries, want 1", len(conns))
	}
	mu.Unlock()
	base.CloseIdleConnections()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling until net/http's connection goroutines exit
	}
	if g := runtime.NumGoroutine(); g > before+2 {
		t.Errorf("%d goroutines, %d before", g, before)
	}
}

// idleCloser is a Base that counts CloseIdleConnections calls.
type idleCloser struct {
	http.RoundTripper
	closes int
}

func (c *idleCloser) CloseIdleConnections() { c.closes++ }

// http.Client.CloseIdleConnections reaches Base through the Transport: a
// client that wraps http.DefaultTransport can still drop its idle
// connections.
func TestTransportForwardsCloseIdleConnections_Regression(t *testing.T) {
	base := &idleCloser{RoundTripper: http.DefaultTransport}
	c := &http.Client{Transport: &Transport{Base: base}}
	c.CloseIdleConnections()
	if base.closes != 1 {
		t.Errorf("Base's CloseIdleConnections called %d times, want 1", base.closes)
	}
}

// Many goroutines share one Pace Transport on ceiling's middleware: every
// request ends admitted, within the limit the server keeps.
func TestTransportConcurrentPace_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 5, 10*time.Second)
		tr := &Transport{Base: srv, Pace: true, MaxRetries: 100, MaxWait: time.Hour}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("status %d", resp.StatusCode)
					}
				}
			})
		}
		wg.Wait()
		ok := 0
		for _, c := range srv.seen() {
			if c == 200 {
				ok++
			}
		}
		if ok != 40 {
			t.Errorf("%d admitted, want 40", ok)
		}
		t.Logf("%d refusals for 40 requests", srv.rejected())
	})
}

// Pace's memory is per host, whichever way a URL spells it: the default
// port and the case of the host name do not make another host.
func TestTransportPaceHostSpellings_Regression(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit", `"api";r=0;t=30`)
		})}
		tr := &Transport{Base: srv, Pace: true}
		get := func(u string) time.Duration {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", u, nil)
			start := time.Now()
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		for _, c := range [][2]string{
			{"http://api.test/", "http://API.test:80/x"},
			{"https://b.test:443/", "https://b.test/"},
		} {
			get(c[0])
			if took := get(c[1]); took != 30*time.Second {
				t.Errorf("%s after %s: held %v, want 30s", c[1], c[0], took)
			}
		}
		get("http://c.test/")
		if took := get("http://c.test:8080/"); took != 0 {
			t.Errorf("another port held %v", took)
		}
		get("https://d.test:80/")
		if took := get("https://d.test/"); took != 0 {
			t.Errorf("https on port 80 held %v as https's default port", took)
		}
	})
}

// A request without a URL is Base's error to report, not a panic.
func TestTransportNilURL_Regression(t *testing.T) {
	for _, pace := range []bool{false, true} {
		resp, err := (&Transport{Pace: pace}).RoundTrip(&http.Request{Method: "GET", Header: http.Header{}})
		if err == nil {
			resp.Body.Close()
			t.Errorf("pace=%v: a request without a URL was sent", pace)
		}
	}
}

// A refusal whose connection is reset mid-body is returned at once as it
// came (its body ends in the read error), not retried on a lost answer
// and not hung on.
func TestTransportRefusalResetMidBody_Attack(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\nContent-Length: 100\r\n\r\npartial")
		buf.Flush()
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}))
	defer ts.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL, nil)
	start := time.Now()
	resp, err := (&Transport{Base: ts.Client().Transport}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	if took := time.Since(start); resp.StatusCode != 429 || string(b) != "partial" || rerr == nil || took > 2*time.Second {
		t.Errorf("status %d, body %q, read error %v, after %v; want the 429's partial body and its error, at once", resp.StatusCode, b, rerr, took)
	}
}

// Requests held by Pace are not released all together when the hold ends:
// with more goroutines than the quota's units, each reset lets through no
// more than the policy's q, and the rest wait for the next one. Only
// requests sent before the transport saw the quota run out are refused:
// all of them in the first window, at most one per worker (a worker whose
// first request was admitted may send its second before another worker's
// response said r=0, so the first window may refuse more than 8-5).
func TestTransportPaceReleasesHeldRequestsTogether_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := limited(t, 5, 10*time.Second)
		tr := &Transport{Base: srv, Pace: true, MaxRetries: 100, MaxWait: time.Hour}
		start := time.Now()
		var mu sync.Mutex
		var late []time.Duration // when refusals after the first window came
		// Every refusal the server answered is counted where it was
		// answered: srv's RoundTrip runs inside the bubble, whose clock
		// stands still while any goroutine can run.
		srv.onRefusal = func() {
			if at := time.Since(start); at > 0 {
				mu.Lock()
				late = append(late, at)
				mu.Unlock()
			}
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
				}
			})
		}
		wg.Wait()
		if n := srv.rejected(); n > 8 {
			t.Errorf("%d refusals for 40 requests by 8 workers, want at most one per worker", n)
		}
		if len(late) > 0 {
			t.Errorf("refusals after the first window, at %v: a release sent more than the quota", late)
		}
		if ok := len(srv.seen()) - srv.rejected(); ok != 40 {
			t.Errorf("%d admitted, want 40", ok)
		}
	})
}

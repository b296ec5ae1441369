package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingCloser is a request body that counts its Close calls.
type countingCloser struct {
	io.Reader
	closed *atomic.Int32
}

func (c countingCloser) Close() error { c.closed.Add(1); return nil }

// A body GetBody opened for a retry that is never sent (the context ended
// during the wait, or the refusal was too large to keep) is closed: a
// GetBody that opens a file must not leak its descriptor.
func TestTransportClosesTheUnsentRetryBody_Regression(t *testing.T) {
	for _, large := range []bool{false, true} {
		srv := &server{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			if large {
				w.Write(make([]byte, maxBuffered+1))
			}
		})}
		var opened, closed atomic.Int32
		ctx, cancel := context.WithCancel(t.Context())
		tr := &Transport{Base: srv, sleep: func(context.Context, time.Duration) error {
			cancel()
			return context.Canceled
		}}
		req, _ := http.NewRequestWithContext(ctx, "PUT", url, countingCloser{strings.NewReader("x"), &closed})
		req.GetBody = func() (io.ReadCloser, error) {
			opened.Add(1)
			return countingCloser{strings.NewReader("x"), &closed}, nil
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if o, c := opened.Load(), closed.Load(); o != 1 || c != o+1 {
			t.Errorf("large=%v: GetBody opened %d bodies, %d of %d bodies closed", large, o, c, o+1)
		}
		cancel()
	}
}

// A 429 whose body stalls after the headers: the Transport must not hang
// past the wait the server named reading a body it only keeps.
func TestTransportStalledRefusalBody_Regression(t *testing.T) {
	release := make(chan struct{})
	n := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		if n > 1 {
			return
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	tr := &Transport{Base: ts.Client().Transport}
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL, nil)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	t.Logf("status %d after %v", resp.StatusCode, took)
	if took > 2*time.Second {
		t.Errorf("RoundTrip took %v on a stalled refusal body with Retry-After 0", took)
	}
}

// A parameter whose string value holds semicolons (a proxy's or a future
// draft's) is one parameter: it neither hides the member's own r and t
// nor lends it an r or a t of its own.
func TestRateLimitQuotedParameter_Regression(t *testing.T) {
	for _, c := range []struct {
		in        string
		exhausted time.Duration // -1: no member with r=0 and t
	}{
		{`"a";r=0;t=5;note="x;t=1"`, 5 * time.Second},
		{`"a";r=5;t=0;note="q;r=0;t=50;y="`, -1},
		{`"a";note="\";r=0;t=9;";r=2;t=0`, -1},
	} {
		q := parseRateLimit([]string{c.in})
		got := time.Duration(-1)
		if q.exhausted {
			got = q.exhaustedWait
		}
		if got != c.exhausted {
			t.Errorf("RateLimit %q: wait %v, want %v", c.in, got, c.exhausted)
		}
	}
}

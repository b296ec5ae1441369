package client

import (
	"math"
	"net/http"
	"testing"
	"time"
)

func response(code int, h ...string) *http.Response {
	resp := &http.Response{StatusCode: code, Header: http.Header{}}
	for i := 0; i+1 < len(h); i += 2 {
		resp.Header.Add(h[i], h[i+1])
	}
	return resp
}

func TestBackoff(t *testing.T) {
	const min, max = time.Second, 30 * time.Second
	for _, c := range []struct {
		name    string
		attempt int
		resp    *http.Response
		want    time.Duration
	}{
		{"429 Retry-After", 0, response(429, "Retry-After", "7"), 7 * time.Second},
		{"503 Retry-After", 3, response(503, "Retry-After", "7"), 7 * time.Second},
		{"Retry-After above max", 0, response(429, "Retry-After", "120"), 120 * time.Second},
		{"RateLimit t alone", 0, response(429, "RateLimit", `"api";r=0;t=12`), 12 * time.Second},
		{"Retry-After before RateLimit", 0, response(429, "Retry-After", "3", "RateLimit", `"api";r=0;t=12`), 3 * time.Second},
		{"429 without a wait", 2, response(429), 4 * time.Second},
		{"500 with Retry-After", 2, response(500, "Retry-After", "7"), 4 * time.Second},
		{"no response", 0, nil, time.Second},
		{"doubling", 3, nil, 8 * time.Second},
		{"capped", 5, nil, max},
		{"huge attempt", math.MaxInt, nil, max},
		{"negative attempt", -3, nil, min},
	} {
		if got := Backoff(min, max, c.attempt, c.resp); got != c.want {
			t.Errorf("%s: Backoff = %v, want %v", c.name, got, c.want)
		}
	}
	if got := Backoff(0, max, 10, nil); got != 0 {
		t.Errorf("Backoff from min 0 = %v, want 0", got)
	}
	if got := Backoff(-time.Second, max, 0, nil); got != 0 {
		t.Errorf("Backoff from a negative min = %v, want 0", got)
	}
	if got := Backoff(time.Duration(math.MaxInt64/2+1), math.MaxInt64, 4, nil); got != math.MaxInt64 {
		t.Errorf("Backoff past the longest Duration = %v, want max", got)
	}
}

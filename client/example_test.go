package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/client"
)

// A client of an API limited to one request per minute. The first request
// spends the quota (r=0); the second, with five seconds to live, would
// have to wait a minute, so the Transport neither holds it nor retries it:
// the server's 429 comes back at once, with the server's wait.
func ExampleTransport() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:      "api",
		Key:       ceiling.RemoteAddr,
		Limit:     1,
		Period:    time.Minute,
		Algorithm: ceiling.SlidingLog,
	}})
	defer limiter.Close()
	api := httptest.NewServer(limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer api.Close()

	c := &http.Client{Transport: &client.Transport{Pace: true}}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
		start := time.Now()
		resp, err := c.Do(req)
		cancel()
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%d %s retry-after=%q at once=%v\n", resp.StatusCode, resp.Header.Get("RateLimit"),
			resp.Header.Get("Retry-After"), time.Since(start) < time.Second)
	}
	// Output:
	// 200 "api";r=0;t=60 retry-after="" at once=true
	// 429 "api";r=0;t=60 retry-after="60" at once=true
}

// Backoff reads a response the way Transport does, in the shape of
// go-retryablehttp's Backoff (set it as retryablehttp.Client.Backoff).
// Without a wait from the server it doubles min up to max.
func ExampleBackoff() {
	refused := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{
		"Ratelimit": {`"api";r=0;t=42`},
	}}
	fmt.Println(client.Backoff(time.Second, 30*time.Second, 0, refused))
	refused.Header.Set("Retry-After", "7")
	fmt.Println(client.Backoff(time.Second, 30*time.Second, 0, refused))
	fmt.Println(client.Backoff(time.Second, 30*time.Second, 3, nil))
	fmt.Println(client.Backoff(time.Second, 30*time.Second, 9, nil))
	// Output:
	// 42s
	// 7s
	// 8s
	// 30s
}

package client

import (
	"net/http"
	"time"
)

// Backoff is how long to wait before attempt attemptNum+1 after resp, in
// the shape of github.com/hashicorp/go-retryablehttp's Backoff, so that a
// retryablehttp.Client can honour ceiling's headers:
//
//	c := retryablehttp.NewClient()
//	c.Backoff = client.Backoff
//
// For a 429 or 503 it reads the wait as [Transport] does: Retry-After
// (delta-seconds or an HTTP-date), else the RateLimit field's t. That wait
// is returned as the server gave it, even above max: retrying sooner is
// only rejected again (retryablehttp's DefaultBackoff does the same for
// Retry-After). For any other response, none, or a 429 or 503 that names
// no wait, it is min doubled attemptNum times, at most max.
func Backoff(min, max time.Duration, attemptNum int, resp *http.Response) time.Duration {
	if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if wait, ok := retryWait(resp.Header, time.Now()); ok {
			return wait
		}
	}
	wait := min
	for i := 0; i < attemptNum && wait < max; i++ {
		if wait <= 0 {
			break
		}
		wait *= 2
		if wait <= 0 { // overflowed
			return max
		}
	}
	if wait > max {
		wait = max
	}
	if wait < 0 {
		return 0
	}
	return wait
}

// Package client is the other half of ceiling's headers: an
// [http.RoundTripper] for Go clients of a rate-limited API that waits as
// long as the server asks, and no longer.
//
// On a 429 or 503, a [Transport] reads how long to wait from Retry-After
// (delta-seconds or an HTTP-date) or, without one, from the RateLimit
// field's t (draft-ietf-httpapi-ratelimit-headers-11, which ceiling sends),
// sleeps that long and sends the request again, a bounded number of times.
// It never sleeps past the request's context: when the wait would end
// after the context's deadline it returns the response at once. It sends a
// request again only when that is safe: an idempotent method (or a request
// the caller marked so), and a body that GetBody can replay.
//
// With Pace set, it also remembers, per host, a response that said r=0
// (the last unit is spent) and holds the next requests to that host until
// the quota's t has passed, then lets through no more of them than the
// quota holds, so that a client doing a fixed amount of work, from one
// goroutine or many, is rejected as few times as possible.
//
// [Backoff] is the same reading of a response as a
// github.com/hashicorp/go-retryablehttp Backoff function, for clients
// built on that package.
//
// The package uses only the standard library.
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Transport is an [http.RoundTripper] that honours a server's Retry-After
// and RateLimit fields: on a 429 Too Many Requests or 503 Service
// Unavailable that says how long to wait, it waits that long and sends the
// request again.
//
// A request is sent again only when
//   - its method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE), it
//     carries an Idempotency-Key or X-Idempotency-Key header (the rule
//     net/http's own Transport follows), or RetryAnyMethod is set;
//   - it has no body, or its GetBody returns a fresh copy (as
//     [http.NewRequest] sets for in-memory bodies);
//   - the response says how long to wait, that wait is at most MaxWait,
//     and it ends before the request context's deadline;
//   - fewer than MaxRetries retries were made;
//   - the refusal's body is at most 64 KiB, so that it can be kept whole
//     across the wait while its connection goes back to the pool. A body
//     still arriving when the wait is over (or after a second, for a
//     shorter wait) is given up and the request sent again: a stalled
//     body does not hold the request past the wait the server named.
//
// Otherwise the response is returned as the server sent it. When the
// request's context ends during a wait, the last response is returned,
// with its body intact: the server's answer, not a guess.
//
// The zero Transport is ready to use. A Transport is safe for simultaneous
// use by multiple goroutines, and must not be copied after first use.
type Transport struct {
	// Base sends each attempt; nil means [http.DefaultTransport].
	Base http.RoundTripper

	// MaxRetries is the most times one request is sent again; zero means
	// 3, and a negative value never sends again.
	MaxRetries int

	// MaxWait is the longest wait honoured; a response that asks for more
	// is returned at once. Zero or less means one minute.
	MaxWait time.Duration

	// RetryAnyMethod sends POST and PATCH requests again too. Set it only
	// for servers whose 429 and 503 guarantee that nothing was done, as
	// ceiling's do.
	RetryAnyMethod bool

	// Pace holds a request to a host whose last response said that a
	// quota has no units left (RateLimit r=0, or a 429 or 503 with a
	// wait) until that quota's t has passed. When that response's
	// RateLimit-Policy names the spent quota's q and w, the hold then
	// releases at most q requests, fewer when a later response's r says
	// fewer units are left, and the rest wait for the next reset, w
	// later (or the one a response names). Retries after a refusal take
	// their turn with the held requests. Without a policy, every held
	// request goes when the hold ends. Only requests in flight when the
	// quota ran out are refused. Each request waits in its caller's
	// goroutine.
	//
	// The memory is per host, not per policy, so a spent quota on one
	// path also holds requests for another path of the same host; and it
	// is bounded (1024 hosts, the holds that end soonest dropped first).
	// A hold that would end more than MaxWait after it began, or past the
	// request's deadline, is skipped and the request sent: the server
	// decides (a retry returns the refusal instead). A context that ends
	// during a hold ends the request with the context's error, unsent, or
	// a retry with the refusal.
	Pace bool

	mu    sync.Mutex
	hosts map[string]*spent

	// Tests of a server on a fake clock (Redis under WithClock, outside a
	// synctest bubble) read and pass time through these; nil means the
	// real clock and timers.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

const (
	defaultRetries = 3
	defaultMaxWait = time.Minute
	// maxHosts bounds the hosts Pace remembers.
	maxHosts = 1024
	// maxBuffered is the largest response body kept across a wait, so that
	// a wait cut short by the context can still return it.
	maxBuffered = 64 << 10
	// bodyGrace is how long a refusal's body may take to arrive when the
	// server's wait is shorter (Retry-After 0), before it is given up.
	bodyGrace = time.Second
)

// spent is what Pace remembers of one host's spent quota.
type spent struct {
	until time.Time // when the quota is back
	// With a policy (quota > 0), the hold releases at most left more
	// requests from until on; once they are gone, the next ones wait one
	// window more, for the reset after. Without one, every held request
	// goes at until, and the server decides.
	left   int64
	quota  int64
	window time.Duration
}

// RoundTrip sends req, waiting and sending it again as [Transport]
// describes. Like every RoundTripper it does not modify req: attempts after
// the first are clones with a body from GetBody.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		return t.base().RoundTrip(req) // its error, not a panic here
	}
	ctx := req.Context()
	host := hostKey(req)
	if t.Pace {
		if err := t.hold(ctx, host, t.clock()); err != nil && err != errHoldTooLong {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
	}
	resp, err := t.base().RoundTrip(req)
	for retries := 0; ; retries++ {
		if err != nil {
			return nil, err
		}
		wait, ok := t.observe(host, resp)
		if !ok || retries >= t.maxRetries() || !replayable(req, t.RetryAnyMethod) ||
			wait > t.maxWait() || passesDeadline(ctx, t.clock(), wait) {
			return resp, nil
		}
		next, bodyErr := again(req)
		if bodyErr != nil {
			return resp, nil // GetBody failed: the response is all there is
		}
		start := t.clock()
		kept, late := buffer(resp, max(wait, bodyGrace))
		if !kept && !late {
			closeBody(next)
			return resp, nil
		}
		// The wait runs from the refusal's arrival, so the time its body
		// took is part of it; a body still unread when the wait was over
		// was given up, and the retry's answer replaces it.
		if rest := wait - t.clock().Sub(start); !late && rest > 0 {
			if err := t.pause(ctx, rest); err != nil {
				closeBody(next)
				return resp, nil
			}
		}
		// Under Pace the retry takes its place among the held requests:
		// the wait ended at the quota's reset, with every request the
		// hold was keeping. One that cannot wait for its turn returns
		// the refusal, as a wait too long for the retry does.
		if t.Pace && t.hold(ctx, host, start) != nil {
			closeBody(next)
			return resp, nil
		}
		resp, err = t.base().RoundTrip(next)
	}
}

// hostKey is the host Pace remembers req's quota under: its URL's host
// and port, lower-cased, without the scheme's default port, so that
// http://api.test/ and http://API.test:80/ share one memory.
func hostKey(req *http.Request) string {
	u := req.URL
	host := strings.ToLower(u.Host)
	switch port := u.Port(); {
	case port == "80" && strings.EqualFold(u.Scheme, "http"),
		port == "443" && strings.EqualFold(u.Scheme, "https"):
		host = strings.TrimSuffix(host, ":"+port)
	}
	return host
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// CloseIdleConnections closes Base's idle connections when Base can, so
// that [http.Client.CloseIdleConnections] reaches them through the
// Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) maxRetries() int {
	switch {
	case t.MaxRetries == 0:
		return defaultRetries
	case t.MaxRetries < 0:
		return 0
	}
	return t.MaxRetries
}

func (t *Transport) maxWait() time.Duration {
	if t.MaxWait <= 0 {
		return defaultMaxWait
	}
	return t.MaxWait
}

func (t *Transport) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// pause sleeps for d or until ctx ends, whichever is first.
func (t *Transport) pause(ctx context.Context, d time.Duration) error {
	if t.sleep != nil {
		return t.sleep(ctx, d)
	}
	return sleep(ctx, d)
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// passesDeadline reports whether a wait of d from now ends at or after
// ctx's deadline: sleeping it would only end in the context's error, with
// nothing sent.
func passesDeadline(ctx context.Context, now time.Time, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && !now.Add(d).Before(deadline)
}

// observe reads resp: the wait before a retry when resp is a 429 or 503
// that names one (ok false otherwise), and, under Pace, what it says about
// the host's quota.
func (t *Transport) observe(host string, resp *http.Response) (wait time.Duration, ok bool) {
	now := t.clock()
	rejected := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
	if rejected {
		wait, ok = retryWait(resp.Header, now)
	}
	if !t.Pace {
		return wait, ok
	}
	q := parseRateLimit(resp.Header.Values("Ratelimit"))
	var hold time.Duration
	switch {
	case ok:
		hold = max(wait, q.exhaustedWait)
	case q.exhausted:
		hold = q.exhaustedWait
	case q.seen && q.fewest > 0:
		t.remaining(host, now, q.fewest)
		return wait, ok
	default:
		return wait, ok // nothing said about the quota: keep what we knew
	}
	quota, window, _ := parsePolicy(resp.Header.Values("Ratelimit-Policy"), q.name)
	t.remember(host, now, hold, quota, window)
	return wait, ok
}

// remember records that host's quota is spent for d from now, and that
// from then on it holds quota units each window (0 when the response
// named no policy); or, for d == 0, that it is not spent.
func (t *Transport) remember(host string, now time.Time, d time.Duration, quota int64, window time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d <= 0 {
		delete(t.hosts, host)
		return
	}
	if t.hosts == nil {
		t.hosts = make(map[string]*spent)
	}
	if _, known := t.hosts[host]; !known && len(t.hosts) >= maxHosts {
		t.evict(now)
	}
	t.hosts[host] = &spent{until: now.Add(d), left: quota, quota: quota, window: window}
}

// remaining records a response that says host's quota has r units left.
// During a hold's release it lowers what the release may still send: the
// server has counted what was sent, and may share the quota with other
// clients. It does not end a hold still running, since it may have been
// decided before the response that spent the quota. A host remembered
// without a policy is forgotten once its hold has ended.
func (t *Transport) remaining(host string, now time.Time, r int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.hosts[host]
	switch {
	case !ok || now.Before(s.until):
	case s.quota == 0:
		delete(t.hosts, host)
	case now.Before(s.until.Add(s.window)):
		s.left = min(s.left, r)
	}
}

// evict makes room in a full host table: it drops every hold that has
// ended, with the release after it, or, when none has, the one that ends
// first, the least worth keeping.
func (t *Transport) evict(now time.Time) {
	var first string
	var firstEnd time.Time
	for h, s := range t.hosts {
		end := s.until.Add(s.window)
		if !end.After(now) {
			delete(t.hosts, h)
			continue
		}
		if first == "" || end.Before(firstEnd) {
			first, firstEnd = h, end
		}
	}
	if len(t.hosts) >= maxHosts {
		delete(t.hosts, first)
	}
}

// errHoldTooLong is hold's answer for a wait it did not start.
var errHoldTooLong = errors.New("client: the quota is back too late")

// hold waits until host's quota is back and has a unit for this request,
// when Pace remembers it spent. The caller's goroutine does the waiting;
// a request that finds the release spent waits for the next reset and
// asks again. A wait that would end more than MaxWait after since, or at
// ctx's deadline, is not started (errHoldTooLong).
func (t *Transport) hold(ctx context.Context, host string, since time.Time) error {
	for {
		now := t.clock()
		at, wait := t.take(host, now)
		switch {
		case !wait:
			return nil
		case at.Sub(since) > t.maxWait() || passesDeadline(ctx, now, at.Sub(now)):
			return errHoldTooLong
		}
		if err := t.pause(ctx, at.Sub(now)); err != nil {
			return fmt.Errorf("client: waiting for the quota of %s: %w", host, err)
		}
	}
}

// take lets a request to host go at now, spending one of the release's
// units, or says until when it must wait: the hold's end, or, when the
// release is spent, the reset a window later. A request that finds that
// reset passed starts its release.
func (t *Transport) take(host string, now time.Time) (at time.Time, wait bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.hosts[host]
	switch {
	case !ok || s.quota == 0 && !now.Before(s.until):
		return time.Time{}, false
	case now.Before(s.until):
		return s.until, true
	}
	if s.left <= 0 {
		next := s.until.Add(s.window)
		if now.Before(next) {
			return next, true
		}
		s.until, s.left = next, s.quota
	}
	s.left--
	return time.Time{}, false
}

// replayable reports whether req may be sent again: a method whose repeat
// is harmless, or the caller's word that it is, and a body that can be
// produced again.
func replayable(req *http.Request, anyMethod bool) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if anyMethod {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	// net/http's rule for its own retries: the header's presence, even
	// with no value, marks the request idempotent.
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// again is a copy of req to send once more, with a fresh body.
func again(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

// closeBody closes the body GetBody made for a retry that is not sent,
// which may hold a file or a connection.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// buffer reads resp's body into memory and closes the connection's body,
// so that the connection goes back to the pool during the wait while the
// response stays whole for a caller whose context ends. kept is false,
// leaving resp as readable as before, when the body is larger than
// maxBuffered or fails to read. A body still arriving after d is closed
// and given up (late): a server that stalls its refusal's body must not
// hold the request past the wait it named.
func buffer(resp *http.Response, d time.Duration) (kept, late bool) {
	body := resp.Body
	if body == nil { // a Base that breaks the RoundTripper contract
		resp.Body = http.NoBody
		return true, false
	}
	var expired atomic.Bool
	timer := time.AfterFunc(d, func() {
		expired.Store(true)
		body.Close()
	})
	b, err := io.ReadAll(io.LimitReader(body, maxBuffered+1))
	timer.Stop()
	if err == nil && len(b) <= maxBuffered {
		body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return true, false
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), body), body}
	return false, err != nil && expired.Load()
}

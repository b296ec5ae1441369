// Package adaptertest holds the scenarios that every framework adapter must
// answer exactly as ceiling's net/http middleware does, and the helpers that
// run them and compare the responses. The adapters' tests import it (their
// modules nest under this one, so Go lets them use its internal packages);
// the frameworks themselves are never imported here.
package adaptertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A Mount builds an application in one framework: the limiter's middleware
// in front of h, which is routed at each pattern for every method. Patterns
// are in ServeMux syntax ("/items/{id}"); frameworks that spell parameters
// ":id" convert them with [Colon].
type Mount func(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler

// NetHTTP is the reference [Mount]: a ServeMux routing each pattern to
// l.Handler(h), as ceiling's README sets it up.
func NetHTTP(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
	mux := http.NewServeMux()
	for _, p := range patterns {
		mux.Handle(p, l.Handler(h))
	}
	return mux
}

// Colon rewrites ServeMux parameters ("{id}") as Echo and Gin spell them
// (":id").
func Colon(pattern string) string {
	var b strings.Builder
	for {
		open := strings.IndexByte(pattern, '{')
		if open < 0 {
			b.WriteString(pattern)
			return b.String()
		}
		end := strings.IndexByte(pattern[open:], '}')
		b.WriteString(pattern[:open])
		b.WriteByte(':')
		b.WriteString(pattern[open+1 : open+end])
		pattern = pattern[open+end+1:]
	}
}

// A Response is what a client saw: the status, every header and the body.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Capture serves r with h and returns the response as the client saw it.
func Capture(h http.Handler, r *http.Request) Response {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	res := w.Result()
	return Response{Status: res.StatusCode, Header: res.Header, Body: w.Body.String()}
}

// Diff describes every difference between want and got, one per line, or
// returns "" when they are identical.
func Diff(want, got Response) string {
	var b strings.Builder
	if want.Status != got.Status {
		fmt.Fprintf(&b, "status: got %d, want %d\n", got.Status, want.Status)
	}
	names := make([]string, 0, len(want.Header)+len(got.Header))
	for k := range want.Header {
		names = append(names, k)
	}
	for k := range got.Header {
		if _, ok := want.Header[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		if w, g := want.Header[k], got.Header[k]; !slices.Equal(w, g) {
			fmt.Fprintf(&b, "header %s: got %q, want %q\n", k, g, w)
		}
	}
	if want.Body != got.Body {
		fmt.Fprintf(&b, "body: got %q, want %q\n", got.Body, want.Body)
	}
	return b.String()
}

// Run sends every scenario's requests through mount and through [NetHTTP]
// (see [Check]) and fails t wherever they differ.
func Run(t *testing.T, mount Mount) {
	t.Helper()
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			for _, p := range Check(sc, mount) {
				t.Error(p)
			}
		})
	}
}

// Check sends the scenario's requests through mount and through [NetHTTP],
// each with a limiter of its own, and describes every response that
// differs. It also pins the reference: the net/http statuses must be the
// scenario's.
func Check(sc Scenario, mount Mount) []string {
	ref := NetHTTP(sc.Limiter(), Handler, sc.Patterns...)
	app := mount(sc.Limiter(), Handler, sc.Patterns...)
	var problems []string
	var statuses []int
	for i, step := range sc.Steps {
		want := Capture(ref, step.Request())
		got := Capture(app, step.Request())
		statuses = append(statuses, want.Status)
		if d := Diff(want, got); d != "" {
			problems = append(problems, fmt.Sprintf("request %d (%s %s) differs from net/http:\n%s", i, step.Method, step.Target, d))
		}
	}
	if !slices.Equal(statuses, sc.Want) {
		problems = append(problems, fmt.Sprintf("net/http statuses = %v, want %v", statuses, sc.Want))
	}
	return problems
}

// Handler is the application behind the middleware in every scenario. It
// writes through the plain http.ResponseWriter, so that any difference in a
// response comes from the middleware, not from a framework's helpers: the
// method and path it was reached with, the body it read (which must be the
// body the client sent, even after a key function read it) and the
// RateLimit header the middleware had set by then. Asked by the request, it
// also reports the real cost of the work with [ceiling.Settle] (header
// X-Used: "rule=units") and reads [Order]'s prefetched result (header
// X-Prefetch), both of which need the request the core handed on.
var Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var extra strings.Builder
	if used := r.Header.Get("X-Used"); used != "" {
		rule, n, _ := strings.Cut(used, "=")
		units, _ := strconv.ParseInt(n, 10, 64)
		fmt.Fprintf(&extra, " settle=%v", ceiling.Settle(r, rule, units))
	}
	if r.Header.Get("X-Prefetch") != "" {
		v, err := Order.Get(r)
		fmt.Fprintf(&extra, " prefetched=%q err=%v", v, err)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Handler", "ran")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "%s %s body=%q ratelimit=%q%s\n", r.Method, r.URL.Path, body, w.Header().Get("RateLimit"), extra.String())
})

// Order is the prefetched work of the scenarios that register it: it
// answers with the path it was started for.
var Order = ceiling.Prefetch("order", func(_ context.Context, r *http.Request) (string, error) {
	return "order for " + r.URL.Path, nil
})

// A Step is one request of a scenario.
type Step struct {
	Method, Target string
	// Header is added to the request.
	Header map[string]string
	Body   string
	// RemoteAddr is the connection's peer; empty means 192.0.2.1:1234.
	RemoteAddr string
}

// Request builds the step's request.
func (s Step) Request() *http.Request {
	r := httptest.NewRequest(s.Method, s.Target, strings.NewReader(s.Body))
	for k, v := range s.Header {
		r.Header.Set(k, v)
	}
	if s.RemoteAddr != "" {
		r.RemoteAddr = s.RemoteAddr
	}
	return r
}

// Limiter is one rule named "ip" of limit units per minute keyed by key, on
// a fresh [Counter] backend: the adapters' tests of chains and keys.
func Limiter(limit int64, key ceiling.KeyFunc, opts ...ceiling.Option) *ceiling.Limiter {
	return ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: key, Limit: limit, Period: time.Minute}},
		append([]ceiling.Option{ceiling.WithBackend(&Counter{})}, opts...)...)
}

// Statuses serves steps through h in order and returns their status codes.
func Statuses(h http.Handler, steps ...Step) []int {
	var got []int
	for _, s := range steps {
		got = append(got, Capture(h, s.Request()).Status)
	}
	return got
}

package adaptertest

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A Scenario is a limiter and a sequence of requests to it.
type Scenario struct {
	Name string
	// Patterns are the application's routes, in ServeMux syntax.
	Patterns []string
	// Limiter builds a fresh limiter with a fresh backend.
	Limiter func() *ceiling.Limiter
	Steps   []Step
	// Want is the status of each step under net/http.
	Want []int
}

// quiet keeps the expected backend failures out of the test output.
var quiet = ceiling.WithLogger(slog.New(slog.DiscardHandler))

func limiter(rules []ceiling.Rule, opts ...ceiling.Option) func() *ceiling.Limiter {
	return func() *ceiling.Limiter {
		return ceiling.MustNew(rules, append([]ceiling.Option{ceiling.WithBackend(&Counter{}), quiet}, opts...)...)
	}
}

func header(name string) ceiling.KeyFunc {
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(name); v != "" {
			return v, nil
		}
		return "", ceiling.ErrNoKey
	}
}

// MaxBody is the body limit of the scenarios' body keys.
const MaxBody = 64

// to keys by the "to" field of a JSON body of at most MaxBody bytes, with
// the core's body key, which leaves the body intact for the handler.
var to = ceiling.Must(ceiling.BodyField("to", ceiling.BodyLimit(MaxBody)))

func get(target string) Step { return Step{Method: http.MethodGet, Target: target} }

func post(target, body string) Step {
	return Step{Method: http.MethodPost, Target: target, Body: body, Header: map[string]string{"Content-Type": "application/json"}}
}

func as(user string, s Step) Step {
	s.Header = map[string]string{"X-User": user}
	return s
}

func with(header, value string, s Step) Step {
	h := map[string]string{header: value}
	for k, v := range s.Header {
		h[k] = v
	}
	s.Header = h
	return s
}

func spoofed(xff string) Step {
	s := get("/items/1")
	s.Header = map[string]string{"X-Forwarded-For": xff, "X-Real-IP": xff}
	return s
}

// Scenarios returns the table every adapter answers as net/http does.
func Scenarios() []Scenario {
	ip := ceiling.Rule{Name: "ip", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute}
	return []Scenario{
		{
			Name:     "429 past the limit",
			Patterns: []string{"/items/{id}"},
			Limiter:  limiter([]ceiling.Rule{ip}),
			Steps:    []Step{get("/items/1"), get("/items/2"), get("/items/3"), get("/items/4")},
			Want:     []int{200, 200, 429, 429},
		},
		{
			Name:     "the first rejecting rule in declaration order is named",
			Patterns: []string{"/chat"},
			Limiter: limiter([]ceiling.Rule{
				{Name: "user:minute", Key: header("X-User"), Limit: 1, Period: time.Minute, Algorithm: ceiling.SlidingLog},
				{Name: "user:day", Key: header("X-User"), Limit: 2, Period: 24 * time.Hour, Algorithm: ceiling.FixedWindow},
				{Name: "ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute},
			}),
			// The anonymous request is decided by the ip rule alone.
			Steps: []Step{as("ann", post("/chat", "")), as("ann", post("/chat", "")), as("bob", post("/chat", "")), post("/chat", "")},
			Want:  []int{200, 429, 200, 200},
		},
		{
			Name:     "a spoofed X-Forwarded-For buys no quota",
			Patterns: []string{"/items/{id}"},
			Limiter:  limiter([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}}),
			Steps:    []Step{spoofed("203.0.113.1"), spoofed("203.0.113.2"), spoofed("203.0.113.3, 198.51.100.7")},
			Want:     []int{200, 429, 429},
		},
		{
			Name:     "503 when the backend is down and the limiter fails closed",
			Patterns: []string{"/items/{id}"},
			Limiter: func() *ceiling.Limiter {
				return ceiling.MustNew([]ceiling.Rule{ip}, ceiling.WithBackend(Down{}), ceiling.WithFailMode(ceiling.FailClosed), quiet)
			},
			Steps: []Step{get("/items/1"), get("/items/1")},
			Want:  []int{503, 503},
		},
		{
			// GCRA, whose headers count from the key's first request, so
			// that two limiters' wall clocks give the same rounded seconds.
			Name:     "the in-process fallback limits while the backend is down",
			Patterns: []string{"/items/{id}"},
			Limiter: func() *ceiling.Limiter {
				return ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Hour}},
					ceiling.WithBackend(Down{}), ceiling.WithFailMode(ceiling.FailLocal), quiet)
			},
			Steps: []Step{get("/items/1"), get("/items/1"), get("/items/1")},
			Want:  []int{200, 200, 429},
		},
		{
			Name:     "a rule that fails closed wins over a limiter that fails open",
			Patterns: []string{"/otp"},
			Limiter: func() *ceiling.Limiter {
				return ceiling.MustNew([]ceiling.Rule{
					{Name: "ip", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute},
					{Name: "otp:to", Key: to, Limit: 3, Period: 15 * time.Minute, FailMode: ceiling.FailClosed},
				}, ceiling.WithBackend(Down{}), ceiling.WithFailMode(ceiling.FailOpen), quiet)
			},
			Steps: []Step{get("/otp"), post("/otp", `{"to":"+254700000000"}`)},
			Want:  []int{200, 503},
		},
		{
			Name:     "400 and 413 for bodies the key cannot use, before any decision",
			Patterns: []string{"/otp"},
			Limiter:  limiter([]ceiling.Rule{{Name: "otp:to", Key: to, Limit: 1, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog}}),
			Steps: []Step{
				post("/otp", `{"to": {"phone": "+254700000000"}}`),
				post("/otp", `not json`),
				post("/otp", `{"to": "+254700000000", "To": "+254700000001"}`),
				post("/otp", `{"to":"+254700000000","pad":"`+string(bytes.Repeat([]byte("x"), MaxBody))+`"}`),
				post("/otp", `{"to":"+254700000000"}`),
				post("/otp", `{"to":"+254700000000"}`),
				post("/otp", `{"to":"+254700000001"}`),
			},
			Want: []int{400, 400, 400, 413, 200, 429, 200},
		},
		{
			Name:     "shadow rules are reported to the backend but never reject or show",
			Patterns: []string{"/items/{id}"},
			Limiter: limiter([]ceiling.Rule{
				{Name: "ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute},
				{Name: "ip:new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
			}),
			Steps: []Step{get("/items/1"), get("/items/1"), get("/items/1"), get("/items/1")},
			Want:  []int{200, 200, 200, 429},
		},
		{
			Name:     "shadow rules named in RateLimit-Shadow when asked",
			Patterns: []string{"/items/{id}"},
			Limiter: limiter([]ceiling.Rule{
				{Name: "ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute},
				{Name: "ip:new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
			}, ceiling.WithShadowHeader()),
			Steps: []Step{get("/items/1"), get("/items/1"), get("/items/1"), get("/items/1")},
			Want:  []int{200, 200, 200, 429},
		},
		{
			Name:     "X-RateLimit headers",
			Patterns: []string{"/items/{id}"},
			Limiter:  limiter([]ceiling.Rule{ip}, ceiling.WithHeaders(ceiling.HeadersXRateLimit)),
			Steps:    []Step{get("/items/1"), get("/items/1"), get("/items/1")},
			Want:     []int{200, 200, 429},
		},
		{
			Name:     "a custom reject handler writes the rejection",
			Patterns: []string{"/items/{id}"},
			Limiter: limiter([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}},
				ceiling.WithRejectHandler(func(w http.ResponseWriter, r *http.Request, d *ceiling.Decision) {
					w.Header().Set("Content-Type", "text/plain; charset=utf-8")
					w.WriteHeader(http.StatusTooManyRequests)
					fmt.Fprintf(w, "slow down on %s: %s\n", r.URL.Path, d.Rejected().Rule.Name)
				})),
			Steps: []Step{get("/items/1"), get("/items/2")},
			Want:  []int{200, 429},
		},
		{
			Name:     "route keys: one budget per matched route, never per path",
			Patterns: []string{"/items/{id}", "/users/{id}"},
			Limiter:  limiter([]ceiling.Rule{{Name: "route", Key: ceiling.Route, Limit: 2, Period: time.Minute}}),
			Steps:    []Step{get("/items/1"), get("/items/2"), get("/items/3"), get("/users/1"), get("/users/2"), get("/users/3")},
			Want:     []int{200, 200, 429, 200, 200, 429},
		},
		{
			Name:     "the handler settles the real cost after the work",
			Patterns: []string{"/chat"},
			Limiter: limiter([]ceiling.Rule{{Name: "tokens", Key: ceiling.RemoteAddr, Limit: 10, Period: time.Hour,
				Estimate: func(*http.Request) (int64, error) { return 1, nil }}}),
			// 9 used, then 1 at the estimate: the budget of 10 is spent.
			Steps: []Step{with("X-Used", "tokens=9", post("/chat", "")), post("/chat", ""), post("/chat", "")},
			Want:  []int{200, 200, 429},
		},
		{
			Name:     "prefetched work reaches the handler and never a rejection",
			Patterns: []string{"/items/{id}"},
			Limiter:  limiter([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}}, ceiling.WithPrefetch(Order)),
			Steps:    []Step{with("X-Prefetch", "1", get("/items/1")), with("X-Prefetch", "1", get("/items/2"))},
			Want:     []int{200, 429},
		},
	}
}

package check

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// load reads and validates an OpenAPI document of docs/openapi, examples
// included (each must match its schema).
func load(t *testing.T, name string) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	doc, err := loader.LoadFromFile("../" + name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := doc.Validate(loader.Context, openapi3.EnableExamplesValidation(), openapi3.EnableSchemaPatternValidation()); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", name, err)
	}
	return doc
}

// ratelimit.yaml is an OpenAPI 3.1 document that holds every component
// its description and the docs promise.
func TestRateLimitDocumentIsValidOpenAPI31(t *testing.T) {
	doc := load(t, "ratelimit.yaml")
	if !doc.IsOpenAPI31OrLater() || !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	c := doc.Components
	for _, name := range []string{"TooManyRequests", "RateLimiterUnavailable"} {
		if c.Responses[name] == nil {
			t.Errorf("no response %s", name)
		}
	}
	for _, name := range []string{"Problem", "QuotaExceeded", "RateLimiterUnavailable"} {
		if c.Schemas[name] == nil {
			t.Errorf("no schema %s", name)
		}
	}
	for _, name := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
		if c.Headers[name] == nil {
			t.Errorf("no header %s", name)
		}
	}
	if p := c.Schemas["Problem"]; p != nil && p.Value.Properties["violated-policies"] == nil {
		t.Error("the problem schema has no violated-policies")
	}
	// The examples load validated against their schemas; an example that
	// broke them would be refused above.
	load(t, "example.yaml")
}

// quiet keeps the limiters' warnings (no key secret, a backend down) out
// of the test's output.
var quiet = ceiling.WithLogger(slog.New(slog.DiscardHandler))

// failing is a backend that cannot be reached: every rule fails closed.
type failing struct{}

func (failing) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, backend.ErrUnreachable
}
func (failing) Reset(context.Context, ...string) error { return backend.ErrUnreachable }

// otpRules are the rules of example.yaml's operation: a hidden rule on
// the destination, one on the address, one on requests in flight (a
// policy without a window) and one whose cost the request names.
func otpRules() []ceiling.Rule {
	cost := func(r *http.Request) (int64, error) {
		if v := r.Header.Get("X-Units"); v != "" {
			return strconv.ParseInt(v, 10, 64)
		}
		return 1, nil
	}
	return []ceiling.Rule{
		{Name: "otp:phone", Key: ceiling.Header("X-Phone"), Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog, Hidden: true},
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 5, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "otp:inflight", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute, Algorithm: ceiling.Concurrency},
		{Name: "otp:units", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Hour, Estimate: cost},
	}
}

// A response is one the middleware wrote, with the request it answered.
type response struct {
	req    *http.Request
	status int
	header http.Header
	body   []byte
}

// send serves one POST /api/otp through h.
func send(h http.Handler, phone string, header ...string) response {
	r := httptest.NewRequest("POST", "http://localhost/api/otp", nil)
	r.Header.Set("X-Phone", phone)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return response{req: r, status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

// validate checks resp against the route of example.yaml its request
// matches; a status the operation does not document is an error too.
func validate(t *testing.T, router routers.Router, resp response) error {
	t.Helper()
	route, params, err := router.FindRoute(resp.req)
	if err != nil {
		t.Fatalf("no route for %s %s: %v", resp.req.Method, resp.req.URL, err)
	}
	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: resp.req, PathParams: params, Route: route},
		Status:                 resp.status,
		Header:                 resp.header,
		Body:                   io.NopCloser(bytes.NewReader(resp.body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

func router(t *testing.T) routers.Router {
	t.Helper()
	r, err := legacy.NewRouter(load(t, "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Real responses of the middleware, each kind of 429 and the fail-closed
// 503, match the document's components.
func TestMiddlewareResponsesMatchTheDocument(t *testing.T) {
	rt := router(t)
	accepted := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	limiter := ceiling.MustNew(otpRules(), quiet)
	defer limiter.Close()
	h := limiter.Handler(accepted)
	down := ceiling.MustNew(otpRules(), quiet, ceiling.WithBackend(failing{}), ceiling.WithFailMode(ceiling.FailClosed))
	defer down.Close()

	type step struct {
		name   string
		resp   response
		status int
		rules  []string // the 429's violated-policies
	}
	var steps []step
	for i := range 3 {
		steps = append(steps, step{name: "admitted " + strconv.Itoa(i), resp: send(h, "+254700000000"), status: 202})
	}
	steps = append(steps,
		step{name: "only the hidden rule refuses", resp: send(h, "+254700000000"), status: 429, rules: []string{"otp:phone"}},
		step{name: "a cost that never fits", resp: send(h, "+254700000001", "X-Units", "101"), status: 429, rules: []string{"otp:units"}},
		step{name: "admitted 3", resp: send(h, "+254700000002"), status: 202},
		step{name: "admitted 4", resp: send(h, "+254700000003"), status: 202},
		step{name: "the address rule refuses", resp: send(h, "+254700000004"), status: 429, rules: []string{"otp:ip"}},
		step{name: "the hidden rule and the address rule refuse", resp: send(h, "+254700000000"), status: 429, rules: []string{"otp:ip"}},
		step{name: "two listed rules refuse", resp: send(h, "+254700000005", "X-Units", "96"), status: 429, rules: []string{"otp:ip", "otp:units"}},
		step{name: "failing closed", resp: send(down.Handler(accepted), "+254700000000"), status: 503},
	)
	for _, s := range steps {
		if s.resp.status != s.status {
			t.Fatalf("%s: status %d %s, want %d", s.name, s.resp.status, s.resp.body, s.status)
		}
		if s.rules != nil {
			var p ceiling.Problem
			if err := json.Unmarshal(s.resp.body, &p); err != nil || strings.Join(p.ViolatedPolicies, ",") != strings.Join(s.rules, ",") {
				t.Fatalf("%s: body %s, want violated-policies %v", s.name, s.resp.body, s.rules)
			}
		}
		if err := validate(t, rt, s.resp); err != nil {
			t.Errorf("%s: %d %v %s does not match the document: %v", s.name, s.resp.status, s.resp.header, s.resp.body, err)
		}
	}
}

// The document constrains what it describes: each response ceiling could
// never send, made from a real one, fails validation.
func TestTheDocumentRefusesWhatCeilingNeverSends(t *testing.T) {
	rt := router(t)
	accepted := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	limiter := ceiling.MustNew(otpRules()[1:2], quiet) // otp:ip alone, 5 per 15 minutes
	defer limiter.Close()
	h := limiter.Handler(accepted)
	for range 5 {
		send(h, "+254700000000")
	}
	rejected := send(h, "+254700000000")
	down := ceiling.MustNew(otpRules(), quiet, ceiling.WithBackend(failing{}), ceiling.WithFailMode(ceiling.FailClosed))
	defer down.Close()
	unavailable := send(down.Handler(accepted), "+254700000000")
	if rejected.status != 429 || unavailable.status != 503 {
		t.Fatalf("statuses %d and %d, want 429 and 503", rejected.status, unavailable.status)
	}
	for _, r := range []response{rejected, unavailable} {
		if err := validate(t, rt, r); err != nil {
			t.Fatalf("the real %d does not match: %v", r.status, err)
		}
	}
	edit := func(r response, header func(http.Header), body func(map[string]any)) response {
		r.header = r.header.Clone()
		if header != nil {
			header(r.header)
		}
		if body != nil {
			var m map[string]any
			if err := json.Unmarshal(r.body, &m); err != nil {
				t.Fatal(err)
			}
			body(m)
			r.body, _ = json.Marshal(m)
		}
		return r
	}
	for _, tc := range []struct {
		name string
		resp response
	}{
		{"a 503 without Retry-After", edit(unavailable, func(h http.Header) { h.Del("Retry-After") }, nil)},
		{"a 503 without retry-after in its body", edit(unavailable, nil, func(m map[string]any) { delete(m, "retry-after") })},
		{"a Retry-After that is an HTTP date", edit(rejected, func(h http.Header) { h.Set("Retry-After", "Wed, 21 Oct 2026 07:28:00 GMT") }, nil)},
		{"a 429 without violated-policies", edit(rejected, nil, func(m map[string]any) { delete(m, "violated-policies") })},
		{"a 429 of another problem type", edit(rejected, nil, func(m map[string]any) { m["type"] = "about:blank" })},
		{"a 429 whose body says 503", edit(rejected, nil, func(m map[string]any) { m["status"] = 503 })},
		{"a 429 as plain JSON", edit(rejected, func(h http.Header) { h.Set("Content-Type", "application/json") }, nil)},
		{"a negative remaining", edit(rejected, func(h http.Header) { h.Set("RateLimit", `"otp:ip";r=-1;t=5`) }, nil)},
		{"draft-08's RateLimit", edit(rejected, func(h http.Header) { h.Set("RateLimit", "limit=5, remaining=0, reset=900") }, nil)},
		{"a policy without its window", edit(rejected, func(h http.Header) { h.Set("RateLimit-Policy", `"otp:ip";q=5`) }, nil)},
		{"a status the operation does not document", edit(rejected, nil, nil)},
	} {
		if tc.name == "a status the operation does not document" {
			tc.resp.status = 418
		}
		if err := validate(t, rt, tc.resp); err == nil {
			t.Errorf("%s: validates, want an error", tc.name)
		}
	}
}

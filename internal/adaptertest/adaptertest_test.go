package adaptertest

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling"
)

// The reference run pins each scenario's statuses; comparing net/http with
// itself also proves the scenarios are deterministic (two limiters, same
// answers).
func TestScenariosOnNetHTTP(t *testing.T) {
	Run(t, NetHTTP)
}

func TestDiffReportsEveryDifference(t *testing.T) {
	want := Response{Status: 429, Header: http.Header{"Retry-After": {"60"}, "Ratelimit": {`"ip";r=0;t=60`}}, Body: "x"}
	if d := Diff(want, want); d != "" {
		t.Fatalf("Diff of a response with itself = %q, want none", d)
	}
	got := Response{Status: 200, Header: http.Header{"Ratelimit": {`"ip";r=1;t=60`}, "X-Extra": {"1"}}, Body: "y"}
	d := Diff(want, got)
	for _, part := range []string{"status: got 200, want 429", "header Retry-After", "header Ratelimit", "header X-Extra", "body:"} {
		if !strings.Contains(d, part) {
			t.Errorf("Diff does not mention %q:\n%s", part, d)
		}
	}
}

// A mount that behaves differently must fail the comparison, or a passing
// adapter proves nothing.
func TestCheckCatchesAnAdapterThatDiffers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mount    Mount
		scenario string
	}{
		{"skips the limiter", func(_ *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
			mux := http.NewServeMux()
			for _, p := range patterns {
				mux.Handle(p, h)
			}
			return mux
		}, "429 past the limit"},
		{"keys by X-Forwarded-For", func(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
			core := NetHTTP(l, h, patterns...)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
					r.RemoteAddr = xff + ":1"
				}
				core.ServeHTTP(w, r)
			})
		}, "a spoofed X-Forwarded-For buys no quota"},
		{"adds a header to rejections", func(l *ceiling.Limiter, h http.Handler, patterns ...string) http.Handler {
			core := NetHTTP(l, h, patterns...)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Powered-By", "adapter")
				core.ServeHTTP(w, r)
			})
		}, "503 when the backend is down and the limiter fails closed"},
	} {
		var found bool
		for _, sc := range Scenarios() {
			if sc.Name != tc.scenario {
				continue
			}
			found = true
			if problems := Check(sc, tc.mount); len(problems) == 0 {
				t.Errorf("an adapter that %s passed %q", tc.name, sc.Name)
			}
		}
		if !found {
			t.Errorf("no scenario %q", tc.scenario)
		}
	}
}

func TestColon(t *testing.T) {
	for in, want := range map[string]string{
		"/items/{id}":             "/items/:id",
		"/a/{x}/b/{y}":            "/a/:x/b/:y",
		"/static":                 "/static",
		"/shops/{shop}/chat/{id}": "/shops/:shop/chat/:id",
	} {
		if got := Colon(in); got != want {
			t.Errorf("Colon(%q) = %q, want %q", in, got, want)
		}
	}
}

// The reference holds the slow-body bound that SlowBody checks adapters for.
func TestSlowBodyNetHTTP(t *testing.T) {
	SlowBody(t, NetHTTP)
}

// nativeNetHTTP is [Native] on a ServeMux, whose handlers are net/http's
// own.
func nativeNetHTTP(l *ceiling.Limiter, perRoute bool, method, pattern string, fn NativeFunc) http.Handler {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, body := fn(r)
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
	if perRoute {
		h = l.Handler(h)
	}
	mux := http.NewServeMux()
	mux.Handle(method+" "+pattern, h)
	mux.HandleFunc("GET /open", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "open") })
	if perRoute {
		return mux
	}
	return l.Handler(mux)
}

// The framework checks hold on net/http, so a framework that fails one
// differs from the reference. (RouteKeys needs the route matched before
// the middleware runs, which a ServeMux behind l.Handler is not.)
func TestNativeChecksOnNetHTTP(t *testing.T) {
	RouteMiddleware(t, nativeNetHTTP)
	PrefetchAndSettle(t, nativeNetHTTP)
}

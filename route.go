package ceiling

import (
	"context"
	"net/http"
)

// UnmatchedRoute is the key [Route] gives a request that carries no route
// pattern: one budget shared by every such request. A limiter mounted
// outside the router (before any pattern is known) thereby limits more, not
// less, than intended, which shows at once, instead of silently limiting
// nobody.
const UnmatchedRoute = "(unmatched)"

type routeKey struct{}

// WithRoute returns r carrying pattern as its route for [Route]: the way for
// a router that does not set r.Pattern to say which route matched. Call it
// after routing, before the limiter, with the route's template, never the
// raw path. The Echo and Gin adapters call it with c.Path() and
// c.FullPath(); with gorilla/mux, a middleware registered on the router
// (router.Use) passes mux.CurrentRoute(r).GetPathTemplate().
//
// [http.ServeMux] (Go 1.22 and later) and chi (v5.5.0 and later) set
// r.Pattern themselves once they have routed, so they need no WithRoute:
// with chi, a limiter mounted on the route, router.With(limiter.Handler),
// sees the pattern. A limiter in front of the router (ServeMux wrapped
// whole, chi's router.Use) runs before routing, when no route is known.
func WithRoute(r *http.Request, pattern string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), routeKey{}, pattern))
}

// Route keys by the pattern of the route that matched: a pattern given with
// [WithRoute] (set by the router closest to the handler), else r.Pattern,
// which [http.ServeMux] sets on Go 1.22 and later. It never uses the URL
// path, whose key space is unbounded (/users/1, /users/2, ...). A request
// with no pattern is keyed [UnmatchedRoute].
//
// The pattern is only known after routing: with ServeMux wrap each handler
// (mux.Handle("POST /otp", limiter.Handler(h))), not the mux; with chi,
// mount the limiter on the route (router.With(limiter.Handler).Post(...)),
// not with router.Use.
func Route(r *http.Request) (string, error) {
	return routePattern(r), nil
}

// RouteWithMethod is [Route] prefixed with the request method ("POST
// /users/{id}"), so that reading and writing one resource have separate
// budgets. Methods other than the eight of RFC 9110 and PATCH are keyed as
// "OTHER": the method is chosen by the client, and invented methods must not
// make fresh keys.
func RouteWithMethod(r *http.Request) (string, error) {
	return knownMethod(r.Method) + " " + routePattern(r), nil
}

func routePattern(r *http.Request) string {
	if p, ok := r.Context().Value(routeKey{}).(string); ok && p != "" {
		return p
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return UnmatchedRoute
}

func knownMethod(m string) string {
	switch m {
	case "":
		return http.MethodGet
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
}

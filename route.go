package ceiling

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
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
// not with router.Use. A limiter whose first 100 requests carried no
// pattern, with a rule keyed on the route, says so once, naming the rule
// (logged, and in [Limiter.Health]).
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
	if p := patternOf(r); p != "" {
		return p
	}
	if seen, ok := r.Context().Value(routeSeenKey{}).(*routeSeen); ok {
		seen.unmatched = true
	}
	return UnmatchedRoute
}

// patternOf is r's route pattern, or "".
func patternOf(r *http.Request) string {
	if p, ok := r.Context().Value(routeKey{}).(string); ok && p != "" {
		return p
	}
	return r.Pattern
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

// routeWatchAfter is how many requests without a route pattern a limiter
// sees before it looks for rules keyed on the route (see watchRoute).
const routeWatchAfter = 100

// routeWatch notices a limiter mounted before routing whose rules key on
// the route: every request then has the one key [UnmatchedRoute].
type routeWatch struct {
	done atomic.Bool  // a request had a pattern, or the check ran
	seen atomic.Int64 // requests without a pattern so far
	used atomic.Bool  // a key asked for the route of one of them
}

type routeSeenKey struct{}

// routeSeen, in the context of a request the limiter watches, records
// that a key asked for its route and found none.
type routeSeen struct{ unmatched bool }

// watching returns r with a routeSeen while the limiter watches its first
// requests (one allocation each, for those only), else r.
func (l *Limiter) watching(r *http.Request) *http.Request {
	if l.routes.done.Load() {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), routeSeenKey{}, new(routeSeen)))
}

// watchRoute is called by the middleware once the keys of a request from
// watching are resolved. While no request has carried a route pattern, it
// counts them; at the routeWatchAfter-th, if a key asked for the route of
// any of them, it finds which rules key on it by asking each rule's key for
// the request as it is and as if routed (a pattern set with [WithRoute]):
// those whose key differs have seen only [UnmatchedRoute]. It warns, naming
// them, once: logged and kept for [Limiter.Health]. Only then are keys
// called a second time for a request; a key that reads the body reads it
// from the copy the first call kept.
func (l *Limiter) watchRoute(r *http.Request) {
	w := &l.routes
	if w.done.Load() {
		return
	}
	if patternOf(r) != "" {
		w.done.Store(true)
		return
	}
	if seen, ok := r.Context().Value(routeSeenKey{}).(*routeSeen); ok && seen.unmatched {
		w.used.Store(true)
	}
	if w.seen.Add(1) < routeWatchAfter || !w.done.CompareAndSwap(false, true) || !w.used.Load() {
		return
	}
	routed := WithRoute(r, "/ceiling-route-probe")
	var names []string
	for i := range l.rules {
		rule := &l.rules[i]
		a, errA := rule.Key(r)
		b, errB := rule.Key(routed)
		if errA == nil && errB == nil && a != b {
			names = append(names, strconv.Quote(rule.Name))
		}
	}
	if len(names) == 0 {
		return
	}
	which := "rule " + names[0] + " is"
	if len(names) > 1 {
		which = "rules " + strings.Join(names, ", ") + " are"
	}
	l.notes.warn(l.cfg.logger, fmt.Sprintf("%s keyed on the route, but none of the limiter's first %d requests had one, so they all share the budget of %q: "+
		"the limiter runs before routing. Limit on the route instead: mux.Handle(pattern, limiter.Handler(h)) with http.ServeMux, "+
		"router.With(limiter.Handler) with chi, or ceiling.WithRoute from the router's own middleware",
		which, routeWatchAfter, UnmatchedRoute))
}

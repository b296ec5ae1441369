package ceiling

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// UnmatchedRoute is the key [Route] gives a request with no route pattern:
// one budget for all of them, so a limiter mounted before routing limits
// more than intended, visibly, rather than nobody.
const UnmatchedRoute = "(unmatched)"

type routeKey struct{}

// WithRoute returns r carrying pattern as its route for [Route], for a
// router that does not set r.Pattern: call it after routing with the
// route's template, never the raw path. The Echo and Gin adapters do;
// [http.ServeMux] and chi set r.Pattern themselves.
func WithRoute(r *http.Request, pattern string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), routeKey{}, pattern))
}

// Route keys by the pattern of the route that matched ([WithRoute], else
// r.Pattern), never by the URL path, whose key space is unbounded; a
// request with none is keyed [UnmatchedRoute]. The pattern is known only
// after routing: wrap each handler, not the mux. A limiter whose first
// requests had no pattern, with a rule keyed on the route, warns once,
// naming the rule.
func Route(r *http.Request) (string, error) {
	return routePattern(r), nil
}

// RouteWithMethod is [Route] prefixed with the request method ("POST
// /users/{id}"). Methods other than RFC 9110's and PATCH are keyed "OTHER",
// so invented methods make no fresh keys.
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

// watchRoute counts the watched requests that had no route pattern; at the
// routeWatchAfter-th, if a key asked for a route, it finds the rules whose
// key changes once the request is routed and warns, naming them, once.
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

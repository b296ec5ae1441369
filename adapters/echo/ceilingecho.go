// Package ceilingecho puts a [ceiling.Limiter] in front of Echo handlers.
//
// It translates and decides nothing: every decision, header and response
// body comes from [ceiling.Limiter.Handler], so an Echo application answers
// exactly as a net/http one with the same limiter (the same 429, 503, 400
// and 413 problem bodies, the same rate-limit headers, the same fail modes
// and shadow rules). Keys are the limiter's own: in particular the client
// address is whatever the rules say, never Echo's c.RealIP() unless a rule
// opts in with [FrameworkRealIP].
package ceilingecho

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/ceiling-go/ceiling"
	"github.com/labstack/echo/v4"
)

// Middleware returns Echo middleware that decides every request with l. It
// hands the core the request carrying Echo's matched route (c.Path(), see
// [ceiling.WithRoute]) for [ceiling.Route] and its Echo context for
// [Context]. The core writes the rate-limit headers to c.Response() and then either:
//
//   - admits the request: the chain goes on with the *http.Request the core
//     handed on set as c.Request(), so whatever the core keeps in the
//     request's context is there for the handlers, and the core sees the
//     handler's return before it settles; or
//   - rejects it (or, failing closed, cannot decide, or a key function
//     refuses the input): the response is written, next is not called and
//     the middleware returns nil, so no handler after it runs and Echo's
//     error handler writes nothing more.
//
// Register it with e.Use, g.Use or on a route, not with e.Pre: Echo routes
// after Pre middleware, so there c.Path() is still empty and every request
// would share the [ceiling.UnmatchedRoute] budget of a route rule.
func Middleware(l *ceiling.Limiter) echo.MiddlewareFunc {
	// Each call carries the per-request state to the core's next handler. It
	// is pooled with its core handler, so that the core handler is built
	// once, not per request. What the translation does allocate is the
	// request carrying the route and the framework context (BenchmarkEcho:
	// 5 allocations, about 760 bytes, on top of the core's own).
	calls := sync.Pool{}
	calls.New = func() any {
		k := new(call)
		k.core = l.Handler(k)
		return k
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			k := calls.Get().(*call)
			k.c, k.next = c, next
			r := c.Request()
			r = ceiling.WithRoute(r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)), c.Path())
			k.core.ServeHTTP(c.Response(), r)
			err := k.err
			*k = call{core: k.core}
			calls.Put(k)
			return err
		}
	}
}

// call is the core's next handler for one request.
type call struct {
	core http.Handler
	c    echo.Context
	next echo.HandlerFunc
	err  error
}

func (k *call) ServeHTTP(_ http.ResponseWriter, r *http.Request) {
	k.c.SetRequest(r)
	k.err = k.next(k.c)
}

type ctxKey struct{}

// Context returns the Echo context of a request that [Middleware] is
// deciding or has admitted, or nil. It lets a custom [ceiling.KeyFunc] read
// what only Echo knows (c.Param("shop")). It is valid only until the
// request's handler returns: Echo reuses its contexts.
func Context(r *http.Request) echo.Context {
	c, _ := r.Context().Value(ctxKey{}).(echo.Context)
	return c
}

// errOutside is a configuration error: a rule using an Echo key function is
// served by something other than [Middleware].
var errOutside = errors.New("ceilingecho: FrameworkRealIP needs ceilingecho.Middleware in front of the handler")

// FrameworkRealIP keys by Echo's c.RealIP(). It is an explicit opt-in and
// never a default, because of whom Echo believes:
//
//   - before Echo v4.16.4, with no e.IPExtractor set, c.RealIP() returned
//     the left-most X-Forwarded-For entry (else X-Real-IP), which any client
//     writes for itself: every request with a made-up address got a fresh
//     quota (this module requires v4.16.4, where it is the peer address);
//   - echo.ExtractIPFromXFFHeader and echo.ExtractIPFromRealIPHeader trust
//     loopback, link-local and private addresses unless told otherwise, so
//     anything that reaches the server from a private network can choose
//     its address the same way.
//
// Use it only with e.IPExtractor set to an extractor whose trust options
// name exactly your proxies (for example echo.ExtractIPFromXFFHeader(
// echo.TrustLoopback(false), echo.TrustLinkLocal(false),
// echo.TrustPrivateNet(false), echo.TrustIPRange(proxies))); otherwise key by
// [ceiling.RemoteAddr]. Outside [Middleware] it returns an error, which
// answers 400, so a misconfiguration is loud.
func FrameworkRealIP(r *http.Request) (string, error) {
	c := Context(r)
	if c == nil {
		return "", errOutside
	}
	if ip := c.RealIP(); ip != "" {
		return ip, nil
	}
	return "", ceiling.ErrNoKey
}

// Package ceilinggin puts a [ceiling.Limiter] in front of Gin handlers.
//
// It translates and decides nothing: every decision, header and response
// body comes from [ceiling.Limiter.Handler], so a Gin application answers
// exactly as a net/http one with the same limiter (the same 429, 503, 400
// and 413 problem bodies, the same rate-limit headers, the same fail modes
// and shadow rules). Keys are the limiter's own: in particular the client
// address is whatever the rules say, never Gin's c.ClientIP() unless a rule
// opts in with [FrameworkClientIP].
package ceilinggin

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/ceiling-go/ceiling"
	"github.com/gin-gonic/gin"
)

// Middleware returns a Gin handler that decides every request with l. It
// hands the core the request carrying Gin's matched route (c.FullPath(), see
// [ceiling.WithRoute]) for [ceiling.Route] and its Gin context for
// [Context]. The core writes the rate-limit headers to c.Writer and then either:
//
//   - admits the request: c.Request becomes the *http.Request the core
//     handed on, so whatever the core keeps in the request's context is
//     there for the handlers, and the rest of the chain runs (c.Next) inside
//     the core, which sees the handlers finish before it settles; or
//   - rejects it (or, failing closed, cannot decide, or a key function
//     refuses the input): the response is written and c.Abort() is called,
//     so no handler after it runs.
//
// Register it with r.Use, a group's Use or on a route: Gin has matched the
// route by then. Requests that match no route have an empty c.FullPath()
// and share the [ceiling.UnmatchedRoute] budget of a route rule.
func Middleware(l *ceiling.Limiter) gin.HandlerFunc {
	// Each call carries the per-request state to the core's next handler. It
	// is pooled with its core handler, so that the core handler is built
	// once, not per request. What the translation does allocate is the
	// request carrying the route and the framework context (BenchmarkGin:
	// 4 allocations, about 740 bytes, on top of the core's own).
	calls := sync.Pool{}
	calls.New = func() any {
		k := new(call)
		k.core = l.Handler(k)
		return k
	}
	return func(c *gin.Context) {
		k := calls.Get().(*call)
		k.c = c
		r := c.Request
		r = ceiling.WithRoute(r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)), c.FullPath())
		k.core.ServeHTTP(c.Writer, r)
		admitted := k.admitted
		k.c, k.admitted = nil, false
		calls.Put(k)
		if !admitted {
			c.Abort()
		}
	}
}

// call is the core's next handler for one request.
type call struct {
	core     http.Handler
	c        *gin.Context
	admitted bool
}

func (k *call) ServeHTTP(_ http.ResponseWriter, r *http.Request) {
	k.admitted = true
	k.c.Request = r
	k.c.Next()
}

type ctxKey struct{}

// Context returns the Gin context of a request that [Middleware] is
// deciding or has admitted, or nil. It lets a custom [ceiling.KeyFunc] read
// what only Gin knows (c.Param("shop")). It is valid only until the
// request's handlers return: Gin reuses its contexts.
func Context(r *http.Request) *gin.Context {
	c, _ := r.Context().Value(ctxKey{}).(*gin.Context)
	return c
}

// errOutside is a configuration error: a rule using a Gin key function is
// served by something other than [Middleware].
var errOutside = errors.New("ceilinggin: FrameworkClientIP needs ceilinggin.Middleware in front of the handler")

// FrameworkClientIP keys by Gin's c.ClientIP(). It is an explicit opt-in and
// never a default, because of whom Gin believes: a gin.New() or
// gin.Default() engine trusts every proxy, so c.ClientIP() returns the
// left-most X-Forwarded-For entry (else X-Real-IP), which any client writes
// for itself, and every request with a made-up address gets a fresh quota.
//
// Use it only after engine.SetTrustedProxies lists exactly your proxies (or
// engine.TrustedPlatform names the one header your platform sets);
// otherwise key by [ceiling.RemoteAddr]. Outside [Middleware] it returns an
// error, which answers 400, so a misconfiguration is loud.
func FrameworkClientIP(r *http.Request) (string, error) {
	c := Context(r)
	if c == nil {
		return "", errOutside
	}
	if ip := c.ClientIP(); ip != "" {
		return ip, nil
	}
	return "", ceiling.ErrNoKey
}

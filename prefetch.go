package ceiling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// A Prefetcher is work registered on a [Limiter] with [WithPrefetch]. The
// only implementation is [*Prefetched], made by [Prefetch].
type Prefetcher interface {
	prefetchName() string
	check() error
	begin(ctx context.Context, r *http.Request, x *extras) prefetchCall
}

// Prefetched is the handle of work registered with [Prefetch]: the handler
// reads the work's result with [Prefetched.Get]. A Prefetched is immutable
// and safe for simultaneous use by multiple goroutines; one handle may be
// registered on several limiters.
type Prefetched[T any] struct {
	name string
	fn   func(ctx context.Context, r *http.Request) (T, error)
}

// Prefetch registers work that a handler will need (a cache read, an order
// lookup) so that it runs while the limiter decides instead of after. Pass
// the handle to [WithPrefetch]; the handler reads the result with
// [Prefetched.Get].
//
// The work starts once every rule's key is known (a 400 never starts it).
// On a rejection its context is cancelled and its result dropped. The
// middleware cancels the context when the handler returns and waits for fn,
// so no goroutine outlives the request: fn must honour ctx. A panic in fn
// is recovered, logged, and returned by Get wrapping [ErrPrefetchPanic].
// fn runs on its own goroutine: it may read r's URL and headers, never
// r.Body. The name identifies the work in errors and logs.
func Prefetch[T any](name string, fn func(ctx context.Context, r *http.Request) (T, error)) *Prefetched[T] {
	return &Prefetched[T]{name: name, fn: fn}
}

// ErrNotPrefetched is returned by [Prefetched.Get], wrapped in an error
// naming the work, when the request did not come through a limiter's
// admitted path with that work registered.
var ErrNotPrefetched = errors.New("not started for this request")

// ErrPrefetchPanic is wrapped by the error [Prefetched.Get] returns when the
// work panicked: `ceiling: prefetch "order": panicked: <value>`.
var ErrPrefetchPanic = errors.New("panicked")

// Get waits for the work started for r and returns its result. It returns
// early with the context's error if r's context ends first. r must be the
// request the limiter passed to the handler (or derived from it).
func (p *Prefetched[T]) Get(r *http.Request) (T, error) {
	var zero T
	x, _ := r.Context().Value(extrasKey{}).(*extras)
	if x != nil {
		for _, c := range x.calls {
			c, ok := c.(*call[T])
			if !ok || c.p != p {
				continue
			}
			select {
			case <-c.done:
				return c.v, c.err
			default:
			}
			select {
			case <-c.done:
				return c.v, c.err
			case <-r.Context().Done():
				return zero, fmt.Errorf("ceiling: prefetch %q: %w", p.name, r.Context().Err())
			}
		}
	}
	return zero, fmt.Errorf("ceiling: prefetch %q: %w", p.name, ErrNotPrefetched)
}

func (p *Prefetched[T]) prefetchName() string { return p.name }

// prefetchCall is one run of registered work for one request.
type prefetchCall interface{ wait() }

// call is one run of p; v and err are written once, before done closes.
type call[T any] struct {
	p    *Prefetched[T]
	v    T
	err  error
	done chan struct{}
}

func (c *call[T]) wait() { <-c.done }

func (p *Prefetched[T]) begin(ctx context.Context, r *http.Request, x *extras) prefetchCall {
	c := &call[T]{p: p, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer func() {
			if v := recover(); v != nil {
				c.err = fmt.Errorf("ceiling: prefetch %q: %w: %v", p.name, ErrPrefetchPanic, v)
				x.l.cfg.logger.LogAttrs(ctx, slog.LevelError, "ceiling: prefetch panicked",
					slog.String("prefetch", p.name), slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			}
		}()
		c.v, c.err = p.fn(ctx, r)
	}()
	return c
}

// WithPrefetch registers work that starts concurrently with every request's
// decision; see [Prefetch].
func WithPrefetch(ps ...Prefetcher) Option {
	return func(c *config) error {
		for _, p := range ps {
			if p == nil {
				return errors.New("ceiling: WithPrefetch: nil prefetch")
			}
			if err := p.check(); err != nil {
				return err
			}
			for _, q := range c.prefetches {
				if q == p {
					return fmt.Errorf("ceiling: WithPrefetch: prefetch %q registered twice", p.prefetchName())
				}
			}
			c.prefetches = append(c.prefetches, p)
		}
		return nil
	}
}

func (p *Prefetched[T]) check() error {
	switch {
	case p == nil:
		return errors.New("ceiling: WithPrefetch: nil prefetch")
	case p.fn == nil:
		return fmt.Errorf("ceiling: WithPrefetch: prefetch %q has no function", p.name)
	}
	return nil
}

// startPrefetches starts the registered work for r. It is called once the
// keys are known, before the backend call.
func (x *extras) startPrefetches(r *http.Request) {
	if len(x.l.cfg.prefetches) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	x.cancel = cancel
	x.calls = make([]prefetchCall, len(x.l.cfg.prefetches))
	for i, p := range x.l.cfg.prefetches {
		x.calls[i] = p.begin(ctx, r, x)
	}
}

// stopPrefetches cancels the work and waits for it to return.
func (x *extras) stopPrefetches() {
	if x.cancel == nil {
		return
	}
	x.cancel()
	for _, c := range x.calls {
		c.wait()
	}
}

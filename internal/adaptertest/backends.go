package adaptertest

import (
	"context"
	"errors"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

// Counter is an exact, clockless backend: each key admits Limit units in
// total and every answer is a pure function of what it has seen, so two runs
// of the same scenario give byte-identical headers. ResetAfter and RetryAfter
// are always the request's Period. The zero value is ready to use and it is
// safe for simultaneous use by multiple goroutines.
type Counter struct {
	mu   sync.Mutex
	used map[string]int64
}

var _ backend.Backend = (*Counter)(nil)

// Decide implements [backend.Backend] all or nothing: if any request that is
// neither Force nor Shadow does not fit, nothing is consumed.
func (c *Counter) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used == nil {
		c.used = make(map[string]int64)
	}
	out := make([]backend.Result, len(reqs))
	admitted := true
	for i, r := range reqs {
		fits := r.Force || c.used[r.Key]+r.Cost <= r.Limit
		out[i] = backend.Result{Allowed: fits, Limit: r.Limit, ResetAfter: r.Period}
		if !fits {
			out[i].RetryAfter = r.Period
			if r.Cost > r.Limit {
				out[i].RetryAfter = backend.Never
			}
			if !r.Shadow {
				admitted = false
			}
		}
	}
	for i, r := range reqs {
		if admitted && out[i].Allowed {
			c.used[r.Key] += r.Cost
		}
		out[i].Remaining = max(0, r.Limit-c.used[r.Key])
	}
	return out, nil
}

// Reset forgets keys.
func (c *Counter) Reset(_ context.Context, keys ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.used, k)
	}
	return nil
}

// ErrDown is what [Down] answers.
var ErrDown = errors.New("adaptertest: backend down")

// Down is a backend that is never reachable, for fail-mode scenarios.
type Down struct{}

var _ backend.Backend = Down{}

// Decide always fails with [ErrDown].
func (Down) Decide(context.Context, []backend.Request) ([]backend.Result, error) {
	return nil, ErrDown
}

// Reset always fails with [ErrDown].
func (Down) Reset(context.Context, ...string) error { return ErrDown }

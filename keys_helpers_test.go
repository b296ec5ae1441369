package ceiling

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ceiling-go/ceiling/backend"
)

// quota is a Backend that admits each stored key Limit units in total, for
// ever: enough to show whether a key function hands out fresh budgets.
type quota struct {
	mu    sync.Mutex
	used  map[string]int64
	calls int
}

func (q *quota) Decide(_ context.Context, reqs []backend.Request) ([]backend.Result, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls++
	if q.used == nil {
		q.used = map[string]int64{}
	}
	out := make([]backend.Result, len(reqs))
	allowed := true
	for i, r := range reqs {
		ok := q.used[r.Key]+r.Cost <= r.Limit
		out[i] = backend.Result{Allowed: ok, Limit: r.Limit, Remaining: max(0, r.Limit-q.used[r.Key]-r.Cost)}
		if !ok {
			out[i].RetryAfter = backend.Never
			allowed = false
		}
	}
	if allowed {
		for _, r := range reqs {
			q.used[r.Key] += r.Cost
		}
	}
	return out, nil
}

func (q *quota) Reset(context.Context, ...string) error { return nil }

// statuses serves each request in turn and returns the status codes.
func statuses(t *testing.T, h http.Handler, reqs ...*http.Request) []int {
	t.Helper()
	var out []int
	for _, r := range reqs {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		out = append(out, w.Code)
	}
	return out
}

// mustKey runs fn on r and fails the test on an error.
func mustKey(t *testing.T, fn KeyFunc, r *http.Request) string {
	t.Helper()
	k, err := fn(r)
	if err != nil {
		t.Fatalf("key: %v", err)
	}
	return k
}

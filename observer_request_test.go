package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

type requestKey struct{}

// breakable is a memory store behind the bare Backend contract, as a
// remote backend would be, that fails once broken.
type breakable struct {
	store  *memory.Store
	broken atomic.Bool
}

func (b *breakable) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if b.broken.Load() {
		return nil, errors.New("dial tcp 127.0.0.1:1: connection refused")
	}
	return b.store.Decide(ctx, reqs)
}

func (b *breakable) Reset(ctx context.Context, keys ...string) error {
	return b.store.Reset(ctx, keys...)
}

// requestRecorder notes, for each ObserveRequest, the request's context
// value, whether it was admitted, the first rejecting rule and the error.
type requestRecorder struct {
	NopObserver
	mu   sync.Mutex
	seen []string
}

func (o *requestRecorder) ObserveRequest(ctx context.Context, d *Decision, err error) {
	s, _ := ctx.Value(requestKey{}).(string)
	switch {
	case err != nil:
		var ue *UnavailableError
		if errors.As(err, &ue) {
			s += " unavailable:" + ue.Rule
		} else {
			s += " error"
		}
	case d.Allowed:
		s += " admitted"
	default:
		s += " rejected:" + d.Rejected().Rule.Name
	}
	o.mu.Lock()
	o.seen = append(o.seen, s)
	o.mu.Unlock()
}

// Every observer is told of each decided request once, with the
// request's own context (where its span is) and the decision: admitted,
// rejected, and refused failing closed.
func TestObserveRequestGetsTheRequestsContext(t *testing.T) {
	be := &breakable{store: memory.New()}
	t.Cleanup(func() { be.store.Close() })
	a, b := &requestRecorder{}, &requestRecorder{}
	l := MustNew([]Rule{
		{Name: "minute", Key: Static("k"), Limit: 2, Period: time.Minute},
		{Name: "pay", Key: Static("k"), Limit: 100, Period: time.Minute, FailMode: FailClosed},
	}, WithBackend(be), WithObserver(a), WithObserver(b), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 100, CoolDown: time.Hour}))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	send := func(id string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), requestKey{}, id))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	var codes []int
	for _, id := range []string{"r1", "r2", "r3"} {
		codes = append(codes, send(id))
	}
	be.broken.Store(true)
	codes = append(codes, send("r4"))
	if want := []int{200, 200, 429, 503}; !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	want := []string{"r1 admitted", "r2 admitted", "r3 rejected:minute", "r4 unavailable:pay"}
	for name, o := range map[string]*requestRecorder{"first": a, "second": b} {
		if !slices.Equal(o.seen, want) {
			t.Errorf("%s observer saw %q, want %q", name, o.seen, want)
		}
	}
}

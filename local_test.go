package ceiling

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// outageStore is an exact remote store (counting) that can be taken down,
// and whose answers say a key is back to full in an hour.
type outageStore struct {
	*counting
	mu   sync.Mutex
	down bool
}

func (o *outageStore) setDown(down bool) {
	o.mu.Lock()
	o.down = down
	o.mu.Unlock()
}

func (o *outageStore) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	o.mu.Lock()
	down := o.down
	o.mu.Unlock()
	if down {
		return errDown
	}
	if err := o.counting.DecideInto(ctx, reqs, out); err != nil {
		return err
	}
	for i := range out[:len(reqs)] {
		out[i].ResetAfter = time.Hour
	}
	return nil
}

func (o *outageStore) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	out := make([]backend.Result, len(reqs))
	return out, o.DecideInto(ctx, reqs, out)
}

// FailLocal's bound across an outage's edges, on one instance of two: the
// local store starts from the backend's last word on the key (its half of
// what was spent), and on recovery the backend is charged with what the
// local store admitted, before the breaker closes, so that neither edge
// admits more than the limit.
func TestFailLocalCarriesTheCountAcrossTheOutage(t *testing.T) {
	be := &outageStore{counting: newCounting()}
	be.remote = true
	l := MustNew([]Rule{{Name: "otp", Limit: 10, Period: time.Hour}}, WithBackend(be),
		WithInstances(2), WithLogger(slog.New(slog.DiscardHandler)),
		WithBreaker(BreakerConfig{Failures: 1, CoolDown: time.Millisecond, MaxCoolDown: 5 * time.Millisecond}))
	defer l.Close()
	decide := func(n int) (admitted int) {
		for range n {
			d, err := l.Decide(context.Background(), Input{Rule: "otp", Key: "+254700000001"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	key := l.request(&l.rules[0], "+254700000001").Key
	if got := decide(4); got != 4 {
		t.Fatalf("healthy: %d admitted, want 4", got)
	}
	be.setDown(true)
	// Local share 5; the backend said 4 of 10 were spent, so this
	// instance's half of that (2) is spent locally: 3 more.
	if got := decide(10); got != 3 {
		t.Errorf("during the outage: %d admitted locally, want 3", got)
	}
	if h := l.Health(); h.Status != "degraded" || h.Rules[0].FailLocalAdmissions != 3 {
		t.Fatalf("health %+v", h)
	}
	be.setDown(false)
	if !eventually(func() bool { return l.Health().Status == "healthy" }) {
		t.Fatal("no recovery")
	}
	be.mu.Lock()
	used := be.used[key]
	be.mu.Unlock()
	if used != 4+3 {
		t.Errorf("the backend counts %d units on the key after recovery, want 7: the 3 admitted locally were not charged", used)
	}
	// For the hand-over after the recovery, the instance's local share
	// still binds as well: 5 - 3 = 2 more.
	if got := decide(10); got != 2 {
		t.Errorf("in the hand-over: %d admitted, want 2 (the local share's rest)", got)
	}
	if !eventually(func() bool { return !l.inHandOver() }) {
		t.Fatal("the hand-over never ends")
	}
	if got := decide(10); got != 1 {
		t.Errorf("after the hand-over: %d admitted, want 1 (10 - 9, on the backend alone)", got)
	}
}

// FailLocal's scratch space is pooled across requests: a request that
// applies more FailLocal rules than the one before it is decided locally
// like any other, never out of the pooled space's bounds.
func TestFailLocalDecidesARequestWiderThanTheOneBefore(t *testing.T) {
	be := &outageStore{counting: newCounting()}
	be.remote = true
	be.setDown(true)
	only := func(path string) KeyFunc {
		return func(r *http.Request) (string, error) {
			if path != "" && r.URL.Path != path {
				return "", ErrNoKey
			}
			return "k", nil
		}
	}
	l := MustNew([]Rule{
		{Name: "a", Key: only(""), Limit: 10, Period: time.Hour},
		{Name: "b", Key: only("/wide"), Limit: 10, Period: time.Hour},
		{Name: "c", Key: only("/wide"), Limit: 10, Period: time.Hour},
	}, WithBackend(be), WithLogger(slog.New(slog.DiscardHandler)), WithBreaker(BreakerConfig{Failures: 100}))
	defer l.Close()
	h := l.Handler(okHandler)
	for _, path := range []string{"/", "/wide", "/", "/wide"} {
		if got := serve(t, h, httptest.NewRequest("GET", path, nil)).Code; got != 200 {
			t.Errorf("%s with the backend down: %d, want 200 (decided locally)", path, got)
		}
	}
	if got := l.Health().Rules[1].FailLocalAdmissions; got != 2 {
		t.Errorf("rule b: %d local admissions, want 2", got)
	}
}

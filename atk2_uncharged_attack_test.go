package ceiling

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// wrongTypeKey is a healthy remote backend on a memory store where one
// key holds a value of another type: every call that names it fails, as a
// Redis script does on WRONGTYPE (the whole call, every key of it).
type wrongTypeKey struct {
	m   *memory.Store
	mu  sync.Mutex
	bad string // the first key a request named
}

func (w *wrongTypeKey) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if !isProbe(reqs) {
		w.mu.Lock()
		if w.bad == "" {
			w.bad = reqs[0].Key
		}
		bad := slices.ContainsFunc(reqs, func(q backend.Request) bool { return q.Key == w.bad })
		w.mu.Unlock()
		if bad {
			return nil, errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
		}
	}
	return w.m.Decide(ctx, reqs)
}

func (w *wrongTypeKey) Reset(ctx context.Context, keys ...string) error {
	return w.m.Reset(ctx, keys...)
}

// TestAChargeThatNeverLandsHoldsEveryFailLocalRuleToTheShare_Attack: one
// client's key on an otherwise healthy Redis fails every call that names
// it. FailLocal admits that client locally and journals the key, and the
// charge of the journal, one call, fails on it every time and keeps the
// journal (the rule's period is a day, so the local store still counts
// the unit). A change that held every FailLocal request to the share
// while the journal was not empty (d882271, reverted) held it with no
// end: an hour later another client, with all 30 of its limit left on
// Redis, was refused after its share of 10. docs/failure.md: a healthy
// backend must not hold FailLocal rules to the share for longer than a
// hand-over.
func TestAChargeThatNeverLandsHoldsEveryFailLocalRuleToTheShare_Attack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &wrongTypeKey{m: memory.New(memory.WithSweepInterval(0))}
		defer be.m.Close()
		l := MustNew([]Rule{{Name: "api", Key: RemoteAddr, Limit: 30, Period: 24 * time.Hour, FailMode: FailLocal}},
			WithBackend(be), WithInstances(3), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close()
		h := l.Handler(okHandler)
		from := func(addr string) int {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = addr
			return serve(t, h, r).Code
		}
		if code := from("192.0.2.7:1234"); code != 200 {
			t.Fatalf("the client whose key fails: %d, want FailLocal's 200", code)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		admitted := 0
		for range 15 {
			if from("198.51.100.9:1234") == 200 {
				admitted++
			}
		}
		if admitted != 15 {
			t.Errorf("an hour later, another client with 30 of 30 left on a healthy Redis: %d of 15 admitted, want 15", admitted)
		}
	})
}

package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestFourInstancesAdmitExactlyTheLimit: four Stores, each on its own
// pool as four instances of a service would be, race 1000 decisions each
// on one key at limit 100 on the server's clock: exactly 100 are admitted,
// under every algorithm whose count cannot move during the test.
func TestFourInstancesAdmitExactlyTheLimit(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	var stores []*Store
	for i := range 4 {
		pool := pgtest.Pool(t, url, func(c *pgxpool.Config) { c.MaxConns = 8 })
		if i == 0 {
			if err := Migrate(context.Background(), pool); err != nil {
				t.Fatal(err)
			}
		}
		s := New(pool)
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	for _, alg := range []backend.Algorithm{backend.RollingWindow, backend.SlidingLog, backend.GCRA, backend.Concurrency} {
		t.Run(alg.String(), func(t *testing.T) {
			req := backend.Request{Key: "exact:" + alg.String(), Algorithm: alg, Limit: 100, Period: 24 * time.Hour, Cost: 1}
			var admitted, lease atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 4000)
			for _, s := range stores {
				for range 1000 {
					wg.Go(func() {
						r := req
						r.Lease = lease.Add(1)
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						res, err := s.Decide(ctx, []backend.Request{r})
						switch {
						case err != nil:
							errs <- err
						case res[0].Allowed:
							admitted.Add(1)
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != 100 {
				t.Fatalf("admitted %d of 4000 at limit 100", got)
			}
		})
	}
}

// TestOppositeRuleOrderNeverDeadlocks: two instances send calls on the
// same two keys in opposite orders; every call is decided and none is
// aborted as a deadlock (none is sent again), because the decision locks keys in sorted order.
func TestOppositeRuleOrderNeverDeadlocks(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	a, b := pgtest.Pool(t, url), pgtest.Pool(t, url)
	if err := Migrate(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	k1, k2 := "order:one", "order:two"
	rule := func(key string) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.RollingWindow, Limit: 1_000_000, Period: time.Hour, Cost: 1}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var stores []*Store
	for i, pool := range []*pgxpool.Pool{a, b} {
		s := New(pool, WithJanitor(0, 0))
		stores = append(stores, s)
		reqs := []backend.Request{rule(k1), rule(k2)}
		if i == 1 {
			reqs = []backend.Request{rule(k2), rule(k1)}
		}
		for range 4 {
			wg.Go(func() {
				for range 150 {
					if _, err := s.Decide(context.Background(), reqs); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, s := range stores {
		if got := s.retries.Load(); got != 0 {
			t.Fatalf("instance %d sent %d calls again after the server aborted them", i, got)
		}
	}
	s := New(a, WithJanitor(0, 0))
	if got := remaining(t, s, rule(k1)); got != 1_000_000-1200 {
		t.Fatalf("%s: remaining %d after 1200 admissions", k1, got)
	}
}

// remaining peeks at r's key.
func remaining(t *testing.T, s *Store, r backend.Request) int64 {
	t.Helper()
	r.Cost, r.Force = 0, false
	res, err := s.Decide(context.Background(), []backend.Request{r})
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Remaining
}

// TestAbortedCallIsRetriedOnce: a call the server aborts as a
// serialization failure (40001, provoked here once by a trigger, since
// under READ COMMITTED the Store's calls queue instead) is sent once more;
// it is admitted, and every key counts it once. Deadlocks (40P01) take
// the same path; TestOppositeRuleOrderNeverDeadlocks shows the Store
// causes none.
func TestAbortedCallIsRetriedOnce(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	s := New(pool, WithJanitor(0, 0))
	r1 := backend.Request{Key: "retry:a", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 1}
	r2 := r1
	r2.Key = "retry:b"
	if _, err := s.Decide(ctx, []backend.Request{r1, r2}); err != nil { // the rows exist
		t.Fatal(err)
	}
	// A sequence, not a table: its count survives the aborted statement.
	if _, err := pool.Exec(ctx, `CREATE SEQUENCE aborts;
		CREATE FUNCTION abort_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('aborts') = 1 THEN
				RAISE EXCEPTION 'provoked serialization failure' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER abort_once BEFORE UPDATE ON ceiling_state FOR EACH ROW EXECUTE FUNCTION abort_once()`); err != nil {
		t.Fatal(err)
	}
	res, err := s.Decide(ctx, []backend.Request{r1, r2})
	if err != nil {
		t.Fatalf("Decide after a serialization failure: %v", err)
	}
	if !res[0].Allowed || !res[1].Allowed {
		t.Fatalf("the retried call was rejected: %+v", res)
	}
	for _, r := range []backend.Request{r1, r2} {
		if got := remaining(t, s, r); got != 8 {
			t.Errorf("%s: remaining %d after two admissions of 1 at limit 10", r.Key, got)
		}
	}
	if got := s.retries.Load(); got != 1 {
		t.Errorf("%d calls sent again, want the 1 the server aborted", got)
	}
}

// waitForLockWait returns once a session of pool's database waits for a
// row lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%ceiling_decide%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the call never waited for the lock")
}

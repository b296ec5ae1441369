package postgres

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/internal/model"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestResetBesideDecisionsNeverDeadlocks_Attack: a Reset of several keys
// races decisions on the same keys. The decisions lock their keys in
// sorted order; a Reset must too, or the two wait on each other's rows
// and the server aborts one as a deadlock: a Reset that fails, or a
// decision sent again.
func TestResetBesideDecisionsNeverDeadlocks_Attack(t *testing.T) {
	srv := pgtest.Shared(t)
	c, err := pgx.Connect(context.Background(), srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	// a database collating as most do (ICU), not as pgtest's C locale
	if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS reseticu"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(context.Background(), "CREATE DATABASE reseticu TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'"); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	url := srv.URL("reseticu")
	a, b := pgtest.Pool(t, url), pgtest.Pool(t, url)
	var icu bool
	if err := a.QueryRow(context.Background(), "SELECT 'reset:a' < 'reset:B'").Scan(&icu); err != nil || !icu {
		t.Fatalf("the database does not collate as en-US: %v %v", icu, err)
	}
	if err := Migrate(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	keys := []string{"reset:B", "reset:a", "reset:c"} // C: B a c; en-US: a B c
	rule := func(key string) backend.Request {
		return backend.Request{Key: key, Algorithm: backend.FixedWindow, Limit: 1_000_000, Period: time.Hour, Cost: 1}
	}
	dec := New(a, WithJanitor(0, 0))
	res := New(b, WithJanitor(0, 0))
	ctx := context.Background()
	// rows stored in another order than the sorted one
	for _, k := range keys {
		if _, err := dec.Decide(ctx, []backend.Request{rule(k)}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 2 {
		wg.Go(func() {
			for range 300 {
				if _, err := dec.Decide(ctx, []backend.Request{rule(keys[0]), rule(keys[1]), rule(keys[2])}); err != nil {
					errs <- err
					return
				}
			}
		})
		wg.Go(func() {
			for range 300 {
				if err := res.Reset(ctx, keys[2], keys[0], keys[1]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := dec.retries.Load(); got != 0 {
		t.Fatalf("%d decisions were sent again after the server aborted them", got)
	}
}

// TestResetLocksInTheDecisionsOrder_Regression: a decision holds the key
// that sorts first and then asks for the second. A Reset of both, whose
// plan reads the rows in the other order (a scan of the heap, where the
// second was written first), must wait on the first without holding the
// second, or the server aborts one of the two as a deadlock.
func TestResetLocksInTheDecisionsOrder_Regression(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	heap := func(c *pgxpool.Config) {
		for _, p := range []string{"enable_indexscan", "enable_indexonlyscan", "enable_bitmapscan"} {
			c.ConnConfig.RuntimeParams[p] = "off"
		}
	}
	a, b := pgtest.Pool(t, url), pgtest.Pool(t, url, heap)
	if err := Migrate(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, res := New(a, WithJanitor(0, 0)), New(b, WithJanitor(0, 0))
	keys := []string{"order:x", "order:y"}
	full := func(k string) string { return s.prefix + storedKey(k) }
	slices.SortFunc(keys, func(x, y string) int { return cmp.Compare(full(y), full(x)) })
	for _, k := range keys { // the key that sorts last is written first
		if _, err := s.Decide(ctx, []backend.Request{{Key: k, Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	first, second := full(keys[1]), full(keys[0])
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	lock := func(key string) error {
		_, err := tx.Exec(ctx, "SELECT 1 FROM ceiling_state WHERE key = $1 FOR UPDATE", key)
		return err
	}
	if err := lock(first); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- res.Reset(ctx, keys...) }()
	for waiting, end := false, time.Now().Add(10*time.Second); !waiting; {
		if time.Now().After(end) {
			t.Fatal("the Reset never waited on a lock")
		}
		if err := a.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%ceiling_reset%'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the Reset did not wait for the held key: %v", err)
		default:
		}
	}
	if err := lock(second); err != nil {
		t.Fatalf("the decision's second key: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var left int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM ceiling_state WHERE key = ANY ($1)", []string{first, second}).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left after the Reset (%v)", left, err)
	}
}

// TestSettlementsRaceAdmissionsMatchReplay_Attack: 8 goroutines at one
// instant make admissions, settle them (stamped refunds of part of their
// units, each named by a Once), deliver some settlements twice, and send
// some in a call that a request that never fits rejects (then again on
// their own). At one instant these commute, so every key must then hold
// what the model holds after the admitted charges (forced) and the first
// applied delivery of each settlement; a second delivery must answer as a
// peek (no stamp), a rejected call must apply nothing.
func TestSettlementsRaceAdmissionsMatchReplay_Attack(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	keys := []string{"a", "b", "c", "d"}
	algs := []backend.Algorithm{backend.GCRA, backend.FixedWindow, backend.SlidingWindow, backend.SlidingLog, backend.RollingWindow}
	rng := rand.New(rand.NewPCG(29, 0x5e77))
	var once atomic.Int64
	for round := range 6 {
		at := backendtest.Epoch.Add(time.Duration(round)*time.Hour + 1234567*time.Microsecond)
		now := at.UnixMicro()
		prefix := fmt.Sprintf("settle%d", round)
		s := New(pool, WithPrefix(prefix), WithClock(func() time.Time { return at }), WithJanitor(0, 0))
		rules := map[string]backend.Request{}
		for i, k := range keys {
			rules[k] = backend.Request{Key: k, Algorithm: algs[(round+i)%len(algs)], Limit: 30 + rng.Int64N(70), Period: time.Minute}
		}
		seeds := make([]uint64, 8)
		for g := range seeds {
			seeds[g] = rng.Uint64()
		}
		var mu sync.Mutex
		var applied []backend.Request // charges admitted (as forced) and settlements applied
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seeds[g], 3))
				var held []backend.Request // admitted requests, with their stamps
				var pending []backend.Request
				decide := func(reqs []backend.Request) []backend.Result {
					res, err := s.Decide(context.Background(), reqs)
					if err != nil {
						errs <- err
						return nil
					}
					return res
				}
				never := func(not string) backend.Request {
					for {
						if k := keys[rng.IntN(len(keys))]; k != not {
							r := rules[k]
							r.Cost = r.Limit + 1
							return r
						}
					}
				}
				for range 40 {
					if len(pending) > 0 && rng.IntN(2) == 0 {
						st := pending[len(pending)-1]
						pending = pending[:len(pending)-1]
						res := decide([]backend.Request{st})
						if res == nil {
							return
						}
						mu.Lock()
						applied = append(applied, st)
						mu.Unlock()
						continue
					}
					if len(held) == 0 || rng.IntN(2) == 0 {
						r := rules[keys[rng.IntN(len(keys))]]
						r.Cost, r.Force = 1+rng.Int64N(3), rng.IntN(10) == 0
						reqs := []backend.Request{r}
						if rng.IntN(5) == 0 {
							reqs = append(reqs, never(r.Key))
						}
						res := decide(reqs)
						if res == nil {
							return
						}
						if len(reqs) == 2 && (res[0].Stamp != 0 || res[1].Allowed) {
							errs <- fmt.Errorf("a rejected call answered %+v", res)
							return
						}
						if len(reqs) == 1 && res[0].Allowed {
							if res[0].Stamp == 0 {
								errs <- fmt.Errorf("%+v admitted without a stamp: %+v", r, res[0])
								return
							}
							a := r
							a.Stamp = res[0].Stamp
							held = append(held, a)
							a.Force, a.Stamp = true, 0
							mu.Lock()
							applied = append(applied, a)
							mu.Unlock()
						}
						continue
					}
					i := rng.IntN(len(held))
					a := held[i]
					held = slices.Delete(held, i, i+1)
					st := a
					st.Cost, st.Force, st.Once = -(1 + rng.Int64N(a.Cost)), false, once.Add(1)
					if rng.IntN(4) == 0 {
						res := decide([]backend.Request{st, never(st.Key)})
						if res == nil {
							return
						}
						if !res[0].Allowed || res[1].Allowed {
							errs <- fmt.Errorf("a settlement beside a request that never fits answered %+v", res)
							return
						}
						pending = append(pending, st) // not applied: sent again later
						continue
					}
					if decide([]backend.Request{st}) == nil {
						return
					}
					mu.Lock()
					applied = append(applied, st)
					mu.Unlock()
					if rng.IntN(3) == 0 {
						res := decide([]backend.Request{st})
						if res == nil {
							return
						}
						if !res[0].Allowed || res[0].Stamp != 0 {
							errs <- fmt.Errorf("a second delivery of %+v answered %+v", st, res[0])
							return
						}
					}
				}
				for _, st := range pending {
					if decide([]backend.Request{st}) == nil {
						return
					}
					mu.Lock()
					applied = append(applied, st)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		m := model.New()
		// charges first, then settlements: at one instant they commute, and
		// a settlement never gives back more than its admission placed
		slices.SortStableFunc(applied, func(x, y backend.Request) int { return cmp.Compare(y.Cost, x.Cost) })
		for _, r := range applied {
			if _, err := m.Decide(now, []backend.Request{r}); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			peek := rules[k]
			want, _ := m.Decide(now, []backend.Request{peek})
			got, err := s.Decide(context.Background(), []backend.Request{peek})
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != want[0] {
				t.Fatalf("round %d, key %q (%v): got %+v, the replay of %d calls holds %+v", round, k, peek.Algorithm, got[0], len(applied), want[0])
			}
			ms, ok := m.Stored(k)
			if err := inspect(pool, prefix+":"+k, ms, ok); err != nil {
				t.Fatalf("round %d, key %q: %v", round, k, err)
			}
		}
	}
}

// TestHotKeyReadsTheClockUnderItsLock_Regression: 8 goroutines hammer one
// fixed-window key of 3 per 2 ms on the server's clock, by calls of one
// request and of two (the hot key and a key of their own). A call read
// the clock before it queued for the key's row lock: behind calls that
// had since opened the next window it decided at an older instant, as on
// a clock stepped back, anchored the next window's count into the old
// window, and the call after it found the new window empty. Half the
// windows admitted more than 3 (up to 11). No window may admit more than
// its limit, counted by the admissions' stamps (their instants).
func TestHotKeyReadsTheClockUnderItsLock_Regression(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	const P, L = 2000, 3 // µs, units
	for _, several := range []bool{false, true} {
		s := New(pool, WithPrefix(fmt.Sprintf("hot%v", several)), WithJanitor(0, 0))
		hot := backend.Request{Key: "hot", Algorithm: backend.FixedWindow, Limit: L, Period: P * time.Microsecond, Cost: 1}
		var mu sync.Mutex
		per := map[int64]int{} // window start → admissions
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				reqs := []backend.Request{hot}
				if several {
					own := hot
					own.Key, own.Limit = fmt.Sprintf("own%d", g), 1_000_000_000
					reqs = append(reqs, own)
				}
				for range 400 {
					res, err := s.Decide(context.Background(), reqs)
					if err != nil {
						errs <- err
						return
					}
					if res[0].Allowed {
						mu.Lock()
						per[res[0].Stamp-res[0].Stamp%P]++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		over, most := 0, 0
		for _, n := range per {
			if n > L {
				over++
			}
			most = max(most, n)
		}
		if over > 0 {
			t.Errorf("several requests a call %v: %d of %d windows of %v admitted more than %d (up to %d)", several, over, len(per), P*time.Microsecond, L, most)
		}
	}
}

// TestConcurrentCallsNeverDeadlock_Attack: the racing calls of
// TestConcurrentMatchesReplay (one to three requests on four keys, in any
// order, keys repeated, some calls rejected and undone) match the replay
// without the server aborting any as a deadlock: an abort is retried once
// and would pass unseen, so the Stores' retry counters must stay at zero.
func TestConcurrentCallsNeverDeadlock_Attack(t *testing.T) {
	pool := migrated(t)
	d := differential(pool)
	var mu sync.Mutex
	var stores []*Store
	inner := d.New
	d.New = func(t testing.TB, now func() time.Time) backendtest.Target {
		tg := inner(t, now)
		mu.Lock()
		stores = append(stores, tg.Backend.(*Store))
		mu.Unlock()
		return tg
	}
	d.Seed = 41
	d.Concurrent(t, 8, 6, 60)
	for i, s := range stores {
		if n := s.retries.Load(); n != 0 {
			t.Fatalf("round %d: %d calls were aborted (deadlock or serialization failure) and sent again", i, n)
		}
	}
}

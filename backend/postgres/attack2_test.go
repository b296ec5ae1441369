package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// impostorTable is the column list of a table that could stand in for
// ceiling_state.
const impostorTable = "(key text PRIMARY KEY, alg smallint NOT NULL, st bigint[] NOT NULL, expires bigint NOT NULL)"

// TestResetAndJanitorIgnoreImpostorTables_Attack: decisions are pinned to
// ceiling's schema, but Reset and the janitor are plain statements on
// the session's search_path. A temporary table ceiling_state (pg_temp is
// searched first for tables) makes Reset delete from it and report
// success while the real row keeps its count, and the janitor sweep the
// impostor instead of the expired rows.
func TestResetAndJanitorIgnoreImpostorTables_Attack(t *testing.T) {
	srv := pgtest.Shared(t)
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			url := srv.Database(t)
			ctx := context.Background()
			owner := pgtest.Pool(t, url)
			if err := Migrate(ctx, owner); err != nil {
				t.Fatal(err)
			}
			pool := pgtest.Pool(t, url+"&default_query_exec_mode="+mode, func(c *pgxpool.Config) {
				c.MaxConns = 1
				c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
					_, err := conn.Exec(ctx, "CREATE TEMP TABLE ceiling_state "+impostorTable)
					return err
				}
			})
			now := time.Unix(1_800_000_000, 0)
			s := New(pool, WithJanitor(0, 0), WithPrefix(""), WithClock(func() time.Time { return now }))
			defer s.Close()
			r := backend.Request{Key: "victim", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
			for i, want := range []bool{true, false} {
				res, err := s.Decide(ctx, []backend.Request{r})
				if err != nil || res[0].Allowed != want {
					t.Fatalf("decision %d: %+v, %v; want allowed %v", i, res, err, want)
				}
			}
			if err := s.Reset(ctx, "victim"); err != nil {
				t.Fatal(err)
			}
			res, err := s.Decide(ctx, []backend.Request{r})
			if err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed {
				t.Errorf("Reset returned nil, and the key is still at its limit: it deleted from the temporary table")
			}
			now = now.Add(3 * time.Hour)
			if n := s.sweep(100); n != 1 {
				t.Errorf("the janitor deleted %d rows, want the 1 expired row of ceiling_state", n)
			}
			var left int
			if err := owner.QueryRow(ctx, "SELECT count(*) FROM public.ceiling_state").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%d expired rows left in ceiling's table after the sweep", left)
			}
		})
	}
}

// TestArrayTextKeys_Attack: a call of several requests passes its keys as
// a text[]; in every query mode (simple_protocol encodes the array as a
// literal), keys that are array syntax ("NULL", quotes, backslashes,
// braces, commas, blanks) must reach the table in their stored form and
// decide on rows of their own.
func TestArrayTextKeys_Attack(t *testing.T) {
	srv := pgtest.Shared(t)
	keys := []string{"NULL", "null", `"`, `\`, `\\"`, "{}", "{a,b}", "a,b", " ", " x ", "'", "$$", "a\tb", "\u00e9", "~sha256"}
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.Pool(t, srv.Database(t)+"&default_query_exec_mode="+mode)
			if err := Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			s := New(pool, WithJanitor(0, 0), WithPrefix(""))
			defer s.Close()
			var call []backend.Request
			for _, k := range keys {
				call = append(call, backend.Request{Key: k, Algorithm: backend.SlidingLog, Limit: 1, Period: time.Hour, Cost: 1})
			}
			res, err := s.Decide(ctx, call)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if !r.Allowed {
					t.Fatalf("key %q rejected on its first request", keys[i])
				}
			}
			for i := range call {
				res, err := s.Decide(ctx, call[i:i+1])
				if err != nil {
					t.Fatal(err)
				}
				if res[0].Allowed {
					t.Fatalf("key %q admitted a second unit at limit 1", keys[i])
				}
			}
			rows, err := pool.Query(ctx, "SELECT key FROM ceiling_state")
			if err != nil {
				t.Fatal(err)
			}
			stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, k := range keys {
				want = append(want, storedKey(k))
			}
			slices.Sort(want)
			slices.Sort(stored)
			if !slices.Equal(stored, want) {
				t.Fatalf("stored keys %q, want %q", stored, want)
			}
		})
	}
}

// TestOddSchemaName_Attack: ceiling migrated into a schema whose name
// needs quoting (a quote, a comma, a dollar, a dot, upper case) decides
// there, twice migrated, and its functions keep that schema.
func TestOddSchemaName_Attack(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	ctx := context.Background()
	const schema = `We"ird, $sch.ema`
	quoted := `"We""ird, $sch.ema"`
	owner := pgtest.Pool(t, url)
	if _, err := owner.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = quoted })
	for range 2 {
		if err := Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	one := backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour, Cost: 1}
	two := []backend.Request{one, {Key: "j", Algorithm: backend.RollingWindow, Limit: 1, Period: time.Hour, Cost: 1}}
	for i, want := range []bool{true, false} {
		for _, call := range [][]backend.Request{{one}, two} {
			res, err := s.Decide(ctx, call)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 && len(call) == 2 {
				want = false // k already spent by the lone call
			}
			if res[0].Allowed != want {
				t.Fatalf("round %d, %d requests: allowed %v, want %v", i, len(call), res[0].Allowed, want)
			}
		}
	}
	var n int
	if err := owner.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.ceiling_state", quoted)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d rows in %s.ceiling_state, want 1", n, schema)
	}
	if err := s.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
}

// TestCrashLosesOnlyTheLastDecisions_Attack: a server with
// synchronous_commit on, crashed (immediate shutdown) while decisions
// flow and started again. With SynchronousCommit every acknowledged
// decision survives; by default (asynchronous commit) the lost ones are
// at most those acknowledged in the last three wal_writer_delay (0.6 s),
// as the README promises. Either way nothing after the restart says
// anything was lost: only the outage itself is an error.
func TestCrashLosesOnlyTheLastDecisions_Attack(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(fmt.Sprintf("SynchronousCommit=%v", sync), func(t *testing.T) {
			srv := pgtest.Start(t, pgtest.Options{Settings: []string{"synchronous_commit=on", "fsync=on"}})
			pool := pgtest.Pool(t, srv.URL("postgres"), func(c *pgxpool.Config) { c.MaxConns = 4 })
			ctx := context.Background()
			var opts []MigrateOption
			if sync {
				opts = append(opts, SynchronousCommit())
			}
			if err := Migrate(ctx, pool, opts...); err != nil {
				t.Fatal(err)
			}
			s := New(pool, WithJanitor(0, 0))
			defer s.Close()
			r := backend.Request{Key: "crash", Algorithm: backend.FixedWindow, Limit: 1_000_000, Period: 24 * time.Hour, Cost: 1}
			var acks []time.Time
			start := time.Now()
			for len(acks) < 3000 && time.Since(start) < 700*time.Millisecond {
				res, err := s.Decide(ctx, []backend.Request{r})
				if err != nil || !res[0].Allowed {
					t.Fatalf("decision %d: %+v, %v", len(acks), res, err)
				}
				acks = append(acks, time.Now())
			}
			crashed := time.Now()
			if err := srv.Crash(); err != nil {
				t.Fatal(err)
			}
			peek := r
			peek.Cost = 0
			var res []backend.Result
			var err error
			for range 5 {
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				res, err = s.Decide(c, []backend.Request{peek})
				cancel()
				if err == nil {
					break
				}
				wantKind(t, err, "unreachable")
			}
			if err != nil {
				t.Fatal(err)
			}
			counted := r.Limit - res[0].Remaining
			lost := int64(len(acks)) - counted
			var recent int64
			for _, a := range acks {
				if crashed.Sub(a) <= 600*time.Millisecond {
					recent++
				}
			}
			t.Logf("%d acknowledged, %d counted after the crash, %d lost; %d acknowledged in its last 0.6 s", len(acks), counted, lost, recent)
			switch {
			case lost < 0:
				t.Fatalf("%d counted, more than the %d acknowledged", counted, len(acks))
			case sync && lost != 0:
				t.Fatalf("SynchronousCommit lost %d acknowledged decisions", lost)
			case lost > recent:
				t.Fatalf("the crash lost %d decisions, more than the %d of its last 0.6 s", lost, recent)
			}
		})
	}
}

// TestStandbyPromoted_Attack: a Store on a hot standby refuses as
// read-only, with the table logged or UNLOGGED (an unlogged table is not
// even readable during recovery); once the standby is promoted, a logged
// table's counts carried over and decisions go on from them, and an
// unlogged one starts empty, as the README says.
func TestStandbyPromoted_Attack(t *testing.T) {
	for _, unlogged := range []bool{false, true} {
		t.Run(fmt.Sprintf("unlogged=%v", unlogged), func(t *testing.T) {
			ctx := context.Background()
			primary := pgtest.Start(t, pgtest.Options{})
			ppool := pgtest.Pool(t, primary.URL("postgres"))
			var opts []MigrateOption
			if unlogged {
				opts = append(opts, Unlogged())
			}
			if err := Migrate(ctx, ppool, opts...); err != nil {
				t.Fatal(err)
			}
			ps := New(ppool, WithJanitor(0, 0))
			defer ps.Close()
			for range 3 {
				if err, _ := decideWithin(ps, 10*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			standby := pgtest.Standby(t, primary)
			spool := pgtest.Pool(t, standby.URL("postgres"))
			s := New(spool, WithJanitor(0, 0))
			defer s.Close()
			err, _ := decideWithin(s, 10*time.Second)
			wantKind(t, err, "read-only")
			checkFails(t, spool, backend.ErrReadOnly, "SQLSTATE")
			primary.Kill()
			if _, err := spool.Exec(ctx, "SELECT pg_promote(true, 30)"); err != nil {
				t.Fatal(err)
			}
			want := int64(2) // 5 less the 3 carried over
			if unlogged {
				want = 5
			}
			if got := remaining(t, s, charge); got != want {
				t.Fatalf("remaining %d on the promoted standby, want %d", got, want)
			}
		})
	}
}

// TestLaterMigrateWeakensAnotherInstancesCommit_Attack: the commit mode
// (and the table's persistence) is a property of the database that the
// last Migrate set, not of the Store that asked for it. An instance
// started with Migrate(SynchronousCommit()), because it must lose no
// acknowledged decision, had its decisions commit asynchronously from the
// moment any other instance (an older build in a rolling deploy, a
// service sharing the database) ran a default Migrate: nothing failed,
// nothing was logged. Now that Migrate fails with ErrDurability, naming
// both settings, and changes nothing; so does one asking for an UNLOGGED
// table on a logged one. With ChangeDurability it changes them.
func TestLaterMigrateWeakensAnotherInstancesCommit_Attack(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	ctx := context.Background()
	strict := pgtest.Pool(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = "on" })
	if err := Migrate(ctx, strict, SynchronousCommit()); err != nil {
		t.Fatal(err)
	}
	during := func() string {
		t.Helper()
		var got string
		err := pgx.BeginFunc(ctx, strict, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, oneSQL, nil, "k", int32(backend.FixedWindow), int64(5), int64(time.Hour/time.Microsecond),
				int64(0), int64(1), int32(0), int64(0), int64(0)); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	other := pgtest.Pool(t, url)
	for _, c := range []struct {
		opts []MigrateOption
		want []string // in the error
	}{
		{nil, []string{"installed with synchronous commit (SynchronousCommit) and a logged table", "asks for asynchronous commit (no SynchronousCommit)"}},
		{[]MigrateOption{SynchronousCommit(), Unlogged()}, []string{"a logged table (no Unlogged)", "asks for synchronous commit (SynchronousCommit) and an UNLOGGED table (Unlogged)"}},
	} {
		err := Migrate(ctx, other, c.opts...)
		if !errors.Is(err, ErrDurability) {
			t.Fatalf("Migrate(%d options) over a SynchronousCommit schema: %v, want ErrDurability", len(c.opts), err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the error %q does not say %q", err, w)
			}
		}
		if got := during(); got != "on" {
			t.Fatalf("after a refused Migrate, the SynchronousCommit instance's decisions commit with synchronous_commit %q", got)
		}
		if got := persistence(t, strict); got != "p" {
			t.Fatalf("relpersistence %q after a refused Migrate, want p", got)
		}
	}
	if err := Migrate(ctx, strict, SynchronousCommit()); err != nil {
		t.Fatalf("Migrate with the installed options: %v", err)
	}
	if err := Migrate(ctx, other, ChangeDurability()); err != nil {
		t.Fatal(err)
	}
	if got := during(); got != "off" {
		t.Fatalf("synchronous_commit %q after Migrate(ChangeDurability()), want off", got)
	}
}

// TestMigrateWhileDeciding_Attack: instances starting (Migrate, twice at
// once, with the default options each time) while others decide: no
// decision fails and the key admits exactly its limit.
func TestMigrateWhileDeciding_Attack(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	ctx := context.Background()
	s := New(pool, WithJanitor(0, 0), WithPrefix("atk-mig"))
	defer s.Close()
	const limit = 300
	r := backend.Request{Key: "k", Algorithm: backend.SlidingLog, Limit: limit, Period: time.Hour, Cost: 1}
	two := []backend.Request{r, {Key: "j", Algorithm: backend.GCRA, Limit: 1_000, Period: time.Hour, Cost: 1}}
	var admitted, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				call := []backend.Request{r}
				if (g+i)%2 == 1 {
					call = two
				}
				res, err := s.Decide(ctx, call)
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case res[0].Allowed:
					admitted.Add(1)
				}
			}
		})
	}
	for range 3 {
		var mg sync.WaitGroup
		for range 2 {
			mg.Go(func() {
				if err := Migrate(ctx, pool); err != nil {
					t.Error(err)
				}
			})
		}
		mg.Wait()
	}
	wg.Wait()
	if failed.Load() > 0 || admitted.Load() != limit {
		t.Fatalf("%d admitted at limit %d, %d failed (first: %v) while instances migrated", admitted.Load(), limit, failed.Load(), firstErr.Load())
	}
}

// TestLongRuleNameThroughTheLimiter_Attack: a rule name of 1000 bytes
// (ceiling bounds only its characters) makes every stored key longer than
// 512 bytes: the limiter's users still get 200, 200, then 429 with its
// headers at limit 2, Health stays healthy, and the one row stored is a
// digest naming neither the client's address nor the rule.
func TestLongRuleNameThroughTheLimiter_Attack(t *testing.T) {
	pool := migrated(t)
	name := strings.Repeat("r", 1000)
	l := ceiling.MustNew([]ceiling.Rule{{Name: name, Key: ceiling.RemoteAddr, Limit: 2, Period: time.Hour}},
		ceiling.WithBackend(New(pool, WithJanitor(0, 0))), ceiling.WithKeySecret([]byte(strings.Repeat("s", 32))),
		ceiling.WithTimeout(5*time.Second))
	defer l.Close()
	if err := l.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for i, want := range []int{200, 200, 429} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "198.51.100.7:1234"
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Fatalf("request %d: %d %q, want %d", i, rec.Code, rec.Body.String(), want)
		}
		if want == 429 && rec.Header().Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %v", rec.Header())
		}
	}
	if hl := l.Health(); hl.Status != "healthy" {
		t.Fatalf("health %+v", hl)
	}
	rows, err := pool.Query(context.Background(), "SELECT key FROM ceiling_state")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || !strings.HasPrefix(keys[0], "ceiling:~sha256:") || len(keys[0]) != len("ceiling:~sha256:")+64 ||
		strings.Contains(keys[0], "198.51.100.7") {
		t.Fatalf("stored keys %q, want one ceiling:~sha256: digest", keys)
	}
}

// TestKeysOnALatin1Database_Attack: backend.Request bounds no key's bytes,
// and memory and Redis decide any key. On a database whose encoding is
// not UTF-8 (LATIN1 here, SQL_ASCII alike), a valid UTF-8 key with a
// character the encoding lacks failed every call (22P05, a backend
// failure to the limiter, its message quoting the key's bytes). Each such
// key must decide on a row of its own.
func TestKeysOnALatin1Database_Attack(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	admin := pgtest.Pool(t, srv.URL("postgres"))
	if _, err := admin.Exec(ctx, "CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, srv.URL("latin1")+"&client_encoding=UTF8")
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	keys := []string{"\u20ac", "\u65e5\u672c", "\U0001F600", "\u00e9", "e"}
	for round, want := range []bool{true, false} {
		for _, k := range keys {
			for _, call := range [][]backend.Request{
				{{Key: k, Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}},
				{{Key: k + "/a", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1},
					{Key: k + "/b", Algorithm: backend.GCRA, Limit: 1, Period: time.Hour, Cost: 1}},
			} {
				res, err := s.Decide(ctx, call)
				if err != nil {
					t.Fatalf("round %d, key %q: %v", round, k, err)
				}
				if res[0].Allowed != want {
					t.Fatalf("round %d, key %q: allowed %v, want %v at limit 1", round, k, res[0].Allowed, want)
				}
			}
		}
	}
	if err := s.Reset(ctx, keys...); err != nil {
		t.Fatal(err)
	}
}

// TestDifferentialInPoolerModes_Attack: the model-based test, and 8
// goroutines on shared keys, in the query modes transaction pooling
// needs (an unnamed statement per call; the simple protocol, with every
// argument a literal): the same answers and states as the model.
func TestDifferentialInPoolerModes_Attack(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := migrated(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			d := differential(pool)
			d.Sequences = 60
			d.Run(t)
			differential(pool).Concurrent(t, 8, 10, 40)
		})
	}
}

// TestStalledTableFailsOverUnderConcurrency_Regression: the table stalls
// (an operator's transaction holds an ACCESS EXCLUSIVE lock on it, as
// ALTER TABLE ... SET LOGGED of a second instance's Migrate does while it
// rewrites the table) while more requests arrive at once than the pool
// has sessions. The server, not this process, is what stops answering;
// the requests must reach the fail mode (FailLocal: 200 under the limit).
// Every request that found the pool's sessions busy was shed as this
// process's overload instead (backend.ErrNotSent): 20 to 25 of 48 were
// 503s.
func TestStalledTableFailsOverUnderConcurrency_Regression(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 4; c.MinConns = 4 })
	l := ceiling.MustNew([]ceiling.Rule{{Name: "api", Key: ceiling.RemoteAddr, Limit: 1000, Period: time.Hour}},
		ceiling.WithBackend(New(pool, WithJanitor(0, 0), WithPrefix("atk-stall"))),
		ceiling.WithLogger(slog.New(slog.DiscardHandler)), ceiling.WithTimeout(200*time.Millisecond))
	defer l.Close()
	if err := l.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	ctx := context.Background()
	owner := pgtest.Pool(t, pool.Config().ConnString())
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE ceiling_state IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for range 4 {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("GET", "/", nil)
				req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", g+1)
				h.ServeHTTP(rec, req)
				mu.Lock()
				codes[rec.Code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	hl := l.Health()
	t.Logf("statuses %v; health %s, reason %q, shed %d", codes, hl.Status, hl.Reason, hl.Shed)
	if codes[http.StatusOK] != 48 {
		t.Fatalf("statuses %v while the table was locked; want the fail mode's 200 for all 48 (health %s, reason %q, %d shed)",
			codes, hl.Status, hl.Reason, hl.Shed)
	}
}

// TestBusyPoolOnAnAnsweringServerIsNotSent: the counterpart of the
// stalled table. A call that gets no session by its deadline, on a server
// that answers, is this process's overload (backend.ErrNotSent), never a
// timeout of the server. The pool's one session is held, so every call
// waits for it however loaded the machine is; once it is given back, the
// calls are sent and answered.
func TestBusyPoolOnAnAnsweringServerIsNotSent(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 1; c.MinConns = 1 })
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			err, _ := decideWithin(s, 40*time.Millisecond)
			errs <- err
		})
	}
	wg.Wait()
	held.Release()
	close(errs)
	for err := range errs {
		if !errors.Is(err, backend.ErrNotSent) {
			t.Fatalf("a call on a busy pool of an answering server: %v, want backend.ErrNotSent", err)
		}
	}
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatalf("once the session is free: %v", err)
	}
}

// TestCrashEmptiesAnUnloggedTable_Attack: with Migrate(Unlogged()), a
// crash (not a clean restart) empties the table, as the README warns:
// every key is back to its full quota, and nothing says so afterwards.
func TestCrashEmptiesAnUnloggedTable_Attack(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	pool := pgtest.Pool(t, srv.URL("postgres"))
	if err := Migrate(context.Background(), pool, Unlogged()); err != nil {
		t.Fatal(err)
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	for range 3 {
		if err, _ := decideWithin(s, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 5 {
		if err, _ = decideWithin(s, 5*time.Second); err == nil {
			break
		}
		wantKind(t, err, "unreachable")
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s, charge); got != 1 {
		t.Fatalf("remaining %d after a clean restart, want 1: an unlogged table survives it", got)
	}
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	var res []backend.Result
	peek := charge
	peek.Cost = 0
	for range 5 {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err = s.Decide(c, []backend.Request{peek})
		cancel()
		if err == nil {
			break
		}
		wantKind(t, err, "unreachable")
	}
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != charge.Limit {
		t.Fatalf("remaining %d after a crash, want the full %d: the unlogged table was not emptied", res[0].Remaining, charge.Limit)
	}
}

// TestSynchronousCommitCoversSeveralRequestCalls_Attack: Migrate's
// SynchronousCommit removes the asynchronous commit from the function by
// its text; a call of several requests (ceiling_decide, not the lone
// call's function) must commit as the server says too, and
// asynchronously by default.
func TestSynchronousCommitCoversSeveralRequestCalls_Attack(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = "on" })
	ctx := context.Background()
	s := New(pool, WithPrefix(""), WithJanitor(0, 0))
	defer s.Close()
	two := []backend.Request{
		{Key: "a", Algorithm: backend.FixedWindow, Limit: 5, Period: time.Hour, Cost: 1},
		{Key: "b", Algorithm: backend.GCRA, Limit: 5, Period: time.Hour, Cost: 1},
	}
	during := func() string {
		t.Helper()
		sql, args := s.call(two)
		var got string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := during(); got != "off" {
		t.Fatalf("synchronous_commit %q in a two-request decision by default, want off", got)
	}
	if err := Migrate(ctx, pool, SynchronousCommit(), ChangeDurability()); err != nil {
		t.Fatal(err)
	}
	if got := during(); got != "on" {
		t.Fatalf("synchronous_commit %q in a two-request decision after Migrate(SynchronousCommit()), want on", got)
	}
}

// TestFailuresLeakNothing_Attack: through the limiter, on a server killed
// and on a wrong password, neither the log nor what the client gets
// holds the client's address or the database password, and a killed
// server's requests get the fail mode's answer.
func TestFailuresLeakNothing_Attack(t *testing.T) {
	srv, pool, _ := own(t)
	const client = "192.0.2.9"
	for _, c := range []struct {
		name string
		pool *pgxpool.Pool
	}{
		{"wrong password", pgtest.Pool(t, strings.Replace(srv.URL("postgres"), pgtest.Password, "guess-"+pgtest.Password, 1))},
		{"killed", pool},
	} {
		if c.name == "killed" {
			srv.Kill()
		}
		var log strings.Builder
		var mu sync.Mutex
		l := ceiling.MustNew([]ceiling.Rule{{Name: "api", Key: ceiling.RemoteAddr, Limit: 5, Period: time.Hour}},
			ceiling.WithBackend(New(c.pool, WithJanitor(0, 0))), ceiling.WithKeySecret([]byte(strings.Repeat("s", 32))),
			ceiling.WithLogger(slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return log.Write(p)
			}), &slog.HandlerOptions{Level: slog.LevelDebug}))), ceiling.WithTimeout(2*time.Second))
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		var seen strings.Builder
		for range 3 {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.RemoteAddr = client + ":4444"
			h.ServeHTTP(rec, req)
			fmt.Fprintf(&seen, "%d %v %s\n", rec.Code, rec.Header(), rec.Body.String())
			if rec.Code != http.StatusOK {
				t.Errorf("%s: status %d, want the fail mode's 200", c.name, rec.Code)
			}
		}
		l.Close()
		mu.Lock()
		all := log.String() + seen.String()
		mu.Unlock()
		if log.Len() == 0 {
			t.Errorf("%s: nothing logged", c.name)
		}
		for _, secret := range []string{client, pgtest.Password} {
			if strings.Contains(all, secret) {
				t.Errorf("%s: %q leaks:\n%s", c.name, secret, all)
			}
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestStaleSessionsFailOneCallEach_Attack: once the server is back (a
// restart, a failover, pg_terminate_backend of ceiling's sessions, a
// pooler's server_idle_timeout), every pooled session the server ended
// failed the next call made on it as unreachable: a pool of 8 warm
// sessions failed the next 8 decisions, each sent to the fail mode and
// counted by the breaker after the outage was over. pgxpool pings only
// sessions idle for more than a second. A call the server answered only
// with the FATAL of its ended session (57P01) did not commit, so the
// Store now sends it once more on a session that is alive; the key counts
// each decision once.
func TestStaleSessionsFailOneCallEach_Attack(t *testing.T) {
	for _, how := range []string{"pg_terminate_backend", "restart"} {
		t.Run(how, func(t *testing.T) {
			srv, pool, s := own(t, func(c *pgxpool.Config) { c.MaxConns = 8; c.MinConns = 8 })
			r := backend.Request{Key: "stale", Algorithm: backend.FixedWindow, Limit: 100, Period: time.Hour, Cost: 1}
			decide := func(d time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				_, err := s.Decide(ctx, []backend.Request{r})
				return err
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() { _ = decide(5 * time.Second) })
			}
			wg.Wait()
			switch how {
			case "restart":
				if err := srv.Restart(); err != nil {
					t.Fatal(err)
				}
			default:
				admin := pgtest.Pool(t, pool.Config().ConnString())
				if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
					t.Fatal(err)
				}
				admin.Close()
				time.Sleep(50 * time.Millisecond) // the sessions end; the server stays up
			}
			var failed int
			for range 10 {
				if err := decide(2 * time.Second); err != nil {
					t.Log(err)
					failed++
				}
			}
			if failed > 0 {
				t.Fatalf("%d of 10 decisions failed on a server that was up, after its sessions were ended", failed)
			}
			if got := s.resent.Load(); got == 0 {
				// pgxpool pings a session idle for over a second and drops a
				// dead one: on a machine slow enough that the restart or the
				// set-up took that long, no ended session was left to send on.
				t.Skip("no call was sent again and none failed: pgxpool had already dropped the ended sessions (idle over 1 s); the machine was too slow for this set-up")
			}
			if got := remaining(t, s, r); got != r.Limit-18 {
				t.Fatalf("remaining %d after 18 decisions, want %d: a call sent again counted twice or not at all", got, r.Limit-18)
			}
		})
	}
}

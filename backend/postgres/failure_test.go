package postgres

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

var charge = backend.Request{Key: "fault", Algorithm: backend.FixedWindow, Limit: 5, Period: time.Hour, Cost: 1}

// decideWithin decides charge on s with a context of d and returns the
// error and how long the call took.
func decideWithin(s *Store, d time.Duration) (error, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err := s.Decide(ctx, []backend.Request{charge})
	return err, time.Since(start)
}

// wantKind fails t unless err is a failure of kind, as ceiling reports it.
func wantKind(t *testing.T, err error, kind string) {
	t.Helper()
	if got := string(ceiling.KindOf(err)); got != kind {
		t.Fatalf("error %v is of kind %q, want %q", err, got, kind)
	}
}

// own starts a server of the test's own, migrated, and a Store on it.
func own(t *testing.T, edit ...func(*pgxpool.Config)) (*pgtest.Server, *pgxpool.Pool, *Store) {
	t.Helper()
	srv := pgtest.Start(t, pgtest.Options{})
	pool := pgtest.Pool(t, srv.URL("postgres"), edit...)
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := New(pool, WithJanitor(0, 0))
	t.Cleanup(func() { s.Close() })
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return srv, pool, s
}

// TestKilledServerIsUnreachable: a decision on a server that was killed
// fails at once as unreachable.
func TestKilledServerIsUnreachable(t *testing.T) {
	srv, _, s := own(t)
	srv.Kill()
	err, took := decideWithin(s, 5*time.Second)
	wantKind(t, err, "unreachable")
	if !errors.Is(err, backend.ErrUnreachable) {
		t.Fatalf("%v does not wrap backend.ErrUnreachable", err)
	}
	if took > 2*time.Second {
		t.Fatalf("the refused call took %v", took)
	}
}

// TestPausedServerTimesOut: a decision on a server frozen by SIGSTOP
// returns by its context's deadline, as a timeout.
func TestPausedServerTimesOut(t *testing.T) {
	srv, _, s := own(t)
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer srv.Signal(syscall.SIGCONT)
	err, took := decideWithin(s, 300*time.Millisecond)
	wantKind(t, err, "timeout")
	if took > time.Second {
		t.Fatalf("the call on a frozen server took %v, its deadline was 300ms", took)
	}
}

// TestRestartedServerKeepsState: after a restart the pool's old sessions
// fail as unreachable, a new one decides, and the key's count survived.
func TestRestartedServerKeepsState(t *testing.T) {
	srv, _, s := own(t)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var res []backend.Result
	var err error
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err = s.Decide(ctx, []backend.Request{charge})
		cancel()
		if err == nil {
			break
		}
		wantKind(t, err, "unreachable")
	}
	if err != nil {
		t.Fatalf("three calls after the restart failed, the last with %v", err)
	}
	if got := res[0].Remaining; got != 3 {
		t.Fatalf("remaining %d after two admissions across the restart, want 3", got)
	}
}

// TestStatementTimeoutIsATimeout: a decision that waits for a row lock
// longer than the session's statement_timeout fails as a timeout (57014).
func TestStatementTimeoutIsATimeout(t *testing.T) {
	dbURL := pgtest.Shared(t).Database(t)
	pool := pgtest.Pool(t, dbURL, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "200" })
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM ceiling_state WHERE key = 'ceiling:fault' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	err, took := decideWithin(s, 10*time.Second)
	wantKind(t, err, "timeout")
	if !strings.Contains(err.Error(), "57014") {
		t.Fatalf("%v is not the statement timeout", err)
	}
	if took > 3*time.Second {
		t.Fatalf("the call took %v under a 200ms statement timeout", took)
	}
}

// TestExhaustedPoolIsNotSent: with every connection of the pool held, a
// decision returns by its deadline with backend.ErrNotSent: it never
// reached the server, which is not at fault ("overloaded" to ceiling).
func TestExhaustedPoolIsNotSent(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	err, took := decideWithin(s, 200*time.Millisecond)
	if !errors.Is(err, backend.ErrNotSent) {
		t.Fatalf("Decide on an exhausted pool: %v, want backend.ErrNotSent", err)
	}
	wantKind(t, err, "overloaded")
	if took > time.Second {
		t.Fatalf("the call took %v, its deadline was 200ms", took)
	}
}

// TestWrittenCallHasItsBudget: once a call is written, a deadline of its
// context that passes meanwhile does not cut it: it has the whole budget
// Decide was entered with, counted from the write. A call that waits
// 300ms for a row lock under a 1s budget succeeds, although its caller's
// context is cancelled after 50ms.
func TestWrittenCallHasItsBudget(t *testing.T) {
	pool := migrated(t)
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM ceiling_state WHERE key = 'ceiling:fault' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	call, cancel := context.WithTimeout(ctx, time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := s.Decide(call, []backend.Request{charge})
		done <- err
	}()
	waitForLockWait(t, pool)
	cancel() // the caller gives up; the written call goes on
	time.Sleep(250 * time.Millisecond)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("a written call under its budget: %v", err)
	}
}

// checkFails runs Limiter.Check on a limiter deciding on pool and requires
// it to fail with kind, naming the cause.
func checkFails(t *testing.T, pool *pgxpool.Pool, kind error, cause string) {
	t.Helper()
	// Every call of the check dials anew (the pool keeps no failed
	// session), and a SCRAM handshake on a loaded machine can outlast the
	// default 100ms: a longer timeout keeps the kind, not the speed, under
	// test.
	l := ceiling.MustNew([]ceiling.Rule{{Name: "otp", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Hour}},
		ceiling.WithBackend(New(pool, WithJanitor(0, 0))), ceiling.WithLogger(slog.New(slog.DiscardHandler)),
		ceiling.WithTimeout(time.Second))
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := l.Check(ctx)
	if !errors.Is(err, kind) {
		t.Fatalf("Check: %v, want it to wrap %v", err, kind)
	}
	t.Logf("Check: %v", err)
	if false {
	}
	if !strings.Contains(err.Error(), cause) {
		t.Fatalf("Check: %v, want it to name %s", err, cause)
	}
	if h := l.Health(); h.Status != "degraded" || h.Reason != ceiling.KindOf(kind) {
		t.Fatalf("health after the check: %+v, want degraded, reason %q", h, ceiling.KindOf(kind))
	}
}

// TestReadOnly: a standby (pg_is_in_recovery) and a database whose
// transactions are read-only refuse the decision's write (25006): a
// read-only failure, which Limiter.Check refuses at start.
func TestReadOnly(t *testing.T) {
	t.Run("standby", func(t *testing.T) {
		primary, _, _ := own(t)
		standby := pgtest.Standby(t, primary)
		pool := pgtest.Pool(t, standby.URL("postgres"))
		var recovering bool
		if err := pool.QueryRow(context.Background(), "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil || !recovering {
			t.Fatalf("pg_is_in_recovery() = %v, %v on the standby", recovering, err)
		}
		s := New(pool, WithJanitor(0, 0))
		defer s.Close()
		err, _ := decideWithin(s, 10*time.Second)
		if !errors.Is(err, backend.ErrReadOnly) {
			t.Fatalf("Decide on a standby: %v, want backend.ErrReadOnly", err)
		}
		checkFails(t, pool, backend.ErrReadOnly, "25006")
	})
	t.Run("default_transaction_read_only", func(t *testing.T) {
		srv := pgtest.Shared(t)
		dbURL := srv.Database(t)
		if err := Migrate(context.Background(), pgtest.Pool(t, dbURL)); err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(dbURL)
		admin := pgtest.Pool(t, srv.URL("postgres"))
		if _, err := admin.Exec(context.Background(), "ALTER DATABASE "+strings.TrimPrefix(u.Path, "/")+" SET default_transaction_read_only = on"); err != nil {
			t.Fatal(err)
		}
		checkFails(t, pgtest.Pool(t, dbURL), backend.ErrReadOnly, "25006")
	})
}

// TestWrongPassword is an auth failure (28P01), which Limiter.Check
// refuses at start.
func TestWrongPassword(t *testing.T) {
	srv := pgtest.Shared(t)
	pool := pgtest.Pool(t, strings.Replace(srv.URL("postgres"), pgtest.Password, "guess", 1))
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	err, _ := decideWithin(s, 10*time.Second)
	if !errors.Is(err, backend.ErrAuth) {
		t.Fatalf("Decide with a wrong password: %v, want backend.ErrAuth", err)
	}
	checkFails(t, pool, backend.ErrAuth, "28P01")
}

package postgres

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func persistence(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var p string
	if err := pool.QueryRow(context.Background(), "SELECT relpersistence::text FROM pg_class WHERE oid = 'ceiling_state'::regclass").Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMigrateConcurrentlyAndSwitchPersistence: instances that migrate at
// once all succeed (the advisory lock queues them), the table is logged
// by default, Unlogged makes it UNLOGGED and a later default Migrate
// logged again, keeping its rows.
func TestMigrateConcurrentlyAndSwitchPersistence(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Shared(t).Database(t))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- Migrate(ctx, pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Migrate alongside three others: %v", err)
		}
	}
	if got := persistence(t, pool); got != "p" {
		t.Fatalf("relpersistence %q after a default Migrate, want p (logged)", got)
	}
	s := New(pool, WithJanitor(0, 0))
	defer s.Close()
	if err, _ := decideWithin(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool, Unlogged(), ChangeDurability()); err != nil {
		t.Fatal(err)
	}
	if got := persistence(t, pool); got != "u" {
		t.Fatalf("relpersistence %q after Migrate(Unlogged()), want u", got)
	}
	if err := Migrate(ctx, pool, ChangeDurability()); err != nil {
		t.Fatal(err)
	}
	if got := persistence(t, pool); got != "p" {
		t.Fatalf("relpersistence %q after a default Migrate again, want p", got)
	}
	if got := remaining(t, s, charge); got != 4 {
		t.Fatalf("remaining %d after the switches, want the 4 left before them", got)
	}
}

// TestStoredKeysAreDigests: through a limiter with a key secret, the row
// of a client's key names a digest and the rule, never the client's
// address.
func TestStoredKeysAreDigests(t *testing.T) {
	pool := migrated(t)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 5, Period: time.Hour}},
		ceiling.WithBackend(New(pool, WithJanitor(0, 0))), ceiling.WithKeySecret([]byte(strings.Repeat("k", 32))))
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "203.0.113.9:4711"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	rows, err := pool.Query(context.Background(), "SELECT key FROM ceiling_state")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 1 || strings.Contains(keys[0], "203.0.113") || !strings.HasPrefix(keys[0], "ceiling:{") || !strings.HasSuffix(keys[0], "}:r") {
		t.Fatalf("stored keys %q, want one ceiling:{digest}:r without the address", keys)
	}
}

// TestDecisionsCommitAsynchronouslyUnlessAsked: a session configured with
// synchronous_commit on runs a decision's transaction with it off (no
// disk flush waited for), and only that transaction: the session's next
// statement has it on again. After Migrate(SynchronousCommit()) the
// decision keeps the session's setting.
func TestDecisionsCommitAsynchronouslyUnlessAsked(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = "on" })
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	setting := func() (during, after string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, oneSQL, nil, "k", int32(backend.FixedWindow), int64(5), int64(time.Hour/time.Microsecond),
				int64(0), int64(1), int32(0), int64(0), int64(0)); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&during)
		})
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&after)
		}
		if err != nil {
			t.Fatal(err)
		}
		return during, after
	}
	if during, after := setting(); during != "off" || after != "on" {
		t.Fatalf("synchronous_commit %q in a decision's transaction and %q after it, want off and on", during, after)
	}
	if err := Migrate(ctx, pool, SynchronousCommit(), ChangeDurability()); err != nil {
		t.Fatal(err)
	}
	if during, after := setting(); during != "on" || after != "on" {
		t.Fatalf("after Migrate(SynchronousCommit()): synchronous_commit %q in a decision's transaction and %q after it, want on and on", during, after)
	}
}

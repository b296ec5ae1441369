package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/jackc/pgx/v5"
)

// TestLoneDecisionRowVersions: a call of one request writes one row
// version when it admits (an insert for a new key, an update for a stored
// one) and none when it rejects or peeks, so that the lock taken to decide
// costs no write of its own. The writes are read from the transaction's
// own counters (pg_stat_xact_user_tables), with the Store's statement run
// inside a transaction that the test rolls back.
func TestLoneDecisionRowVersions(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	s := New(pool, WithJanitor(0, 0))
	t.Cleanup(func() { s.Close() })
	writes := func(r backend.Request) (ins, upd, del int64, res []int64) {
		t.Helper()
		const counters = `SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables
			WHERE relid = 'ceiling_state'::regclass`
		var ins0, upd0, del0 int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The counters may hold the connection's earlier writes
			// not yet reported: take the difference.
			if err := tx.QueryRow(ctx, counters).Scan(&ins0, &upd0, &del0); err != nil {
				return err
			}
			sql, args := s.call([]backend.Request{r})
			if err := tx.QueryRow(ctx, sql, args...).Scan(&res); err != nil {
				return err
			}
			return tx.QueryRow(ctx, counters).Scan(&ins, &upd, &del)
		})
		if err != nil {
			t.Fatal(err)
		}
		return ins - ins0, upd - upd0, del - del0, res
	}
	r := backend.Request{Key: "versions:k", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	if ins, upd, del, res := writes(r); res[2] != 1 || ins != 1 || upd != 0 || del != 0 {
		t.Fatalf("admission on a new key: allowed %d, %d inserts, %d updates, %d deletes; want 1, 1, 0, 0", res[2], ins, upd, del)
	}
	if _, err := s.Decide(ctx, []backend.Request{r}); err != nil { // the row exists, the quota is spent
		t.Fatal(err)
	}
	if ins, upd, del, res := writes(r); res[2] != 0 || ins+upd+del != 0 {
		t.Fatalf("rejection: allowed %d, %d inserts, %d updates, %d deletes; want 0 and no write", res[2], ins, upd, del)
	}
	peek := r
	peek.Cost = 0
	if ins, upd, del, res := writes(peek); res[2] != 1 || ins+upd+del != 0 {
		t.Fatalf("peek: allowed %d, %d inserts, %d updates, %d deletes; want 1 and no write", res[2], ins, upd, del)
	}
	r.Limit = 2
	if ins, upd, del, res := writes(r); res[2] != 1 || ins != 0 || upd != 1 || del != 0 {
		t.Fatalf("admission on a stored key: allowed %d, %d inserts, %d updates, %d deletes; want 1, 0, 1, 0", res[2], ins, upd, del)
	}
	r.Key = "versions:absent"
	r.Cost = 2
	r.Limit = 1
	if ins, upd, del, res := writes(r); res[2] != 0 || ins+upd+del != 0 {
		t.Fatalf("rejection on a new key: allowed %d, %d inserts, %d updates, %d deletes; want 0 and no write", res[2], ins, upd, del)
	}
}

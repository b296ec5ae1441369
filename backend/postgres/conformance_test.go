package postgres

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// migrated returns a pool on a fresh, migrated database of the shared
// server.
func migrated(t testing.TB, edit ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Shared(t).Database(t), edit...)
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestConformance runs the suite every backend passes.
func TestConformance(t *testing.T) {
	pool := migrated(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
		s := New(pool, WithClock(now), WithJanitor(0, 0))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

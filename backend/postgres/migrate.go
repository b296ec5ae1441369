package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	//go:embed schema.sql
	schemaSQL string
	//go:embed algorithms.sql
	algorithmsSQL string
	//go:embed decide.sql
	decideSQL string
)

// migrateLock is the pg_advisory_xact_lock key Migrate holds, so that
// instances starting together create the schema one after another.
const migrateLock = 0x6365696c696e67 // "ceiling"

// MigrateOption configures [Migrate].
type MigrateOption func(*migrateConfig)

type migrateConfig struct{ unlogged bool }

// Unlogged makes the table UNLOGGED: its writes skip the write-ahead log,
// which makes decisions cheaper for the server, but PostgreSQL empties an
// unlogged table after a crash (not after a clean restart) and does not
// replicate it to standbys. After a crash, then, every key is back to its
// full quota and every lease is forgotten, as with a Redis without
// persistence. A logged table (the default) keeps the limits through a
// crash and a failover. Migrate with or without Unlogged on an existing
// table switches it (ALTER TABLE ... SET UNLOGGED / LOGGED rewrites it).
func Unlogged() MigrateOption { return func(c *migrateConfig) { c.unlogged = true } }

// Migrate creates or updates what the Store needs in the pool's database,
// in the first schema of its search_path: the table ceiling_state and the
// functions ceiling_decide and its helpers. It is idempotent and runs in
// one transaction under an advisory lock, so that instances starting
// together may all call it. Run it once at start-up, before [New]'s Store
// decides, with a role that may create tables and functions.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...MigrateOption) error {
	var cfg migrateConfig
	for _, o := range opts {
		o(&cfg)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		schema := schemaSQL
		if cfg.unlogged {
			schema = strings.Replace(schema, "CREATE TABLE", "CREATE UNLOGGED TABLE", 1)
		}
		for _, sql := range []string{schema, algorithmsSQL, decideSQL} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		var persistence string
		if err := tx.QueryRow(ctx, "SELECT relpersistence::text FROM pg_class WHERE oid = 'ceiling_state'::regclass").Scan(&persistence); err != nil {
			return err
		}
		switch {
		case cfg.unlogged && persistence == "p":
			_, err := tx.Exec(ctx, "ALTER TABLE ceiling_state SET UNLOGGED")
			return err
		case !cfg.unlogged && persistence == "u":
			_, err := tx.Exec(ctx, "ALTER TABLE ceiling_state SET LOGGED")
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ceiling/backend/postgres: migrate: %w", classify(err))
	}
	return nil
}

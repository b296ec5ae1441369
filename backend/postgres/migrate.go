package postgres

import (
	"context"
	_ "embed"
	"errors"
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

type migrateConfig struct{ unlogged, syncCommit, change bool }

// ErrDurability is the error [Migrate] returns, with both settings named,
// when the schema installed in the database has another commit mode or
// table persistence than the one asked for and [ChangeDurability] was not
// given: every instance on the database shares them, so one instance's
// Migrate must not silently weaken what another was started with.
var ErrDurability = errors.New("the installed schema's durability differs from the one asked for")

// asyncCommit is the line of decide.sql that makes a decision's
// transaction commit without waiting for its WAL flush.
const asyncCommit = "  sc := set_config('synchronous_commit', 'off', true);\n"

// Unlogged makes the table UNLOGGED: its writes skip the write-ahead log,
// which makes decisions cheaper for the server, but PostgreSQL empties an
// unlogged table after a crash (not after a clean restart) and does not
// replicate it to standbys. After a crash, then, every key is back to its
// full quota and every lease is forgotten, as with a Redis without
// persistence. A logged table (the default) keeps the limits through a
// crash and a failover. Migrate with or without Unlogged on an existing
// table switches it (ALTER TABLE ... SET UNLOGGED / LOGGED rewrites it).
//
// On a database whose table exists with the other choice, Migrate refuses
// with [ErrDurability] unless [ChangeDurability] is given too.
func Unlogged() MigrateOption { return func(c *migrateConfig) { c.unlogged = true } }

// SynchronousCommit makes every decision's commit wait for its WAL flush,
// as the server's synchronous_commit says. Without it a decision commits
// asynchronously (synchronous_commit off for its transaction alone): the
// server acknowledges it before its WAL reaches the disk, which saves a
// disk flush per decision, and a crash of the server (not a clean restart)
// loses the decisions of at most the last three wal_writer_delay (0.6 s by
// default), each one unit a key may admit again, as a Redis with
// appendfsync everysec loses its last second. The table stays logged and
// replicated either way; with synchronous replication, an asynchronous
// commit does not wait for the standby either.
//
// The commit mode belongs to the functions, which every instance on the
// database shares: on a database whose functions commit the other way,
// Migrate refuses with [ErrDurability] unless [ChangeDurability] is given
// too.
func SynchronousCommit() MigrateOption { return func(c *migrateConfig) { c.syncCommit = true } }

// ChangeDurability lets Migrate change the installed schema's commit mode
// and table persistence to the ones its other options ask for. They are
// the database's, not the instance's: every Store on the database then
// commits and keeps its table that way, so give it only when the
// deployment means to change them for every instance (and run it from one
// place, as a schema change). Without it, Migrate on a schema installed
// with another commit mode or persistence fails with [ErrDurability] and
// changes nothing.
func ChangeDurability() MigrateOption { return func(c *migrateConfig) { c.change = true } }

// durability names a commit mode and a table persistence as the options
// that ask for them.
func durability(syncCommit, unlogged bool) string {
	commit, table := "asynchronous commit (no SynchronousCommit)", "a logged table (no Unlogged)"
	if syncCommit {
		commit = "synchronous commit (SynchronousCommit)"
	}
	if unlogged {
		table = "an UNLOGGED table (Unlogged)"
	}
	return commit + " and " + table
}

// Migrate creates or updates what the Store needs in the pool's database,
// in the first existing schema of its search_path: the table
// ceiling_state and the functions ceiling_decide and its helpers. The
// functions the Store calls keep that schema as their search_path, behind
// pg_catalog and before pg_temp, so that no other object on a caller's
// search_path can replace the table or a helper. It is idempotent and runs
// in one transaction under an advisory lock, so that instances starting
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
		// Everything goes to the current schema, and the entry points
		// keep this path (SET search_path FROM CURRENT).
		var ns *string
		if err := tx.QueryRow(ctx, "SELECT current_schema()").Scan(&ns); err != nil {
			return err
		}
		if ns == nil {
			return errors.New("no schema of the search_path exists")
		}
		if _, err := tx.Exec(ctx, "SELECT set_config('search_path', quote_ident($1) || ', pg_temp', true)", *ns); err != nil {
			return err
		}
		if !cfg.change {
			if err := sameDurability(ctx, tx, *ns, cfg); err != nil {
				return err
			}
		}
		schema, decide := schemaSQL, decideSQL
		if cfg.unlogged {
			schema = strings.Replace(schema, "CREATE TABLE", "CREATE UNLOGGED TABLE", 1)
		}
		if cfg.syncCommit {
			decide = strings.ReplaceAll(decide, asyncCommit, "")
		}
		for _, sql := range []string{schema, algorithmsSQL, decide} {
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

// sameDurability returns an [ErrDurability] naming both settings when
// what schema ns holds (the decision functions' commit mode, the table's
// persistence) differs from what cfg asks for. A schema not installed yet
// has nothing to differ.
func sameDurability(ctx context.Context, tx pgx.Tx, ns string, cfg migrateConfig) error {
	var functions int
	var async bool
	err := tx.QueryRow(ctx, `SELECT count(*)::int, coalesce(bool_or(strpos(p.prosrc, $2) > 0), false)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname IN ('ceiling_decide', 'ceiling_decide_one')`,
		ns, strings.TrimSpace(asyncCommit)).Scan(&functions, &async)
	if err != nil {
		return err
	}
	var persistence *string
	err = tx.QueryRow(ctx, `SELECT max(c.relpersistence::text) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'ceiling_state' AND c.relkind = 'r'`, ns).Scan(&persistence)
	if err != nil {
		return err
	}
	installedSync, installedUnlogged := cfg.syncCommit, cfg.unlogged
	if functions > 0 {
		installedSync = !async
	}
	if persistence != nil {
		installedUnlogged = *persistence == "u"
	}
	if installedSync == cfg.syncCommit && installedUnlogged == cfg.unlogged {
		return nil
	}
	return fmt.Errorf("%w: schema %q is installed with %s, and this Migrate asks for %s; "+
		"it changes every instance on the database, so pass ChangeDurability to do it, or the installed options to keep them",
		ErrDurability, ns, durability(installedSync, installedUnlogged), durability(cfg.syncCommit, cfg.unlogged))
}

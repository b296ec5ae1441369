// Package postgres is ceiling's PostgreSQL backend: a [backend.Backend] on
// a pgx v5 [pgxpool.Pool], for services whose only store shared by every
// instance is their database.
//
// Each decision is one call of the PL/pgSQL function ceiling_decide, one
// round trip however many rules: it locks the rows of the call's keys in
// sorted order (so two calls on the same keys in opposite rule order queue
// instead of deadlocking), reads them, decides with the server's clock
// (clock_timestamp(), in µs) and the integer arithmetic of
// backend/ALGORITHMS.md, and writes all or nothing in the same
// transaction. Memory, Redis and Postgres give the same answers from the
// same state; the differential test holds this store to the reference
// model. A call the server aborts anyway (deadlock detected, serialization
// failure) is sent once more: the aborted transaction wrote nothing.
//
// [Migrate] creates the table ceiling_state and the functions, once per
// database, idempotently and under an advisory lock. Rows hold what
// ceiling passes as a key ({digest}:rule: an HMAC digest under the
// limiter's key secret, never a raw identifier) and the state; an
// expiry column lets the Store's janitor delete idle keys in bounded
// batches (see [WithJanitor]), as Redis TTLs do. The table is logged by
// default, or UNLOGGED (see [Unlogged]); a decision commits without
// waiting for its WAL flush unless Migrate was given [SynchronousCommit].
// Both belong to the database, not to one instance: a Migrate asking for
// others than the installed ones fails with [ErrDurability] unless it is
// given [ChangeDurability].
// The functions the Store calls keep the search_path Migrate gave them,
// so objects on a session's search_path cannot stand in for ceiling's.
//
// Decide returns by its context's deadline, and errors wrap the kind of
// failure their cause shows (backend.ErrUnreachable, ErrAuth, ErrReadOnly,
// ErrOutOfMemory, or context.DeadlineExceeded for a statement timeout), so
// that the limiter's breaker, fail modes, health and metrics work
// unchanged, and Limiter.Check refuses a standby or a wrong password at
// start.
//
// The decision needs READ COMMITTED, PostgreSQL's default: under
// REPEATABLE READ or SERIALIZABLE, concurrent decisions on one key would
// abort instead of queueing, so the decision refuses them, and
// Limiter.Check refuses the setting at start.
//
// See README.md beside this file.
package postgres

import (
	"github.com/ceiling-go/ceiling/backend"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	_ backend.Backend = (*Store)(nil)
	_ *pgxpool.Pool   = nil
)

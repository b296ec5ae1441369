package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPrefix is the key prefix of a Store without [WithPrefix].
const DefaultPrefix = "ceiling"

// Janitor defaults: how often a Store deletes expired rows, and at most
// how many per statement.
const (
	DefaultJanitorInterval = time.Minute
	DefaultJanitorBatch    = 1000
)

// Store is a [backend.Backend] on PostgreSQL through a pgx pool. Each
// decision is one call of the function ceiling_decide (one round trip;
// ceiling_decide_one for a call of one request), which locks the call's rows in key order, reads them, decides with the
// server's clock and the arithmetic of backend/ALGORITHMS.md, and writes
// all or nothing in the same transaction.
//
// A Store is safe for simultaneous use by multiple goroutines, and any
// number of Stores in any number of processes may share one database:
// that is what makes a limit exact across instances. The zero value is not
// usable; call [New], and [Migrate] before the first decision. A Store does
// not own its pool; [Store.Close] stops its janitor and leaves the pool
// open.
type Store struct {
	pool   *pgxpool.Pool
	prefix string
	clock  func() time.Time // nil: the server's clock_timestamp()

	retries atomic.Int64 // calls sent again after the server aborted them
	resent  atomic.Int64 // calls sent again after the server had ended their session

	// inFlight counts the calls sent and not yet ended; answered is when
	// (UnixNano) the server last answered one, and unanswered when one
	// last ended without an answer (its deadline passed, its session
	// broke). A call that finds every session busy by its deadline tells
	// by them a stalled server (calls in flight or ended unanswered while
	// it waited, none answered) from this process's overload (the server
	// answering, the pool too small for the load).
	inFlight   atomic.Int64
	answered   atomic.Int64
	unanswered atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ backend.DecideInto = (*Store)(nil)

// Option configures a Store.
type Option func(*config)

type config struct {
	prefix       string
	clock        func() time.Time
	janitorEvery time.Duration
	janitorBatch int
}

// WithPrefix sets the prefix of every stored key, so several services can
// share one table: a request's key K is stored as prefix + ":" + K (K's
// SHA-256 instead of K when K is over 512 bytes, holds a byte outside
// ASCII or a NUL, or begins with "~sha256:"). The default is
// [DefaultPrefix]; an empty prefix stores K alone.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithClock makes the Store take the current time from now instead of the
// server's clock_timestamp(). It exists for tests with a fake clock (the
// conformance suite); production code must not use it, because only the
// server's clock is shared by every instance. The janitor then goes by it
// too.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.clock = now }
}

// WithJanitor sets how often the Store deletes rows whose state is back to
// full, and at most how many rows one delete takes (a tick runs deletes
// until one takes fewer, at most ten). An interval of zero or less turns
// the janitor off, for a service that runs it elsewhere or not at all.
// The defaults are [DefaultJanitorInterval] and [DefaultJanitorBatch].
// Rows a decision holds are skipped, never waited for.
func WithJanitor(interval time.Duration, batch int) Option {
	return func(c *config) { c.janitorEvery, c.janitorBatch = interval, batch }
}

// New returns a Store deciding on pool. It panics if pool is nil.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	if pool == nil {
		panic("ceiling/backend/postgres: New with a nil pool")
	}
	cfg := config{prefix: DefaultPrefix, janitorEvery: DefaultJanitorInterval, janitorBatch: DefaultJanitorBatch}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Store{pool: pool, prefix: cfg.prefix, clock: cfg.clock, stop: make(chan struct{}), done: make(chan struct{})}
	if s.prefix != "" {
		s.prefix += ":"
	}
	if cfg.janitorEvery > 0 && cfg.janitorBatch > 0 {
		go s.janitor(cfg.janitorEvery, cfg.janitorBatch)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the janitor and waits for it. It is idempotent; the pool
// stays open.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// now is the instant the Store passes to the server: nil for the server's
// own clock.
func (s *Store) now() *int64 {
	if s.clock == nil {
		return nil
	}
	us := s.clock().UnixMicro()
	return &us
}

// Decide decides every request atomically and all or nothing, in one round
// trip. See [backend.Backend], whose timeout rule it keeps: the budget is
// what ctx's deadline leaves when Decide is entered. A call that gets no
// connection from the pool by the deadline (every connection busy, or this
// process too slow to take one) is never sent and fails with
// [backend.ErrNotSent], unless the pool was still dialing the server then
// or the server answered none of the calls in flight while it waited (a
// server that accepts no session or answers no call is a timeout); once
// a connection is in hand, the call has the whole budget from then,
// whatever ctx says meanwhile.
func (s *Store) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res := make([]backend.Result, len(reqs))
	if err := s.DecideInto(ctx, reqs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// callSQL calls the decision function; its arguments are the requests'
// fields as arrays. oneSQL decides a call of one request, the common
// case, with its fields as scalars: cheaper to encode and decode than ten
// arrays, and without ceiling_decide's bookkeeping of several keys.
const (
	callSQL = "SELECT ceiling_decide($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
	oneSQL  = "SELECT ceiling_decide_one($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
)

// DecideInto is [Store.Decide] writing the results into the first
// len(reqs) elements of results, which must be at least that long.
//
// A call PostgreSQL aborts (deadlock detected, serialization failure) is
// sent once more: the aborted transaction wrote nothing, so the decision
// still counts once. So is a call on a session the server had ended (a
// restart, a failover, pg_terminate_backend) that pgx could not send or
// that the server answered only with that session's FATAL, on a session
// that is alive and within the same budget: such a call did not commit
// (see ended). A session lost otherwise (a reset, an EOF) may have
// committed its call, which is not sent again.
func (s *Store) DecideInto(ctx context.Context, reqs []backend.Request, results []backend.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("ceiling/backend/postgres: %d results for %d requests", len(results), len(reqs))
	}
	for _, r := range reqs {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	n := len(reqs)
	sql, args := s.call(reqs)
	budget := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		if budget = time.Until(dl); budget <= 0 {
			return fmt.Errorf("ceiling/backend/postgres: decide: %w: the deadline passed before the call", backend.ErrNotSent)
		}
	}
	entered := time.Now().UnixNano()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		var ce *pgconn.ConnectError
		if ctx.Err() != nil && !errors.As(err, &ce) {
			// A session the pool is still dialing by the deadline is the
			// server not answering (frozen, partitioned), not this process
			// too busy: a timeout, which trips the breaker and the fail
			// mode, where a shed would refuse every request.
			if s.pool.Stat().ConstructingConns() > 0 {
				return fmt.Errorf("ceiling/backend/postgres: decide: %w: no session of the server by the deadline: %w", context.DeadlineExceeded, err)
			}
			// So is a pool whose sessions all wait on calls the server
			// answered none of meanwhile (a table lock, a stalled disk).
			if s.answered.Load() < entered && (s.inFlight.Load() > 0 || s.unanswered.Load() >= entered) {
				return fmt.Errorf("ceiling/backend/postgres: decide: %w: the server answered no call by the deadline: %w", context.DeadlineExceeded, err)
			}
			return fmt.Errorf("ceiling/backend/postgres: decide: %w: no connection of the pool by the deadline: %w", backend.ErrNotSent, err)
		}
		return fmt.Errorf("ceiling/backend/postgres: decide: %w", classify(err))
	}
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), budget)
		defer cancel()
	}
	var out []int64
	s.inFlight.Add(1)
	for attempt := 0; attempt < 2; attempt++ {
		var row bool
		out, row, err = send(ctx, conn, sql, args)
		if attempt > 0 {
			break
		}
		if aborted(err) {
			s.retries.Add(1)
			continue
		}
		if !row && ended(err) {
			// The server had ended the session before the call (a
			// restart, a failover, pg_terminate_backend): the call did
			// not run, or ran without committing. Once more on a session
			// that is alive, within the same budget.
			conn.Release()
			if conn, err = s.live(ctx); err != nil {
				break
			}
			s.resent.Add(1)
			continue
		}
		break
	}
	// A server's error is an answer, unless it is the one classify counts
	// a timeout: a call cancelled at its deadline may come back as 57014
	// (pgx sends a cancel request), which is no answer either.
	if pe := (*pgconn.PgError)(nil); err == nil || errors.As(err, &pe) && !errors.Is(classify(pe), context.DeadlineExceeded) {
		s.answered.Store(time.Now().UnixNano())
	} else {
		s.unanswered.Store(time.Now().UnixNano())
	}
	s.inFlight.Add(-1)
	if err != nil {
		if conn != nil && standby(ctx, conn, err) {
			return fmt.Errorf("ceiling/backend/postgres: decide: %w: the server is a standby: %w", backend.ErrReadOnly, err)
		}
		return fmt.Errorf("ceiling/backend/postgres: decide: %w", classify(err))
	}
	if len(out) != 2+6*n {
		return fmt.Errorf("ceiling/backend/postgres: decide: %d values in the reply for %d requests", len(out), n)
	}
	for i, r := range reqs {
		v := out[2+6*i : 8+6*i]
		res := backend.Result{
			Allowed:    v[0] == 1,
			Limit:      r.Limit,
			Remaining:  v[1],
			ResetAfter: time.Duration(v[2]) * time.Microsecond,
			NextAfter:  time.Duration(v[4]) * time.Microsecond,
			Stamp:      v[5],
		}
		switch {
		case v[3] < 0:
			res.RetryAfter = backend.Never
		default:
			res.RetryAfter = time.Duration(v[3]) * time.Microsecond
		}
		results[i] = res
	}
	return nil
}

// call returns the statement deciding reqs (at least one) and its
// arguments, the first of them the instant (s.now, NULL for the server's
// clock).
func (s *Store) call(reqs []backend.Request) (string, []any) {
	n := len(reqs)
	args := make([]any, 10)
	args[0] = s.now()
	if n == 1 {
		r := reqs[0]
		args[1], args[2], args[3], args[4] = s.prefix+storedKey(r.Key), int32(r.Algorithm), r.Limit, int64(r.Period/time.Microsecond)
		args[5], args[6], args[7], args[8], args[9] = r.Burst, r.Cost, flags(r), id(r), r.Stamp
		return oneSQL, args
	}
	keys := make([]string, n)
	algs := make([]int32, n)
	lims, pers, bursts, costs, leases, stamps := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	fl := make([]int32, n)
	for i, r := range reqs {
		keys[i] = s.prefix + storedKey(r.Key)
		algs[i] = int32(r.Algorithm)
		lims[i], pers[i], bursts[i], costs[i] = r.Limit, int64(r.Period/time.Microsecond), r.Burst, r.Cost
		leases[i], stamps[i] = id(r), r.Stamp
		fl[i] = flags(r)
	}
	args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9] = keys, algs, lims, pers, bursts, costs, fl, leases, stamps
	return callSQL, args
}

// maxKeyBytes bounds the keys stored as they are: an entry of the table's
// btree holds at most about 2.7 kB, and a longer key failed every call.
const maxKeyBytes = 512

// digestMark begins every key stored as a digest.
const digestMark = "~sha256:"

// storedKey is the form of a request's key in the table: the key itself,
// or digestMark and its SHA-256 in hex when it is longer than maxKeyBytes,
// holds a byte outside ASCII or a NUL, or begins with digestMark. text
// refuses a NUL and bytes that are not UTF-8, and a database whose
// encoding is not UTF-8 refuses, under client_encoding UTF8, characters
// it lacks; every server encoding holds ASCII. A key of the first kind
// never begins with digestMark, one of the second always does, so two
// keys share a row only if they are equal or their digests collide.
// backend.Request bounds no key, and memory and Redis decide any key;
// ceiling's own keys are short ASCII unless a rule's name is long.
func storedKey(k string) string {
	if len(k) <= maxKeyBytes && !strings.HasPrefix(k, digestMark) && plainASCII(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return digestMark + hex.EncodeToString(sum[:])
}

// plainASCII reports whether k holds only ASCII bytes other than NUL.
func plainASCII(k string) bool {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 || k[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// id is the lease ceiling_decide takes for a request: a Concurrency
// request's lease id, a settlement's Once otherwise (0: none).
func id(r backend.Request) int64 {
	if r.Algorithm == backend.Concurrency {
		return r.Lease
	}
	return r.Once
}

// flags packs a request's booleans as ceiling_decide takes them: 1 Force,
// 2 Shadow.
func flags(r backend.Request) int32 {
	var f int32
	if r.Force {
		f |= 1
	}
	if r.Shadow {
		f |= 2
	}
	return f
}

// standby reports whether err, a refusal of the feature (0A000), came
// from a server in recovery: a hot standby refuses an UNLOGGED table
// ("cannot access temporary or unlogged relations during recovery")
// before the write that a logged table's standby refuses as read-only
// (25006), and the limiter's breaker, Check and health must see a
// read-only server either way. It asks the session only on that error.
func standby(ctx context.Context, conn *pgxpool.Conn, err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "0A000" {
		return false
	}
	var recovering bool
	return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering) == nil && recovering
}

// send sends the call on conn and returns the reply's values, and whether
// a row of the reply arrived before any error.
func send(ctx context.Context, conn *pgxpool.Conn, sql string, args []any) (out []int64, row bool, err error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, false, err
	}
	if row = rows.Next(); row {
		err = rows.Scan(&out)
	}
	rows.Close()
	if e := rows.Err(); e != nil {
		err = e
	} else if err == nil && !row {
		err = pgx.ErrNoRows
	}
	return out, row, err
}

// ended reports a call that failed because the server had ended its
// session and that did not commit, so that it may be sent again on
// another: pgx wrote none of it (pgconn.SafeToRetry), or the server
// answered it only with the FATAL of a session it had ended (57P01: a
// pg_terminate_backend or a shutdown; 57P05: idle_session_timeout) and no
// row. A decision's one statement commits only after its row is in the
// server's output, which reaches the client in order before any later
// FATAL, so a FATAL without a row is a call that did not commit. Any
// other lost session (an EOF, a reset) may have committed and is not
// sent again.
func ended(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Severity == "FATAL" && (pe.Code == "57P01" || pe.Code == "57P05")
	}
	return err != nil && pgconn.SafeToRetry(err)
}

// liveTries bounds the idle sessions live looks at: past them it takes
// whatever the pool gives, a new session when the others were dropped.
const liveTries = 16

// live acquires a session of the pool that the server has not ended:
// after one ended session the pool's other idle ones were often ended
// too (a restart ends them all), and each would fail its next call. It
// reads each for a FATAL already received, for a millisecond at most,
// without writing, and drops the ended ones.
func (s *Store) live(ctx context.Context) (*pgxpool.Conn, error) {
	for i := 0; ; i++ {
		c, err := s.pool.Acquire(ctx)
		if err != nil || i == liveTries || alive(c) {
			return c, err
		}
		c.Release() // closed: the pool drops it
	}
}

// alive reports whether the idle session c is still open once what the
// server sent it is read: a FATAL (an ended session) or a closed socket
// closes it.
func alive(c *pgxpool.Conn) bool {
	pc := c.Conn().PgConn()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	msg, err := pc.ReceiveMessage(ctx)
	if e, ok := msg.(*pgproto3.ErrorResponse); ok && e.Severity == "FATAL" {
		_ = pc.Close(ctx)
	}
	if err != nil && !pgconn.Timeout(err) {
		_ = pc.Close(ctx)
	}
	return !pc.IsClosed()
}

// aborted reports a transaction PostgreSQL rolled back on its own and that
// may be sent again: a deadlock or a serialization failure.
func aborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// Reset forgets the state of the given keys, restoring their full quota.
// It deletes through ceiling_reset, pinned to ceiling's schema as the
// decisions are, so a table of the same name elsewhere on the session's
// search_path cannot take the delete.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = s.prefix + storedKey(k)
	}
	if _, err := s.pool.Exec(ctx, "SELECT ceiling_reset($1)", full); err != nil {
		return fmt.Errorf("ceiling/backend/postgres: reset: %w", classify(err))
	}
	return nil
}

package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the key prefix of a Store without [WithPrefix].
const DefaultPrefix = "ceiling"

// DefaultDenyCacheSize is how many rejected keys a Store remembers by
// default (see [WithDenyCache]).
const DefaultDenyCacheSize = 10_000

// refundTimeout bounds the refund of a rejected cross-slot request on Redis
// Cluster; it runs even when the caller's context is already done, because
// the units it gives back belong to nobody.
const refundTimeout = time.Second

// Store is a [backend.Backend] on Redis: single node, Sentinel failover and
// Cluster, through any go-redis [redis.UniversalClient]. Each decision is
// one Lua script (one per hash slot involved on Cluster) that reads every
// rule's state, decides with the server's clock, and writes all or nothing.
//
// A Store is safe for simultaneous use by multiple goroutines, and any
// number of Stores in any number of processes may share one Redis: that is
// what makes a limit exact across instances. The zero value is not usable;
// call [New]. A Store does not own its client: close the client yourself.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // non-nil: group requests by hash slot
	prefix  string
	clock   func() time.Time // nil: the script reads Redis TIME
	deny    *denyCache       // nil: deny cache off

	pipe        *pipeliner   // the one node's, without Cluster
	nodes       sync.Map     // on Cluster: master address -> *pipeliner
	reloaded    atomic.Int64 // UnixNano of the last slot map reload asked for
	authRefused atomic.Int64 // UnixNano of the last ErrAuth
	dials       dialLog
	// inline: the client bounds a command by its context's deadline
	// (ContextTimeoutEnabled), so a lone decision on an idle node can be
	// sent by its caller, which returns by its budget all the same.
	inline bool
	// slowYield is the UnixNano of the last yield that showed this
	// process starved (Store.starved).
	slowYield atomic.Int64
	// replied is the UnixNano of the last round trip Redis replied to
	// (not one that timed out): evidence that Redis runs.
	replied atomic.Int64
	// logs is where go-redis's lines about this Store go (nil: where
	// go-redis writes them); ownLogs, that WithLogger chose it, so that a
	// limiter's logger does not replace it (see UseDefaultLogger).
	logs    atomic.Pointer[storeLog]
	ownLogs bool
}

var (
	_ backend.Backend       = (*Store)(nil)
	_ backend.DecideInto    = (*Store)(nil)
	_ backend.CachedDecider = (*Store)(nil)
	_ backend.DefaultLogger = (*Store)(nil)
)

// Option configures a Store.
type Option func(*config)

type config struct {
	prefix    string
	clock     func() time.Time
	denySize  int
	logger    *slog.Logger
	loggerSet bool
}

// WithPrefix sets the prefix of every stored key, so several services can
// share one Redis: a request's key K is stored as prefix + ":" + K. The
// default is [DefaultPrefix]; an empty prefix stores K as is. A prefix with
// a hash tag such as "{ceiling}" puts every key in one Redis Cluster slot:
// every request is then one script, at the cost of one busy node.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithClock makes the Store take the current time from now instead of the
// Redis server's TIME. It exists for tests with a fake clock (the
// conformance suite); production code must not use it, because only the
// server's clock is shared by every instance. Redis still expires keys on
// its own clock, so under WithClock every written key lives at least a
// minute, long enough to outlast a test's fake time.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.clock = now }
}

// WithDenyCache sets how many rejected keys the Store remembers in process;
// zero or less turns the deny cache off. The default is
// [DefaultDenyCacheSize].
//
// A key rejected until T (by its RetryAfter) is answered locally until T on
// this process's monotonic clock, without a round trip, so a flood from one
// caller costs Redis nothing. A Decide call with any unforced, positive-cost
// request on a denied key, of the same rule (algorithm, limit, period,
// burst) and cost as the rejected one, is rejected locally (a Shadow request never is, as its rejection blocks
// nothing): the denied requests report Allowed false, their RetryAfter and
// ResetAfter counting down from the rejection's and the Remaining seen at the
// rejection; every other request of the call, whose state is not read,
// reports Allowed true and Unread (the middleware then leaves it out of the
// rate-limit headers rather than advertise an unknown state). Nothing is
// consumed, as for any rejection.
//
// The cache never admits. Its answer can differ from Redis's in two ways:
// it keeps rejecting until T when another instance refunds or resets the
// key meanwhile, and when another rule of the call would reject too, for
// longer, that rule's longer RetryAfter is not known. A refund or
// [Store.Reset] through this Store forgets the key at once.
//
// The cache never answers a decision that was sent: when a decision fails
// after it was written (its reply lost, or too late), so that Redis may
// have applied it, the cache does not answer its keys for two seconds. Its caller then gets the error, and its fail mode, never a
// cached rejection that its own decision may have caused.
func WithDenyCache(size int) Option {
	return func(c *config) { c.denySize = size }
}

// New returns a Store deciding on client, which may be a *redis.Client, a
// Sentinel failover client or a *redis.ClusterClient (what
// redis.NewUniversalClient returns for your options). New panics if client
// is nil or a *redis.Ring: a Ring routes a script by its first key, so a
// key's state would live on whichever shard each request's first key picks,
// and the limit would silently stop being one limit.
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("ceiling/backend/redis: New with a nil client")
	}
	if _, ok := client.(*redis.Ring); ok {
		panic("ceiling/backend/redis: New with a *redis.Ring, which cannot run one script over keys of several shards; use a single server, Sentinel or Cluster")
	}
	cfg := config{prefix: DefaultPrefix, denySize: DefaultDenyCacheSize}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Store{client: client, prefix: cfg.prefix, clock: cfg.clock}
	if cfg.prefix != "" {
		s.prefix += ":"
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		s.cluster = c
		s.inline = c.Options().ContextTimeoutEnabled
	case *redis.Client:
		s.inline = c.Options().ContextTimeoutEnabled
	}
	if s.cluster == nil {
		s.pipe = newPipeliner(s)
	}
	s.ownLogs = cfg.loggerSet
	if cfg.logger != nil {
		s.logs.Store(newStoreLog(cfg.logger))
	}
	s.dials.logs = &s.logs
	s.dials.watch(client)
	if cfg.denySize > 0 {
		s.deny = newDenyCache(cfg.denySize)
	}
	return s
}

// now is the clock of the deny cache: the injected clock under WithClock,
// otherwise the process's monotonic clock.
func (s *Store) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// Decide decides every request atomically and all or nothing, in one round
// trip (on Cluster, one per hash slot involved, in parallel). See
// [backend.Backend], whose timeout rule it keeps: the budget is what ctx's
// deadline leaves when Decide is entered, counted from when the decision is
// written, so that time this process loses before the write is not blamed
// on Redis, and a decision no round trip took by the deadline is never
// sent and fails with [backend.ErrNotSent]. A written decision's reply is
// read however late this process gets to it: when the budget runs out,
// Decide yields the CPU (up to three times) and times how long it took to
// run again; a yield that takes a tenth of the budget or more (or one that
// did within the last second) says that the goroutine that reads Redis's
// replies may not have run yet, though a reply came, and Decide waits
// longer, as long as each yield took, until 2s after it was called (or one
// and a half budgets, if longer). A decision whose reply does not come
// fails with an error wrapping [context.DeadlineExceeded], or
// [backend.ErrUnreachable] with the dial error when go-redis was still
// failing to connect.
func (s *Store) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res := make([]backend.Result, len(reqs))
	if err := s.DecideInto(ctx, reqs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// DecideInto is [Store.Decide] writing the results into the first
// len(reqs) elements of results, which must be at least that long.
func (s *Store) DecideInto(ctx context.Context, reqs []backend.Request, results []backend.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("ceiling/backend/redis: %d results for %d requests", len(results), len(reqs))
	}
	for _, r := range reqs {
		// Validate's bounds keep every value the script forms an integer
		// under 2^53, where doubles are exact (ALGORITHMS.md).
		if err := r.Validate(); err != nil {
			return fmt.Errorf("ceiling/backend/redis: %w", err)
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	var now time.Time // the deny cache's clock, read before the backend's
	if s.deny != nil {
		if now = micro(s.now()); s.deny.answer(reqs, results, now) {
			return nil
		}
	}
	var (
		res      []backend.Result
		rejected bool
		split    bool
		err      error
	)
	if groups := s.slotGroups(reqs); len(groups) > 1 {
		split = true
		res, rejected, err = s.decideSlots(ctx, reqs, groups)
	} else if script := loneScript(reqs, nil); script != decideScript {
		rejected, err = s.runLone(ctx, script, reqs[0], &results[0])
		res = results[:1]
	} else {
		var r reply
		r, err = s.run(ctx, s.keys(reqs), reqs, nil)
		res, rejected = r.results, r.rejected
	}
	if err != nil {
		if s.deny != nil && sentUnanswered(err) {
			s.deny.doubt(reqs, micro(s.now()))
		}
		return err
	}
	copy(results, res)
	if s.deny != nil {
		// A call split across slots is decided slot by slot, then undone
		// where another slot rejected: its rejection may be of units that
		// such an undo (its own or a simultaneous call's) gives back
		// milliseconds later, with the RetryAfter of a full window. The
		// cache learns no rejection of it, so that such a burst costs one
		// wrong answer per call, not a lockout of every caller until that
		// RetryAfter; it still forgets what the call's refunds freed.
		s.deny.learn(reqs, res, rejected && !split, now)
	}
	return nil
}

// sentUnanswered reports whether a call that failed with err may have been
// applied: it was written (errWritten: it timed out, or its caller gave up,
// after the write, whatever else failed meanwhile), or it lost its
// connection. A call that was never sent (a failed dial of its own, no
// round trip free) or that Redis refused (an error reply) was not.
func sentUnanswered(err error) bool {
	var op *net.OpError
	if errors.Is(err, errWritten) {
		return true
	}
	if errors.Is(err, errNotSent) || errors.Is(err, errStuck) || (errors.As(err, &op) && op.Op == "dial") {
		return false
	}
	return timedOut(err) || isUnreachable(err)
}

// DecideCached rejects reqs from the deny cache alone, with no round trip,
// when one of them is on a key Redis rejected until a time still to come,
// exactly as Decide would (see [WithDenyCache]), and reports whether it
// did; see [backend.CachedDecider]. With the deny cache off it never does.
// The limiter asks it while Redis cannot decide, so that a spent key stays
// refused until its RetryAfter whatever the fail mode.
func (s *Store) DecideCached(reqs []backend.Request, results []backend.Result) bool {
	if s.deny == nil || len(reqs) == 0 || len(results) < len(reqs) {
		return false
	}
	return s.deny.answer(reqs, results, micro(s.now()))
}

// Reset forgets the state of the given keys (the Request.Key values, without
// the prefix). Like Decide, it returns by its context's deadline whatever
// Redis does.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	stored := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		// A Concurrency key's companion goes too: a companion left alone
		// reads as leases whose sorted set was evicted (lib.lua).
		stored = append(stored, s.prefix+k, companionOf(s.prefix+k))
	}
	if s.deny != nil {
		s.deny.forget(keys...)
	}
	if err := s.del(ctx, stored); err != nil {
		return fmt.Errorf("ceiling/backend/redis: reset %d keys: %w", len(keys), err)
	}
	return nil
}

func (s *Store) keys(reqs []backend.Request) []string {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = s.prefix + r.Key
	}
	return keys
}

// companionOf is the companion hash of a Concurrency key (lib.lua's
// companion): in the key's own hash tag when it has one, else in a tag of
// the whole key, so that both are in one slot.
func companionOf(key string) string {
	if a := strings.IndexByte(key, '{'); a >= 0 {
		if b := strings.IndexByte(key[a+1:], '}'); b > 0 {
			return key + "#n"
		}
	}
	return "{" + key + "}#n"
}

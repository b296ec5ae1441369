package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
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

// refundTimeout bounds the undo of a rejected cross-slot call on Cluster,
// which runs even when the caller's context is done.
const refundTimeout = time.Second

// Store is a [backend.Backend] on Redis (single node, Sentinel or Cluster,
// through any go-redis [redis.UniversalClient]): each decision is one Lua
// script (one per hash slot on Cluster) that reads every rule's state,
// decides on the server's clock and writes all or nothing.
//
// A Store is safe for simultaneous use by multiple goroutines, and any
// number of Stores in any number of processes may share one Redis. The
// zero value is not usable; call [New]. A Store does not own its client.
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
	// (ContextTimeoutEnabled), so a lone decision's caller can send it.
	inline    bool
	slowYield atomic.Int64 // UnixNano of the last yield that showed this process starved
	replied   atomic.Int64 // UnixNano of Redis's last reply (not a timeout): it runs
	// scriptsUntil: UnixNano until which the Store sends EVALSHA, a server
	// having refused functions (see library); loads: its loads of the
	// library, per node.
	scriptsUntil atomic.Int64
	loads        libraryLoads
	// logs is where the Store logs what it sees (nil: nowhere yet);
	// ownLogs, that WithLogger chose it (see UseDefaultLogger).
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

// WithPrefix sets the prefix of every stored key: K is stored as prefix +
// ":" + K ([DefaultPrefix] by default; an empty prefix stores K as is). A
// prefix with a hash tag such as "{ceiling}" puts every key in one Cluster
// slot.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithClock makes the Store read time from now instead of Redis TIME, for
// tests with a fake clock; production code must not use it, since only the
// server's clock is shared. Keys written under it live at least a minute
// of Redis's own clock.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.clock = now }
}

// WithDenyCache sets how many rejected keys the Store remembers
// ([DefaultDenyCacheSize]; zero or less: off). A key Redis rejected until T
// is rejected locally until T for the same rule and cost, with no round
// trip; it never admits (see README.md).
func WithDenyCache(size int) Option {
	return func(c *config) { c.denySize = size }
}

// New returns a Store deciding on client: a *redis.Client, a Sentinel
// failover client or a *redis.ClusterClient. It panics on a nil client or a
// *redis.Ring, which routes a script by its first key and so would split
// one limit across shards.
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
		s.pipe = newPipeliner(s, "")
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

// now is the deny cache's clock: WithClock's, or the monotonic clock.
func (s *Store) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// Decide decides every request atomically and all or nothing, in one round
// trip (on Cluster, one per slot, in parallel); see [backend.Backend]. The
// budget is what ctx's deadline leaves at entry, counted from the write; a
// decision no round trip took by the deadline fails with
// [backend.ErrNotSent], and a written one's reply is read however late a
// starved process gets to it (within a bound), while a Redis that sent
// nothing back is blamed at the budget (on Linux, by its sockets; see
// README.md).
func (s *Store) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res := make([]backend.Result, len(reqs))
	if err := s.DecideInto(ctx, reqs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// DecideInto is [Store.Decide] into results[:len(reqs)].
func (s *Store) DecideInto(ctx context.Context, reqs []backend.Request, results []backend.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("ceiling/backend/redis: %d results for %d requests", len(results), len(reqs))
	}
	for _, r := range reqs {
		// Validate keeps every value the script forms under 2^53.
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
	} else if len(reqs) == 1 {
		rejected, err = s.runLone(ctx, reqs[0], &results[0])
		res = results[:1]
	} else {
		var r reply
		r, err = s.run(ctx, reqs)
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
		// A split call's rejection may be of units an undo gives back
		// milliseconds later: the cache learns none of it.
		s.deny.learn(reqs, res, rejected && !split, now)
	}
	return nil
}

// sentUnanswered reports whether a call that failed with err may have been
// applied: written (errWritten), or its connection lost; not one never sent
// or refused with an error reply.
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

// DecideCached answers reqs from the deny cache alone, as Decide would,
// and reports whether it did ([backend.CachedDecider]).
func (s *Store) DecideCached(reqs []backend.Request, results []backend.Result) bool {
	if s.deny == nil || len(reqs) == 0 || len(results) < len(reqs) {
		return false
	}
	return s.deny.answer(reqs, results, micro(s.now()))
}

// Reset forgets the state of keys (Request.Key values, without the
// prefix), returning by ctx's deadline like Decide.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	stored := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		// with a Concurrency key's companion (lib.lua)
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

// companionOf is lib.lua's companion of a Concurrency key, in the key's
// slot.
func companionOf(key string) string { return companionName(key, "n") }

// onceKeyOf is lib.lua's onceKey: the entry of once on key (a
// reservation's ticket or a forced charge's record), in the key's slot.
func onceKeyOf(key string, once int64) string {
	return companionName(key, "o"+strconv.FormatInt(once, 10))
}

// companionName is lib.lua's companion: key's name for x, in key's slot.
func companionName(key, x string) string {
	if a := strings.IndexByte(key, '{'); a >= 0 {
		if b := strings.IndexByte(key[a+1:], '}'); b > 0 {
			return key + "#" + x
		}
	}
	return "{" + key + "}#" + x
}

// withOnceKeys is keys, the keys of reqs, followed by the entry of each
// request's Once: a script declares every key it reads, so that a Cluster
// slot half-moved by a reshard answers TRYAGAIN (some keys here, some
// there) or ASK, never runs the script beside a state whose entry is on
// the other node, where a resent settlement would be misjudged.
func withOnceKeys(keys []string, reqs []backend.Request) []string {
	out := keys
	for i, r := range reqs {
		if r.Once != 0 {
			if len(out) == len(keys) {
				out = slices.Clip(keys) // the caller's keys stay as they are
			}
			out = append(out, onceKeyOf(keys[i], r.Once))
		}
	}
	return out
}

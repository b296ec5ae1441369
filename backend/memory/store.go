package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Store is the embedded backend: rate-limit state in process memory,
// exact, sharded, bounded and swept of idle keys.
//
// Create one with [New]; the zero value is not usable. A Store is safe for
// simultaneous use by multiple goroutines. Close stops its janitor.
type Store struct {
	shards []shard
	shift  uint // shard index = keyHash.b >> shift

	seedA, seedB maphash.Seed

	clock     func() time.Time // nil: the monotonic clock below
	base      time.Time
	baseMicro int64

	evictions    atomic.Uint64
	lastEviction atomic.Int64 // µs, of the last eviction counted
	maxKeys      int
	logger       *slog.Logger // nil: slog.Default()
	settled      settledSet   // settlements applied, by Once (once.go)

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// shard is one lock and the keys whose digest falls in it, one table per
// kind of state.
type shard struct {
	mu      sync.Mutex
	maxKeys int
	gcra    table[gcraState]
	windows table[window]
	logs    table[logState]
	rolls   rollTables
	leases  table[*leaseSet] // Concurrency (concurrency.go)
	// minExp is at most the earliest time a key of the shard is back to
	// full: until then, sweeping it under pressure would free nothing.
	minExp int64
	// pressureSweep is when makeRoom last swept the shard.
	pressureSweep int64
	_             [64]byte // keep neighbouring shards' locks off this cache line
}

// bound sets the shard's key bound, and stops its tables' growth at the
// size that holds it.
func (sh *shard) bound(maxKeys int) {
	sh.maxKeys = maxKeys
	most := slotsFor(maxKeys)
	sh.gcra.most, sh.windows.most, sh.logs.most, sh.leases.most = most, most, most, most
	sh.rolls.t8.most, sh.rolls.t16.most, sh.rolls.t32.most = most, most, most
}

func (sh *shard) keys() int {
	return sh.gcra.n + sh.windows.n + sh.logs.n + sh.rolls.len() + sh.leases.n
}

var (
	_ backend.Backend    = (*Store)(nil)
	_ backend.DecideInto = (*Store)(nil)
	_ backend.InProcess  = (*Store)(nil)
	_ backend.Evicting   = (*Store)(nil)
)

// DefaultMaxKeys is the number of keys a Store holds unless [WithMaxKeys]
// says otherwise: a million clients per rule, and not enough for a flood
// of fresh keys to exhaust the process.
const DefaultMaxKeys = 1 << 20

// DefaultSweepInterval is how often the janitor deletes keys whose state
// is back to full, unless [WithSweepInterval] says otherwise.
const DefaultSweepInterval = time.Minute

const maxShards = 256

// Option configures a [Store].
type Option func(*config)

type config struct {
	clock   func() time.Time
	maxKeys int
	sweep   time.Duration
	logger  *slog.Logger
}

// WithClock makes the Store read time from now, truncated to whole
// microseconds, instead of the process's monotonic clock; tests pass a fake.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.clock = now }
}

// WithMaxKeys bounds the number of keys held (default [DefaultMaxKeys]),
// per shard, so the total exceeds maxKeys by at most the shard count; the
// package doc says which key a new one evicts. It panics if maxKeys < 1.
func WithMaxKeys(maxKeys int) Option {
	if maxKeys < 1 {
		panic(fmt.Sprintf("memory: WithMaxKeys(%d): the bound must be at least 1", maxKeys))
	}
	return func(c *config) { c.maxKeys = maxKeys }
}

// WithLogger sets where the Store logs each burst of evictions that give
// quota back (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithSweepInterval sets how often the janitor deletes keys back to full
// (default [DefaultSweepInterval]); zero or negative disables it, and the
// key bound still holds memory in check.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) { c.sweep = d }
}

// New returns a Store, with a janitor goroutine running unless disabled by
// [WithSweepInterval]; call [Store.Close] to stop it.
func New(opts ...Option) *Store {
	cfg := config{maxKeys: DefaultMaxKeys, sweep: DefaultSweepInterval}
	for _, o := range opts {
		o(&cfg)
	}
	// At least 64 keys per shard, so that a small bound is not spread so
	// thin that unlucky hashing evicts while the Store is nearly empty.
	n := 1
	for n < maxShards && n*2*64 <= cfg.maxKeys {
		n *= 2
	}
	s := &Store{
		shards:  make([]shard, n),
		shift:   uint(64 - bits.TrailingZeros(uint(n))),
		seedA:   maphash.MakeSeed(),
		seedB:   maphash.MakeSeed(),
		clock:   cfg.clock,
		maxKeys: cfg.maxKeys,
		logger:  cfg.logger,
		base:    time.Now(),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	s.baseMicro = s.base.UnixMicro()
	perShard := (cfg.maxKeys + n - 1) / n
	for i := range s.shards {
		s.shards[i].bound(perShard)
	}
	if cfg.sweep > 0 {
		go s.janitor(cfg.sweep)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the janitor and waits for it. It is idempotent and returns
// nil; the Store keeps answering, without sweeping.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// InProcess reports true: a Store answers from memory and never blocks on
// I/O, so the middleware skips its timeout and circuit breaker.
func (s *Store) InProcess() bool { return true }

// HashesKeys reports true: a Store keeps only a seeded hash of a key and no
// reference to its string, so a caller may send raw keys built in a buffer
// it reuses.
func (s *Store) HashesKeys() bool { return true }

// Evictions returns how many keys holding units were evicted to respect
// the key bound, each giving its caller quota back ([backend.Evicting]).
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Len returns the number of keys the Store holds.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.keys()
		sh.mu.Unlock()
	}
	return n
}

// now returns the current time in whole microseconds since the Unix epoch.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixMicro()
	}
	// time.Since reads only the monotonic clock: one vDSO call, not two.
	return s.baseMicro + int64(time.Since(s.base)/time.Microsecond)
}

func (s *Store) hash(key string) keyHash {
	return keyHash{a: maphash.String(s.seedA, key) | 1, b: maphash.String(s.seedB, key)}
}

func (s *Store) shardOf(h keyHash) *shard { return &s.shards[h.b>>s.shift] }

// Decide decides every request atomically, all or nothing, as
// [backend.Backend] says. It allocates the results slice; [Store.DecideInto]
// does not. The context is not consulted: a Store never blocks.
func (s *Store) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	res := make([]backend.Result, len(reqs))
	if err := s.DecideInto(ctx, reqs, res); err != nil {
		return nil, err
	}
	return res, nil
}

// DecideInto is [Store.Decide] writing into results, which must have at
// least len(reqs) elements. Deciding up to eight requests allocates
// nothing.
func (s *Store) DecideInto(_ context.Context, reqs []backend.Request, results []backend.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("memory: %d results for %d requests", len(results), len(reqs))
	}
	once := false
	for i := range reqs {
		if r := &reqs[i]; plain(r) {
			continue
		}
		if err := reqs[i].Validate(); err != nil {
			return fmt.Errorf("memory: request %d (key %q): %w", i, reqs[i].Key, err)
		}
		once = once || reqs[i].Once != 0
	}
	if once {
		s.decideOnce(reqs, results)
	} else {
		s.decide(reqs, results)
	}
	return nil
}

// decide decides valid reqs into results.
func (s *Store) decide(reqs []backend.Request, results []backend.Result) {
	switch n := len(reqs); {
	case n == 1:
		s.decideOne(&reqs[0], &results[0])
	case n == 0:
	case n <= smallCall:
		var buf [smallCall]pending
		s.decideMany(reqs, results, buf[:n])
	default:
		s.decideMany(reqs, results, make([]pending, n))
	}
}

// plain reports whether r is certainly valid (no burst, stamp or once to
// check), in a check that inlines;
// anything else gets [backend.Request.Validate]'s verdict.
func plain(r *backend.Request) bool {
	return r.Key != "" && uint64(r.Limit-1) < backend.MaxLimit &&
		uint64(r.Period-time.Millisecond) <= uint64(backend.MaxPeriod-time.Millisecond) &&
		r.Burst == 0 && r.Stamp == 0 && r.Once == 0 && r.Algorithm < backend.Concurrency && uint64(r.Cost+backend.MaxLimit) <= 2*backend.MaxLimit
}

// Reset forgets the given keys under every algorithm.
func (s *Store) Reset(_ context.Context, keys ...string) error {
	for _, k := range keys {
		h := s.hash(k)
		sh := s.shardOf(h)
		sh.mu.Lock()
		if i := sh.gcra.find(h); i >= 0 {
			sh.gcra.deleteAt(i)
		}
		if i := sh.windows.find(h); i >= 0 {
			sh.windows.deleteAt(i)
		}
		if i := sh.logs.find(h); i >= 0 {
			sh.logs.deleteAt(i)
		}
		if t, i := sh.rolls.find(h, tier8); i >= 0 {
			sh.rolls.deleteAt(t, i)
		}
		if i := sh.leases.find(h); i >= 0 {
			sh.leases.deleteAt(i)
		}
		sh.mu.Unlock()
	}
	return nil
}

// decideOne is the common single-rule decision: one shard, one lookup.
// The rolling window reads and writes its state where it is stored; the
// other algorithms go through many.go's load, step and store.
func (s *Store) decideOne(r *backend.Request, out *backend.Result) {
	h := s.hash(r.Key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	// The clock is read under the lock: a call that read it and then waited
	// for the lock behind calls that had since opened the next window
	// decided at an older instant, as on a clock stepped back, and a fixed
	// window's anchor carried the new window's count into the old one.
	now := s.now()
	if r.Algorithm == backend.RollingWindow {
		s.decideRolling(sh, h, r, now, out)
	} else {
		p := pending{h: h}
		s.load(sh, r, &p, now)
		p.log.owned = true // a lone request's view replaces the stored log
		if ok := s.step(r, &p, now, out, nil); (ok && r.Cost != 0) || p.emptied {
			// An emptied lease set is deleted whatever the call decided.
			p.writeP = r.Period
			s.store(sh, r, &p, now)
		}
	}
	sh.mu.Unlock()
}

// putGCRA stores a GCRA key's state at slot i (-1: absent), deleting the
// key when it is back to full. It reports whether it inserted or deleted.
func (s *Store) putGCRA(sh *shard, h keyHash, i int, r *backend.Request, st gcraState, now int64) bool {
	return put(s, sh, &sh.gcra, h, i, r, st, st.tat > now, st.tat, now)
}

// putWindow stores a window state at slot i (-1: absent), deleting the key
// when the state is back to full. It reports whether it inserted or deleted.
func (s *Store) putWindow(sh *shard, h keyHash, i int, r *backend.Request, w window, now int64) bool {
	return put(s, sh, &sh.windows, h, i, r, w, w.a != 0 || w.b != 0, w.exp, now)
}

// putLog commits a log view for the key at slot i (-1: absent). It reports
// whether it inserted or deleted.
func (s *Store) putLog(sh *shard, h keyHash, i int, r *backend.Request, v *logView, now, P int64) bool {
	st, live := v.commit(now, P)
	return put(s, sh, &sh.logs, h, i, r, st, live, st.exp, now)
}

// put stores a live v for key h in t at slot i (-1: absent), making room
// for a new key, or deletes a key back to full; exp is when v will be. It
// reports whether it inserted or deleted.
func put[V any](s *Store, sh *shard, t *table[V], h keyHash, i int, r *backend.Request, v V, live bool, exp, now int64) bool {
	switch {
	case live && i >= 0:
		t.slots[i].v = v
		sh.minExp = min(sh.minExp, exp)
		return false
	case live:
		s.makeRoom(sh, h, r, now)
		t.insert(h, v)
		sh.minExp = min(sh.minExp, exp)
	case i >= 0:
		t.deleteAt(i)
	default:
		return false
	}
	return true
}

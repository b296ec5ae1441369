package failover

import (
	"context"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// FailLocal's store, and how its bound holds across the edges of an
// outage (docs/failure.md, "FailLocal across the edges of an outage").
// Inside an outage each instance admits its share of each limit; at the
// edges three things keep a window within the bound: at the start, the
// local store decides a key from what the backend last said of it (Seen);
// at the end, the probe that finds the backend answering charges it with
// what the local store admitted (Journal, Local.Charge) before the breaker
// closes; and for a hand-over of MaxCoolDown plus the timeout after the
// recovery, FailLocal rules are decided both locally and on the backend
// (Local.HandOver), since instances find the backend back at different
// moments. Each errs towards the limit: a key can be held a little longer
// than needed, never admitted more.

// MaxJournal bounds a Journal: it holds only an outage's keys.
const MaxJournal = 1 << 18

// Capacity is the most units one request can ever take under req's limit.
func Capacity(req backend.Request) int64 {
	if req.Algorithm == backend.GCRA && req.Burst > 0 {
		return req.Burst
	}
	return req.Limit
}

// Journal is the set of keys the local store admitted while degraded,
// with their requests as the backend and the local store see them.
type Journal struct {
	mu      sync.Mutex
	entries map[string]JournalEntry
	n       atomic.Int64 // len(entries), read without mu
}

// Len is how many keys the journal holds.
func (j *Journal) Len() int64 { return j.n.Load() }

// JournalEntry is one key of a Journal.
type JournalEntry struct {
	Global backend.Request // as the backend sees it, Cost 0
	Local  backend.Request // scaled to the share, Cost 0
	// Units is how many units the local store admitted on the key since
	// the journal last gave it to a charge: the local store's count also
	// holds units an earlier charge sent, which must not be sent twice.
	Units int64
}

// Add records that the local store admitted global.Cost units on global's
// key. A reservation's Once (its ticket) is dropped: the recovery charge
// is a charge of its own, and the entries are peeks until then.
func (j *Journal) Add(global, local backend.Request) {
	units := global.Cost
	global.Cost, local.Cost, global.Once, local.Once = 0, 0, 0, 0
	j.add(JournalEntry{Global: global, Local: local, Units: units})
}

func (j *Journal) add(e JournalEntry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.entries == nil {
		j.entries = make(map[string]JournalEntry)
	}
	old, ok := j.entries[e.Global.Key]
	if !ok && len(j.entries) >= MaxJournal {
		return // the local store cannot hold more keys either
	}
	e.Units += old.Units
	j.entries[e.Global.Key] = e
	j.n.Store(int64(len(j.entries)))
}

// Take empties the journal and returns what it held.
func (j *Journal) Take() []JournalEntry {
	j.mu.Lock()
	m := j.entries
	j.entries = nil
	j.n.Store(0)
	j.mu.Unlock()
	out := make([]JournalEntry, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}

// Restore puts back entries a failed charge did not apply.
func (j *Journal) Restore(entries []JournalEntry) {
	for _, e := range entries {
		j.add(e)
	}
}

// Seen remembers, per stored key, how much of its capacity the
// backend last said was in use and until when, for the start of an outage.
// It is sharded so that concurrent decisions rarely share a lock, and
// bounded: a full shard first drops what has expired, then refuses new keys.
type Seen struct {
	seed   maphash.Seed
	shards []seenShard
}

type seenShard struct {
	mu sync.Mutex
	m  map[string]Last
	_  [40]byte // keep shards on separate cache lines
}

// Last is what the backend last said of a key.
type Last struct {
	Used  int64 // units of the key's capacity in use
	Until int64 // Unix ns when the key is back to its full capacity
}

const (
	seenShards   = 16
	seenPerShard = 1 << 12
)

// Init prepares an empty Seen.
func (s *Seen) Init() {
	s.seed = maphash.MakeSeed()
	s.shards = make([]seenShard, seenShards)
	for i := range s.shards {
		s.shards[i].m = make(map[string]Last)
	}
}

func (s *Seen) shard(key string) *seenShard {
	return &s.shards[maphash.String(s.seed, key)%seenShards]
}

// Learn records what the backend answered for reqs.
func (s *Seen) Learn(reqs []backend.Request, out []backend.Result, now time.Time) {
	t := now.UnixNano()
	for i := range reqs {
		if out[i].Unread {
			continue
		}
		used := Capacity(reqs[i]) - out[i].Remaining
		sh := s.shard(reqs[i].Key)
		sh.mu.Lock()
		if used <= 0 {
			delete(sh.m, reqs[i].Key)
		} else {
			if _, ok := sh.m[reqs[i].Key]; !ok && len(sh.m) >= seenPerShard {
				for k, v := range sh.m {
					if v.Until <= t {
						delete(sh.m, k)
					}
				}
			}
			if _, ok := sh.m[reqs[i].Key]; ok || len(sh.m) < seenPerShard {
				sh.m[reqs[i].Key] = Last{Used: used, Until: t + int64(out[i].ResetAfter)}
			}
		}
		sh.mu.Unlock()
	}
}

// Lookup returns what the backend last said of key, if it still holds at
// now (Unix ns).
func (s *Seen) Lookup(key string, now int64) (Last, bool) {
	if s.shards == nil {
		return Last{}, false
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v, ok := sh.m[key]
	if ok && v.Until <= now {
		delete(sh.m, key)
		return Last{}, false
	}
	return v, ok
}

// Local is FailLocal's store, made on first use so that a healthy limiter
// runs no second store, and what carries its bound across an outage's
// edges. Set the exported fields before first use.
type Local struct {
	Share    float64         // this instance's share of each limit
	Store    backend.Backend // nil: a memory store of its own
	Logger   *slog.Logger
	HandOver time.Duration // how long the hand-over after a recovery lasts

	Seen    Seen
	Journal Journal

	until atomic.Int64 // Unix ns: the hand-over lasts until then
	mu    sync.Mutex
	store atomic.Pointer[LocalStore]
	made  io.Closer // the store Get made
}

// LocalStore is the store FailLocal decides on.
type LocalStore struct {
	B    backend.Backend
	into backend.DecideInto
}

// Decide decides reqs into out on the local store.
func (ls *LocalStore) Decide(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if ls.into != nil {
		return ls.into.DecideInto(ctx, reqs, out)
	}
	res, err := ls.B.Decide(ctx, reqs)
	if err == nil && len(res) != len(out) {
		err = ErrResultCount
	}
	copy(out, res)
	return err
}

// Get returns the local store, creating it on first use.
func (lc *Local) Get() *LocalStore {
	if ls := lc.store.Load(); ls != nil {
		return ls
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if ls := lc.store.Load(); ls != nil {
		return ls
	}
	b := lc.Store
	if b == nil {
		// No janitor: nothing to stop, and the key bound (which sweeps
		// under pressure) keeps an outage's keys in check.
		m := memory.New(memory.WithSweepInterval(0), memory.WithMaxKeys(MaxJournal), memory.WithLogger(lc.Logger))
		lc.made = m
		b = m
	}
	ls := &LocalStore{B: b}
	ls.into, _ = b.(backend.DecideInto)
	lc.store.Store(ls)
	return ls
}

// Loaded is the local store if it was made, else nil.
func (lc *Local) Loaded() *LocalStore { return lc.store.Load() }

// Close closes the store Get made, if any.
func (lc *Local) Close() error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.made != nil {
		return lc.made.Close()
	}
	return nil
}

// Scaled is req scaled to its share of the limit (the rule's, or the
// call's own), never so small that the request's cost could not fit, and
// without its Once: a local store's admission is never settled (its units
// are not the backend's), so it needs no ticket.
func Scaled(req backend.Request, share float64) backend.Request {
	req.Once = 0
	req.Limit = scaled(req.Limit, share, req.Cost)
	if req.Burst > 0 {
		req.Burst = scaled(req.Burst, share, req.Cost)
	}
	return req
}

func scaled(n int64, share float64, cost int64) int64 {
	v := int64(float64(n) * share)
	if v < cost {
		v = cost
	}
	if v < 1 {
		v = 1
	}
	if v > n {
		v = n
	}
	return v
}

// seedOf is this instance's share of the units the backend last said were
// in use: with n instances each holding 1/n of the limit locally, each
// starts its share 1/n spent by what all of them had spent, so together
// they continue exactly where the backend stopped. Rounded up, towards the
// limit.
func seedOf(used int64, share float64) int64 {
	return int64(math.Ceil(float64(used) * share))
}

// Decide decides reqs (already scaled to the share, and changed in place)
// on the local store, all or nothing, into out, starting each key from
// what the backend last said of it (wait is scratch, one per request), and
// journals what it admits with its request as the backend sees it
// (globals[idx[j]]). A concurrency slot is not journaled: ceiling moves it
// to the backend by its lease on recovery.
func (lc *Local) Decide(ctx context.Context, now time.Time, reqs []backend.Request, wait []time.Duration, out []backend.Result, globals []backend.Request, idx []int) error {
	blocked := false
	for j := range reqs {
		q := &reqs[j]
		wait[j] = 0
		s, ok := lc.Seen.Lookup(q.Key, now.UnixNano())
		if !ok || q.Cost <= 0 {
			continue
		}
		capacity := Capacity(*q)
		room := capacity - min(seedOf(s.Used, lc.Share), capacity)
		if room < q.Cost {
			wait[j] = time.Duration(s.Until - now.UnixNano())
			blocked = blocked || !q.Shadow
			continue
		}
		if q.Algorithm == backend.GCRA {
			q.Burst = room
		} else {
			q.Limit = room
		}
	}
	for j := range reqs {
		if blocked || wait[j] > 0 {
			reqs[j].Cost = 0 // refused by a seed: consume nothing, report the state
		}
	}
	if err := lc.Get().Decide(ctx, reqs, out); err != nil {
		return err
	}
	for j := range reqs {
		if w := wait[j]; w > 0 {
			out[j].Allowed, out[j].Remaining = false, 0
			out[j].RetryAfter, out[j].ResetAfter = max(out[j].RetryAfter, w), max(out[j].ResetAfter, w)
		}
		if !blocked && out[j].Allowed && reqs[j].Cost > 0 && reqs[j].Algorithm != backend.Concurrency {
			g := globals[idx[j]]
			lc.Journal.Add(g, Scaled(g, lc.Share))
		}
	}
	return nil
}

// ChargeBatch is how many keys one recovery charge call carries.
const ChargeBatch = 256

// Charge charges the backend (send, a bounded call) with what the local
// store still counts for every key it admitted while degraded, forced, in
// batches of ChargeBatch, and reports how many keys and units it charged.
// A key is charged at most the units admitted on it since its last charge
// (JournalEntry.Units): the local store still counts those an earlier
// charge sent. On error the journal keeps what was not charged.
func (lc *Local) Charge(ctx context.Context, send func([]backend.Request) error) (int, int64, error) {
	entries := lc.Journal.Take()
	if len(entries) == 0 {
		return 0, 0, nil
	}
	ls := lc.Get()
	peeks := make([]backend.Request, len(entries))
	for i := range entries {
		peeks[i] = entries[i].Local
	}
	res := make([]backend.Result, len(peeks))
	if err := ls.Decide(ctx, peeks, res); err != nil {
		lc.Journal.Restore(entries)
		return 0, 0, fmt.Errorf("ceiling: recovery charge: reading the local store: %w", err)
	}
	var charges []backend.Request
	var from []int // entry of each charge
	var units int64
	for i, e := range entries {
		used := min(Capacity(e.Local)-res[i].Remaining, e.Units)
		if used <= 0 {
			continue
		}
		q := e.Global
		q.Cost, q.Force, q.Shadow = used, true, false
		charges = append(charges, q)
		from = append(from, i)
		units += used
	}
	for lo := 0; lo < len(charges); lo += ChargeBatch {
		hi := min(lo+ChargeBatch, len(charges))
		if err := send(charges[lo:hi]); err != nil {
			lc.Journal.Restore(entries[from[lo]:])
			return 0, 0, fmt.Errorf("ceiling: recovery charge of %d keys: %w", len(charges)-lo, err)
		}
	}
	return len(charges), units, nil
}

// StartHandOver starts the hand-over after a recovery at now.
func (lc *Local) StartHandOver(now time.Time) {
	lc.until.Store(now.Add(lc.HandOver).UnixNano())
}

// HandingOver reports whether the hand-over after a recovery lasts.
func (lc *Local) HandingOver(now time.Time) bool {
	until := lc.until.Load()
	return until != 0 && now.UnixNano() < until
}

// HandOverDecide decides reqs (FailLocal's rules of a request, scaled to
// the share) on the local store first, into lo, and then, unless the local
// store refused one that is not a shadow, the whole request by call. It
// reports whether the local store refused (the caller answers from lo
// then) and call's error. When the request is not admitted in the end, the
// local store gives back what it took. An error of the local store is
// reported as ok false: the backend alone decides then.
func (lc *Local) HandOverDecide(ctx context.Context, reqs []backend.Request, lo []backend.Result, call func() (admitted bool, err error)) (ok, refused bool, err error) {
	ls := lc.Get()
	if e := ls.Decide(ctx, reqs, lo); e != nil {
		return false, false, nil
	}
	for j := range lo {
		if !lo[j].Allowed && !reqs[j].Shadow {
			return true, true, nil
		}
	}
	admitted, err := call()
	if !admitted {
		// Give back what the local store took: the request was not admitted
		// (or the fail modes will decide it afresh).
		for j := range reqs {
			if !lo[j].Allowed {
				reqs[j].Cost = 0
			}
			reqs[j].Cost = -reqs[j].Cost
		}
		_ = ls.Decide(ctx, reqs, lo)
	}
	return true, false, err
}

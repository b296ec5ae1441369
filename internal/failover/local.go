package failover

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// FailLocal across the edges of an outage: what the backend last said of
// each key (Seen), for the start, and the keys the local store admitted
// while degraded (Journal), for the end (ceiling's local.go).

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
}

// Add records that the local store admitted on global's key.
func (j *Journal) Add(global, local backend.Request) {
	global.Cost, local.Cost = 0, 0
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.entries == nil {
		j.entries = make(map[string]JournalEntry)
	}
	if _, ok := j.entries[global.Key]; !ok && len(j.entries) >= MaxJournal {
		return // the local store cannot hold more keys either
	}
	j.entries[global.Key] = JournalEntry{Global: global, Local: local}
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
		j.Add(e.Global, e.Local)
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
